"""A server whose default_transaction_isolation is REPEATABLE READ or SERIALIZABLE (set on the
test's own database, which every new session then starts with): the queue works as under READ
COMMITTED, the default. Two workers claim side by side with fast heartbeats (their finishing
statements meet the keeper's updates of the same rows): a serialization failure would show
as a worker's warning, and a lost or repeated job in the counts."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from helpers.fault_kit import wait_until
from helpers.support import WorkerThread
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_queue import Dependency, Registry, RetryPolicy, admin, enqueue, enqueue_many, wait_for
from sqla_queue.admin.filters import JobFilter, bulk_cancel, bulk_delete, bulk_retry

LEVELS = ["repeatable read", "serializable"]


@pytest.fixture(params=LEVELS)
def strict_engine(request: pytest.FixtureRequest, database_url: str) -> Iterator[Engine]:
    """An engine on the test's database whose sessions all start at `request.param`."""
    level: str = request.param
    url = make_url(database_url)
    owner = create_engine(
        url.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=pool.NullPool
    )
    with owner.connect() as conn:
        conn.exec_driver_sql(
            f"ALTER DATABASE \"{url.database}\" SET default_transaction_isolation = '{level}'"
        )
    owner.dispose()
    engine = create_engine(database_url)
    with engine.connect() as conn:
        assert conn.execute(text("SHOW transaction_isolation")).scalar_one() == level
    yield engine
    engine.dispose()


def _isolation_registry(runs: Counter[str], lock: threading.Lock) -> Registry:
    registry = Registry()

    def note(name: str) -> None:
        with lock:
            runs[name] += 1

    @registry.task(name="iso.plain")
    def plain(n: int) -> None:
        note(f"plain-{n}")

    @registry.task(name="iso.flaky", retry=RetryPolicy(base=0.0, jitter=0.0))
    def flaky(n: int) -> None:
        note(f"flaky-{n}")
        if runs[f"flaky-{n}"] < 2:
            raise RuntimeError("first attempt fails")

    @registry.task(name="iso.step", keep_result=True)
    def step(name: str) -> str:
        note(name)
        return name

    @registry.task(name="iso.doomed", max_attempts=1)
    def doomed(n: int) -> None:
        note(f"doomed-{n}")
        raise RuntimeError("always fails")

    return registry


def test_every_path_works_when_the_server_default_is_stricter_than_read_committed(
    strict_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    runs: Counter[str] = Counter()
    registry = _isolation_registry(runs, threading.Lock())
    with strict_engine.begin() as conn:
        admin.create_queue(conn, "kept", "keep")
    with Session(strict_engine) as session, session.begin():
        enqueue_many(session, [{"task": "iso.plain", "args": {"n": n}} for n in range(300)])
        enqueue_many(
            session, [{"task": "iso.flaky", "args": {"n": n}, "queue": "kept"} for n in range(20)]
        )
        enqueue_many(
            session, [{"task": "iso.doomed", "args": {"n": n}, "queue": "kept"} for n in range(10)]
        )
        root = enqueue(session, "iso.step", {"name": "root"}, queue="kept", workflow_id="wf")
        left = enqueue(session, "iso.step", {"name": "left"}, queue="kept", depends_on=[root])
        right = enqueue(
            session,
            "iso.step",
            {"name": "right"},
            queue="kept",
            depends_on=[Dependency(root, on_failure="run")],
        )
        last = enqueue(
            session, "iso.step", {"name": "last"}, queue="kept", depends_on=[left, right]
        )
        session.flush()
        last_id = last.id
    for _ in range(3):  # one row for the key, however often it is enqueued
        with Session(strict_engine) as session, session.begin():
            enqueue(session, "iso.plain", {"n": 1000}, unique=True)
    caplog.set_level(logging.WARNING, logger="sqla_queue")
    fast = {"heartbeat": 0.1, "dead_after": 5.0, "concurrency": 4, "batch": 5}
    with (
        WorkerThread(strict_engine, registry, **fast),
        WorkerThread(strict_engine, registry, **fast),
    ):
        assert wait_for(strict_engine, last_id, timeout=60) == "last"
        # the failed ones retried by filter while the workers run
        wait_until(
            lambda: _count(strict_engine, "status = 'failed'") == 10, 60, what="the failures"
        )
        assert bulk_retry(strict_engine, JobFilter(task="iso.doomed"), batch=3).acted == 10
        wait_until(
            lambda: _count(strict_engine, "status IN ('queued', 'running')") == 0,
            60,
            what="every job to end",
        )
    assert bulk_cancel(strict_engine, JobFilter(queue="kept")).acted == 0  # nothing unfinished
    deleted = bulk_delete(strict_engine, JobFilter(task="iso.doomed", status="failed"), batch=4)
    assert deleted.acted == 10
    expected = Counter({f"plain-{n}": 1 for n in range(300)} | {"plain-1000": 1})
    expected.update({f"flaky-{n}": 2 for n in range(20)})
    expected.update({f"doomed-{n}": 2 for n in range(10)})  # once, then once more when retried
    expected.update(dict.fromkeys(("root", "left", "right", "last"), 1))
    assert runs == expected
    assert _count(strict_engine, "status = 'done' AND queue = 'kept'") == 24
    serialization = [r.getMessage() for r in caplog.records if "serializ" in r.getMessage()]
    assert serialization == []


def _count(engine: Engine, where: str) -> int:
    with engine.connect() as conn:
        query = f"SELECT count(*) FROM sqla_queue.all_jobs WHERE {where}"  # kept jobs too
        return int(conn.scalar(text(query)) or 0)


def test_a_repeatable_read_session_that_meets_a_newer_unique_holder_retries_and_writes_none(
    strict_engine: Engine,
) -> None:
    """What the application's own session needs at a stricter level: a unique enqueue whose key
    was taken by a transaction committed after its snapshot fails to serialize (SQLSTATE
    40001), as any write of it to a row changed since would; the transaction run again
    finds the holder and writes nothing."""
    from sqlalchemy.exc import OperationalError

    late = Session(strict_engine)
    late.begin()
    late.execute(text("SELECT count(*) FROM sqla_queue.jobs"))  # its snapshot: taken here
    with Session(strict_engine) as first, first.begin():
        holder = enqueue(first, "iso.plain", {"n": 7}, unique=True, flush=True).id
    with pytest.raises(OperationalError) as failed:
        enqueue(late, "iso.plain", {"n": 7}, unique=True, flush=True)
    late.rollback()
    late.close()
    assert failed.value.orig is not None
    assert failed.value.orig.sqlstate == "40001"
    with Session(strict_engine) as again, again.begin():
        assert enqueue(again, "iso.plain", {"n": 7}, unique=True, flush=True).id == holder
    assert _count(strict_engine, "true") == 1
