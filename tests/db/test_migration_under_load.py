"""`sqla-queue migrate` from earlier revisions to head while four processes enqueue and
a worker claims and finishes: no enqueue fails, and every one is in the table after.

The latencies of the enqueues made while the migration ran are printed (p50, p99, max);
the 1,000,000-job figures are in BENCHMARKS.md ("Migrating under load"), from the slow
test on a private cluster. No duration is asserted here.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from helpers.support import REPO_ROOT, SQLA_QUEUE_BIN, count_where, subprocess_env, wait_for
from sqlalchemy import Engine, create_engine, text

from sqla_queue.db import migrate

EARLIER = [
    rev.revision
    for rev in reversed(
        list(
            ScriptDirectory.from_config(migrate.alembic_config()).iterate_revisions(
                migrate.SCHEMA_REVISION, "base"
            )
        )
    )
    if rev is not None and rev.revision != migrate.SCHEMA_REVISION
]
UNDER_LOAD = sorted({*EARLIER[::5], EARLIER[-1]}, key=EARLIER.index)
"""The start revisions run under load: every fifth and the one before head (each case costs
20 s or more; every start revision's upgrade is compared with a fresh install, without the
load, in test_online_migrations.py)."""
LOAD = REPO_ROOT / "tests" / "helpers" / "migration_load.py"
ENQUEUERS = 4


@pytest.fixture
def empty_engine(empty_database_url: str) -> Iterator[Engine]:
    eng = create_engine(empty_database_url)
    yield eng
    eng.dispose()


def fill(engine: Engine, jobs: int) -> None:
    """`jobs` finished jobs and a few queued ones: the history a long-lived queue keeps."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs (task, queue, args, status, finished_at) "
                "SELECT 'old', 'default', '{}', 'done', now() FROM generate_series(1, :n)"
            ),
            {"n": jobs},
        )
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs (task, queue, args) "
                "SELECT 'old', 'default', '{}' FROM generate_series(1, :n)"
            ),
            {"n": max(jobs // 100, 1)},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE sqla_queue.jobs"))


def migrate_under_load(url: str, engine: Engine, tmp_path: Path) -> dict[str, Any]:
    """Start the load, run `sqla-queue migrate`, stop the load; what each side saw."""
    stop = tmp_path / "stop"
    outs = [tmp_path / f"load-{i}.json" for i in range(ENQUEUERS + 1)]
    kinds = ["enqueue"] * ENQUEUERS + ["work"]
    procs = [
        subprocess.Popen([sys.executable, str(LOAD), kind, url, str(stop), str(out)])
        for kind, out in zip(kinds, outs, strict=True)
    ]
    try:
        wait_for(lambda: count_where(engine, "task = 'load' AND status = 'done'") > 0, timeout=60)
        began = time.time()
        done = subprocess.run(
            [SQLA_QUEUE_BIN, "migrate"],
            env=subprocess_env(url),
            capture_output=True,
            text=True,
            timeout=3600,
        )
        ended = time.time()
        time.sleep(0.5)  # the load goes on against the new schema for a moment
    finally:
        stop.touch()
        for proc in procs:
            proc.wait(60)
    loads = [json.loads(out.read_text()) for out in outs]
    during = [
        seconds
        for load in loads[:ENQUEUERS]
        for start, seconds in load["timings"]
        if began <= start <= ended
    ]
    return {"migrate": done, "loads": loads, "during": during, "window": ended - began}


def latency_line(during: list[float]) -> str:
    ordered = sorted(during)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"{len(ordered)} enqueues during the migration: p50 "
        f"{statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {ordered[-1] * 1000:.1f} ms"
    )


def check_migrated_under_load(result: dict[str, Any], engine: Engine) -> None:
    done = result["migrate"]
    assert done.returncode == 0, done.stderr
    with engine.connect() as conn:
        assert migrate.check_schema(conn) == migrate.SCHEMA_REVISION
    loads = result["loads"]
    failures = [f for load in loads for f in load["failures"]]
    assert not failures, failures[:5]
    enqueued = sum(len(load["timings"]) for load in loads[:ENQUEUERS])
    assert count_where(engine, "task = 'load'") == enqueued  # every enqueue is there
    assert all(load["timings"] for load in loads[:ENQUEUERS])
    assert result["during"], "no enqueue ran while the migration did"
    assert loads[ENQUEUERS]["finished"] > 0
    print(latency_line(result["during"]), f"(migration {result['window']:.1f} s)")


@pytest.mark.parametrize("start", UNDER_LOAD)
def test_migrating_from_an_earlier_revision_under_load_fails_no_enqueue(
    empty_database_url: str, empty_engine: Engine, tmp_path: Path, start: str
) -> None:
    migrate.upgrade(empty_engine, start)
    fill(empty_engine, 2_000)
    check_migrated_under_load(
        migrate_under_load(empty_database_url, empty_engine, tmp_path), empty_engine
    )


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_migrating_a_million_jobs_from_the_first_revision_under_load(
    cluster: Any, tmp_path: Path
) -> None:
    cluster.start()
    cluster.create_database()
    engine = create_engine(cluster.url)
    try:
        migrate.upgrade(engine, EARLIER[0])
        fill(engine, 1_000_000)
        result = migrate_under_load(cluster.url, engine, tmp_path)
        check_migrated_under_load(result, engine)
        (tmp_path.parent / "migration-under-load.txt").write_text(
            latency_line(result["during"]) + f" (migration {result['window']:.1f} s)\n"
        )
    finally:
        engine.dispose()
        cluster.stop()
