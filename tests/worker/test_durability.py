"""The worker's own commits without waiting for the disk (`synchronous_commit = off`):
a server crash runs the last of its jobs again and loses none (docs/durability.md).

The crash test runs a cluster of its own (initdb into a temporary folder, its own port) and
stops it with `pg_ctl -m immediate`, as a power cut looks to PostgreSQL: no checkpoint, and
the WAL of commits not yet written by the WAL writer is gone.
"""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fault_kit import (
    PG_BIN,
    FaultDatabase,
    PrivateCluster,
    WorkerProcess,
    fill_kept_queue,
    wait_until,
)
from sqlalchemy import Engine, create_engine, text

from sqla_queue import JobContext, Registry, enqueue
from sqla_queue.worker import Worker, WorkerConfig
from sqla_queue.worker.connection import DatabaseLink, FailureLog

CRASH_JOBS = 3000


def show_synchronous_commit(conn: object) -> str:
    return str(conn.exec_driver_sql("SHOW synchronous_commit").scalar())  # type: ignore[attr-defined]


def test_only_the_links_connection_commits_asynchronously(engine: Engine) -> None:
    link = DatabaseLink(engine, threading.Event(), None, FailureLog(), synchronous_commit=False)
    conn = link.connect()
    assert conn is not None
    assert show_synchronous_commit(conn) == "off"
    link.close()
    # Every connection the pool hands out afterwards commits as the server is configured.
    held = [engine.connect() for _ in range(3)]
    try:
        assert [show_synchronous_commit(c) for c in held] == ["on", "on", "on"]
    finally:
        for c in held:
            c.close()


def test_synchronous_link_keeps_the_servers_setting(engine: Engine) -> None:
    link = DatabaseLink(engine, threading.Event(), None, FailureLog(), synchronous_commit=True)
    conn = link.connect()
    assert conn is not None
    assert show_synchronous_commit(conn) == "on"
    link.close()


def test_handler_sessions_commit_synchronously_under_an_asynchronous_worker(
    engine: Engine,
) -> None:
    registry = Registry()
    seen: list[str] = []

    @registry.task(name="show", pass_context=True)
    def show(ctx: JobContext) -> None:
        with ctx.session() as session:
            seen.append(str(session.execute(text("SHOW synchronous_commit")).scalar()))
            session.commit()

    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        for _ in range(3):
            enqueue(session, "show", {})
    config = WorkerConfig(burst=True, concurrency=2, synchronous_commit=False)
    stats = Worker(engine, registry, config).run(install_signal_handlers=False)
    assert stats.succeeded == 3
    assert seen == ["on", "on", "on"]


def test_synchronous_commit_must_be_a_bool() -> None:
    from sqla_queue.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="synchronous_commit must be True or False"):
        WorkerConfig(synchronous_commit="off")  # type: ignore[arg-type]


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    server = PrivateCluster()
    yield server
    server.remove()


def crash(cluster: PrivateCluster) -> None:
    """Stop the server as a crash would: every backend killed, no shutdown checkpoint."""
    subprocess.run(
        ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(cluster.data),
         "-m", "immediate", "-w", "stop"],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip


def runs_of(path: Path) -> collections.Counter[int]:
    if not path.exists():
        return collections.Counter()
    return collections.Counter(int(line.split()[0]) for line in path.read_text().splitlines())


def test_server_crash_under_asynchronous_commits_loses_no_job(
    cluster: PrivateCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqla_queue.db.migrate import upgrade

    cluster.start()
    cluster.create_database()
    upgrade(create_engine(cluster.url))
    ids = fill_kept_queue(
        cluster.url, "durable", "record_run", [{"n": n} for n in range(CRASH_JOBS)]
    )
    runs_path = tmp_path / "runs"
    monkeypatch.setenv("DURABILITY_RUNS", str(runs_path))
    gate = tmp_path / "gate"  # the second half waits for it: the crash comes mid-drain
    monkeypatch.setenv("DURABILITY_GATE", str(gate))
    monkeypatch.setenv("DURABILITY_GATE_FROM", str(CRASH_JOBS // 2))
    worker = WorkerProcess(
        cluster.url,
        tmp_path / "worker.log",
        *("-q", "durable", "-c", "4", "--batch", "20", "--lease", "2"),
        *("--poll-interval", "0.5", "--no-synchronous-commit"),
        app="helpers.apps.durability_app:registry",
    ).start()
    try:
        wait_until(
            lambda: sum(runs_of(runs_path).values()) >= CRASH_JOBS // 3,
            120,
            what="a third of the jobs to run",
        )
        crash(cluster)  # mid-drain: claims and finishes of the last moments are in flight
        ran_before = sum(runs_of(runs_path).values())
        time.sleep(1)
        cluster.start()
        gate.touch()
        db = FaultDatabase(cluster.url)
        try:
            wait_until(lambda: not db.unfinished(), 180, what="the queue to drain again")
            counts = db.status_counts()
        finally:
            db.close()
        runs = runs_of(runs_path)
        assert ran_before < CRASH_JOBS, "the crash came after the drain: nothing was tested"
        assert counts == {"done": CRASH_JOBS}  # none lost, none stuck queued or running
        never_ran = set(ids) - set(runs)
        assert not never_ran, f"{len(never_ran)} jobs done but never ran"
        assert set(runs) == set(ids)
        assert "database connection lost" in worker.log() or "unavailable" in worker.log()
        again = sum(count - 1 for count in runs.values())
        print(f"ran before the crash: {ran_before}; ran twice or more: {again}")
        assert worker.alive()
    finally:
        worker.stop()
