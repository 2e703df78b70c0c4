"""enqueue(connection, ...) and enqueue_many(connection, ...): the Core path, no Session."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from helpers.support import jobs_by_id, received
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from enqueue import test_enqueue
from sqla_queue import (
    InvalidJobError,
    Job,
    Registry,
    UnknownQueueError,
    UnknownTaskError,
    admin,
    enqueue,
    enqueue_many,
)
from sqla_queue.enqueue import COPY_MIN_ROWS
from sqla_queue.testing import run_until_empty

listener = test_enqueue.listener  # the fixture, shared


def test_core_enqueue_writes_in_the_callers_transaction_and_returns_the_id(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "emails")
    with engine.connect() as conn:
        job_id = enqueue(
            conn, "send", {"to": "a@b.c"}, queue="emails", priority=3, tags=["x"], meta={"m": 1}
        )
        assert isinstance(job_id, int)
        assert jobs_by_id(engine) == {}  # not committed: another session sees nothing yet
        conn.commit()
    job = jobs_by_id(engine)[job_id]
    assert (job.task, job.args, job.queue, job.priority, job.tags, job.meta) == (
        "send", {"to": "a@b.c"}, "emails", 3, ["x"], {"m": 1},
    )  # fmt: skip
    assert job.status == "queued"


def test_core_enqueue_rolled_back_leaves_nothing_and_notifies_nobody(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    with engine.connect() as conn:
        enqueue(conn, "send")
        conn.rollback()
    assert jobs_by_id(engine) == {}
    assert received(listener) == []


def test_core_enqueue_sends_the_notify_in_the_insert_statement(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with engine.begin() as conn:
        for n in range(3):
            enqueue(conn, "send", {"n": n})
    assert len(statements) == 3  # one round trip per job: no separate NOTIFY statement
    assert all("INSERT" in s and "pg_notify" in s for s in statements)
    assert received(listener, expect=1) == ["default"]  # folded by PostgreSQL: once per transaction


def test_core_enqueue_refuses_bad_input_before_sending_anything(engine: Engine) -> None:
    with engine.connect() as conn:
        with pytest.raises(InvalidJobError, match="priority"):
            enqueue(conn, "send", priority=-1)
        with pytest.raises(TypeError, match="not JSON-serialisable"):
            enqueue(conn, "send", {"when": object()})
        job_id = enqueue(conn, "send")  # the transaction goes on
        conn.commit()
    assert list(jobs_by_id(engine)) == [job_id]


def test_core_enqueue_of_an_unknown_queue_says_so(engine: Engine) -> None:
    with engine.connect() as conn, pytest.raises(UnknownQueueError, match="nowhere"):
        enqueue(conn, "send", queue="nowhere")


def test_core_enqueue_runs_registry_defaults_and_hooks(engine: Engine) -> None:
    registry = Registry()
    seen: list[str] = []

    @registry.task(name="report", priority=7)
    def report() -> None:
        seen.append("ran")

    registry.on_insert(lambda job: job.meta.update(hooked=True))
    with engine.begin() as conn:
        job_id = enqueue(conn, "report", registry=registry)
        with pytest.raises(UnknownTaskError):
            enqueue(conn, "reprot", registry=registry)
    job = jobs_by_id(engine)[job_id]
    assert (job.priority, job.meta) == (7, {"hooked": True})
    run_until_empty(engine, registry)
    assert seen == ["ran"]


def test_core_enqueue_unique_returns_the_blocking_jobs_id(engine: Engine) -> None:
    with engine.begin() as conn:
        first = enqueue(conn, "send", {"k": 1}, unique=True)
        again = enqueue(conn, "send", {"k": 1}, unique=True)
        other = enqueue(conn, "send", {"k": 2}, unique=True)
    assert first == again != other
    assert sorted(jobs_by_id(engine)) == sorted([first, other])


@pytest.mark.parametrize("count", [3, COPY_MIN_ROWS + 5], ids=["insert", "copy"])
def test_core_enqueue_many_writes_in_order_and_notifies_on_commit(
    engine: Engine, listener: psycopg.Connection[Any], count: int
) -> None:
    rows = [
        {"task": "send", "args": {"n": n}, "tags": ["t"] if n % 2 else None} for n in range(count)
    ]
    with engine.connect() as conn:
        ids = enqueue_many(conn, rows)
        assert received(listener, 0.1) == []
        conn.commit()
    jobs = jobs_by_id(engine)
    assert [jobs[i].args["n"] for i in ids] == list(range(count))
    assert [jobs[i].tags for i in ids] == [["t"] if n % 2 else [] for n in range(count)]
    assert received(listener, expect=1) == ["default"]


def test_core_enqueue_many_refuses_a_bad_row_and_writes_none(engine: Engine) -> None:
    rows = [{"task": "send"}] * COPY_MIN_ROWS + [{"task": ""}]
    with engine.connect() as conn:
        with pytest.raises(InvalidJobError, match="task"):
            enqueue_many(conn, rows)
        conn.commit()
    assert jobs_by_id(engine) == {}


# -- enqueue(session, ...) at flush: the same one-statement INSERT + NOTIFY ----------------------


def test_session_enqueue_sends_the_insert_and_notify_as_one_statement(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with Session(engine) as session, session.begin():
        job = enqueue(session, "send", {"n": 1}, delay=600)
        assert job.id is None  # still written at flush, not before
        session.flush()
        job_id = job.id
        assert isinstance(job_id, int)
        session.add(Job(task="added", args={"n": 2}))  # the unit of work's own path
    jobs_seen = [s for s in statements if "INSERT INTO sqla_queue.jobs" in s]
    assert len(jobs_seen) == 2
    assert "pg_notify" in jobs_seen[0]
    assert sum("pg_notify" in s for s in statements) == 1  # the added Job: already notified
    assert received(listener, expect=1) == ["default"]
    with Session(engine) as session:
        stored_job = session.get(Job, job_id)
        assert stored_job is not None
        waited = (stored_job.run_at - stored_job.created_at).total_seconds()
        assert 599 <= waited <= 601
        assert stored_job.status == "queued"


def test_session_enqueue_writes_fields_changed_before_the_flush_and_checks_them(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        job = enqueue(session, "send", {"n": 1})
        job.priority = 5
        job.args["extra"] = True  # changed in place: still written as it is now
        session.flush()
        job_id = job.id
    with Session(engine) as session:
        stored_job = session.get(Job, job_id)
        assert stored_job is not None
        assert (stored_job.priority, stored_job.args) == (5, {"n": 1, "extra": True})
    with Session(engine) as session:
        job = enqueue(session, "send")
        job.priority = -1
        with pytest.raises(InvalidJobError, match="priority"):
            session.flush()
