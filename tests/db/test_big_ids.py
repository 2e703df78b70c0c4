"""Ids past 2^31 (graphile-worker#611/#617/#618: an `int[]` cast that fails once ids pass it):
every sequence of the schema is set past 2^31, the jobs' past 2^40, on the test's own
database; then every path runs: the enqueue paths (COPY among them), unique conflicts,
workflows, retries, bulk actions by filter, a worker's release at shutdown, the dashboard's
pages and the metrics. And the package's SQL casts no id to int4."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.enqueue_paths import EVERY_PATH
from helpers.fault_kit import wait_until
from helpers.support import WorkerThread
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Dependency, Registry, RetryPolicy, enqueue, enqueue_many, wait_for
from sqla_queue.admin.filters import JobFilter, bulk_cancel, bulk_delete, bulk_retry

INT4_MAX = 2**31 - 1
JOB_IDS_FROM = 2**40 + 7
SEQUENCES_FROM = 2**31 + 7
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def big_engine(engine: Engine) -> Engine:
    """The test's database with every sequence of the schema past 2^31, the jobs' past 2^40."""
    with engine.begin() as conn:
        sequences = conn.execute(
            text(
                "SELECT format('%I.%I', schemaname, sequencename), sequencename "
                "FROM pg_sequences WHERE schemaname = 'sqla_queue'"
            )
        ).all()
        assert sequences, "no sequence found: the schema's name or layout changed"
        for qualified, name in sequences:
            start = JOB_IDS_FROM if name == "jobs_id_seq" else SEQUENCES_FROM
            conn.execute(
                text("SELECT setval(:seq, :start, false)"), {"seq": qualified, "start": start}
            )
        # every column that holds a job's id is a bigint (an int4 column would overflow here)
        narrow = (
            conn.execute(
                text(
                    "SELECT table_name || '.' || column_name FROM information_schema.columns "
                    "WHERE table_schema = 'sqla_queue' AND data_type IN ('integer', 'smallint') "
                    "AND (column_name = 'id' OR column_name LIKE '%job_id%' "
                    "OR column_name LIKE '%parent%' OR column_name LIKE '%child%')"
                )
            )
            .scalars()
            .all()
        )
        assert narrow == []
    return engine


def _ids(engine: Engine, where: str = "true") -> list[int]:
    with engine.connect() as conn:
        return list(conn.scalars(text(f"SELECT id FROM sqla_queue.jobs WHERE {where} ORDER BY id")))


def test_every_enqueue_path_and_a_unique_conflict_write_ids_past_2_40(big_engine: Engine) -> None:
    for name, path in EVERY_PATH.items():
        path(big_engine, {"task": "big.plain", "args": {"path": name}, "queue": "default"})
    ids = _ids(big_engine)
    assert len(ids) >= len(EVERY_PATH)  # the COPY path writes several
    assert min(ids) >= JOB_IDS_FROM
    with Session(big_engine) as session, session.begin():
        first = enqueue(session, "big.plain", {"key": 1}, unique=True, flush=True).id
    with Session(big_engine) as session, session.begin():
        again = enqueue(session, "big.plain", {"key": 1}, unique=True, flush=True).id
        many = enqueue_many(session, [{"task": "big.plain", "args": {"key": 1}, "unique": True}])
    assert again == first == many[0]
    assert first > JOB_IDS_FROM


def _big_id_registry(ran: list[str], release: threading.Event) -> Registry:
    registry = Registry()

    @registry.task(name="big.plain")
    def plain(**_: Any) -> None:
        ran.append("plain")

    @registry.task(name="big.flaky", retry=RetryPolicy(base=0.0, jitter=0.0))
    def flaky(n: int) -> None:
        ran.append(f"flaky-{n}")
        if ran.count(f"flaky-{n}") < 2:
            raise RuntimeError("fails once")

    @registry.task(name="big.step", keep_result=True, pass_context=True)
    def step(ctx: Any, name: str) -> list[Any]:
        ran.append(name)
        return [name, ctx.job_id, ctx.parent_results()]

    @registry.task(name="big.doomed", max_attempts=1)
    def doomed() -> None:
        raise RuntimeError("always fails")

    @registry.task(name="big.held")
    def held() -> None:
        release.wait(30)

    return registry


def test_worker_workflows_retries_bulk_actions_and_release_past_2_40(big_engine: Engine) -> None:
    ran: list[str] = []
    release = threading.Event()
    registry = _big_id_registry(ran, release)
    with Session(big_engine) as session, session.begin():
        enqueue_many(session, [{"task": "big.plain", "args": {"n": n}} for n in range(200)])
        enqueue_many(session, [{"task": "big.flaky", "args": {"n": n}} for n in range(5)])
        enqueue_many(session, [{"task": "big.doomed"} for _ in range(5)])
        root = enqueue(session, "big.step", {"name": "root"}, workflow_id="big-wf")
        left = enqueue(session, "big.step", {"name": "left"}, depends_on=[root])
        right = enqueue(
            session, "big.step", {"name": "right"}, depends_on=[Dependency(root, on_failure="run")]
        )
        last = enqueue(session, "big.step", {"name": "last"}, depends_on=[left, right])
        session.flush()
        root_id, last_id = root.id, last.id
    with WorkerThread(big_engine, registry, concurrency=4, batch=10) as worker:
        name, own_id, parents = wait_for(big_engine, last_id, timeout=60)
        assert (name, own_id) == ("last", last_id)
        assert [p[0] for p in parents] == ["left", "right"]
        assert all(p[2][0][1] == root_id for p in parents)  # each saw the root's result
        wait_until(lambda: len(_ids(big_engine, "status = 'failed'")) == 5, 60, what="failures")
        assert bulk_retry(big_engine, JobFilter(task="big.doomed"), batch=2).acted == 5
        wait_until(
            lambda: not _ids(big_engine, "status IN ('queued', 'running')"), 60, what="the rest"
        )
        stats = worker.worker.stats
    assert stats.retried >= 5
    assert sorted(x for x in ran if x.startswith("flaky")) == sorted(
        [f"flaky-{n}" for n in range(5)] * 2
    )
    assert bulk_delete(big_engine, JobFilter(task="big.doomed", status="failed")).acted == 5
    # held jobs at a stop: the one started and the ones waiting behind it go back to queued
    with Session(big_engine) as session, session.begin():
        held = enqueue_many(session, [{"task": "big.held"} for _ in range(4)])
    assert min(held) > JOB_IDS_FROM
    thread = WorkerThread(big_engine, registry, concurrency=1, batch=4, shutdown_timeout=0.5)
    with thread:
        wait_until(lambda: len(_ids(big_engine, "status = 'running'")) == 4, 60, what="a claim")
    release.set()
    assert thread.worker.stats.released == 4
    assert _ids(big_engine, "status = 'queued'") == held
    assert bulk_cancel(big_engine, JobFilter(task="big.held")).acted == 4


def test_dashboard_pages_and_metrics_show_jobs_past_2_40(big_engine: Engine) -> None:
    from helpers.dashboard_kit import client
    from prometheus_client import CollectorRegistry

    from sqla_queue.contrib.metrics import QueueMetrics

    with Session(big_engine) as session, session.begin():
        root = enqueue(session, "big.plain", {}, workflow_id="big-wf", flush=True)
        child = enqueue(session, "big.plain", {}, depends_on=[root], flush=True)
        root_id, child_id = root.id, child.id
    web = client(big_engine)
    for page in ("/", "/jobs", f"/jobs/{root_id}", f"/jobs/{child_id}", "/workflows/big-wf",
                 "/queues/default", "/workers", "/jobs?workflow_id=big-wf"):  # fmt: skip
        answer = web.get(page)
        assert answer.status_code == 200, (page, answer.text[:500])
    assert str(child_id) in web.get("/workflows/big-wf").text
    assert str(root_id) in web.get(f"/jobs/{child_id}").text
    metrics = QueueMetrics(CollectorRegistry())
    metrics.refresh(big_engine)
    assert metrics.refresh_errors._value.get() == 0
    # the root is queued; its child waits for it
    assert metrics.queue_jobs.labels("default", "queued")._value.get() == 1


INT4_CAST = re.compile(
    r"::\s*(?:int4|int|integer)\b(?!\s*\[)|::\s*(?:int4|int|integer)\s*\[\]"
    r"|\bCAST\s*\([^)]*\bAS\s+(?:INT4|INT|INTEGER)\b|\.cast\(\s*Integer\b|cast\([^)]*,\s*Integer\)"
    r"|ARRAY\(\s*Integer\s*\)",
    re.IGNORECASE,
)
ID_WORDS = re.compile(r"\b(?:id|ids|job_ids|locked|chosen)\b|_id\b|\.id\b")
ALLOWED = ("c.n::integer",)
"""Casts beside an id that narrow no id: the claim function's turn number (c.n)."""


