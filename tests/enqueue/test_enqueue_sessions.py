"""Enqueue in the session an application has: per-mapper binds, a pending flush, a role
without the sequence privilege, an empty queue name, a delay that is not a duration."""

from __future__ import annotations

import uuid

import pytest
from helpers.support import count_jobs
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_queue import (
    InvalidJobError,
    Queue,
    QueueBase,
    enqueue,
    enqueue_many,
)
from sqla_queue.enqueue import COPY_MIN_ROWS


def test_enqueue_works_in_a_session_with_per_mapper_binds(engine: Engine) -> None:
    with Session(binds={QueueBase: engine}) as session, session.begin():
        enqueue(session, "t.one")
        enqueue_many(session, [{"task": "t.many"}] * (COPY_MIN_ROWS + 1))
    assert count_jobs(engine) == COPY_MIN_ROWS + 2


def test_bulk_enqueue_flushes_a_pending_queue_first(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        session.add(Queue(name="fresh"))
        ids = enqueue_many(session, [{"task": "t", "queue": "fresh"}] * (COPY_MIN_ROWS + 50))
    assert len(ids) == COPY_MIN_ROWS + 50


def test_bulk_enqueue_without_sequence_privilege_falls_back_to_insert(
    engine: Engine, database_url: str
) -> None:
    role = f"sqlaq_enq_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT USAGE ON SCHEMA sqla_queue TO {role}"))
        conn.execute(text(f"GRANT INSERT, SELECT ON sqla_queue.jobs TO {role}"))
    limited = create_engine(make_url(database_url).set(username=role))
    try:
        with Session(limited) as session, session.begin():
            ids = enqueue_many(session, [{"task": "t"}] * (COPY_MIN_ROWS + 10))
        assert len(ids) == COPY_MIN_ROWS + 10
    finally:
        limited.dispose()
        with engine.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
    assert count_jobs(engine) == COPY_MIN_ROWS + 10


def test_an_empty_queue_name_is_refused_not_sent_to_default(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match="queue name must be a non-empty string"):
            enqueue(session, "t", queue="")
        with pytest.raises(InvalidJobError, match="queue name must be a non-empty string"):
            enqueue_many(session, [{"task": "t", "queue": ""}])


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), 1e20])
def test_a_delay_that_is_not_a_finite_duration_is_refused(engine: Engine, delay: float) -> None:
    with Session(engine) as session, pytest.raises(InvalidJobError) as refused:
        enqueue(session, "t", delay=delay)
    assert "delay must be a number of seconds from 0 to 3155760000 s" in str(refused.value)


def test_an_enqueued_job_is_persistent_after_its_flush_and_transient_after_rollback(
    engine: Engine,
) -> None:
    # As a job the unit of work inserts: its pending_to_persistent event, its server-set
    # columns loaded on first use, and gone from the session with the rolled-back row.
    became: list[object] = []

    def note(session: Session, instance: object) -> None:
        became.append(instance)

    with Session(engine) as session:
        event.listen(session, "pending_to_persistent", note)
        job = enqueue(session, "t.persisted", {"n": 1}, flush=True)
        assert inspect(job).persistent
        assert became == [job]
        assert (job.status, job.attempts, job.tags, job.meta) == ("queued", 0, [], {})
        session.rollback()
        assert inspect(job).transient
        assert job not in session
    assert count_jobs(engine) == 0