def narrows_an_id(line: str) -> bool:
    """Whether `line` casts something named like an id to int4 (the cast and the 30
    characters before it name it: `job_id::integer`, `CAST(parent_id AS INTEGER)`,
    `bindparam("job_ids", type_=ARRAY(Integer))`)."""
    return any(
        ID_WORDS.search(line[max(0, cast.start() - 30) : cast.end()])
        and not any(allowed in line for allowed in ALLOWED)
        for cast in INT4_CAST.finditer(line)
    )


def test_the_package_sql_casts_no_id_to_int4() -> None:
    """The package and its migrations (sqla_queue/**/*.py): no `::int`, `::integer`,
    `CAST(... AS INTEGER)` or `ARRAY(Integer)` of an id."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "sqla_queue").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if narrows_an_id(line)
    ]
    assert found == []


@pytest.mark.parametrize(
    "line",
    [
        "WHERE j.id = ANY(:ids::int[])",
        "SELECT job_id::integer FROM x",
        "CAST(parent_id AS INTEGER)",
        'bindparam("job_ids", type_=ARRAY(Integer))',
        "jobs.c.id.cast(Integer)",
    ],
)
def test_the_cast_finder_catches_each_shape_of_a_narrowed_id(line: str) -> None:
    assert narrows_an_id(line)


@pytest.mark.parametrize(
    "line",
    ["p.running::integer", 'bindparam("job_attempts", type_=ARRAY(Integer))', "j.id::bigint"],
)
def test_the_cast_finder_passes_casts_of_counts_and_widenings(line: str) -> None:
    assert not narrows_an_id(line)
