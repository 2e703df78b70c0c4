"""enqueue_many from COPY_MIN_ROWS rows on: COPY on the session's own connection, same results."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sqla_queue import Job, Registry, UnknownQueueError, admin, enqueue_many
from sqla_queue.enqueue import COPY_MIN_ROWS
from sqla_queue.testing import run_until_empty

N = COPY_MIN_ROWS + 20


def stored_jobs(engine: Engine) -> list[Job]:
    with Session(engine) as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def test_bulk_copy_stores_every_field_and_returns_ids_in_input_order(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "emails")
    rows = [
        {
            "task": f"t{i % 3}",
            "args": {"i": i, "nested": {"s": 'é\\t"x"', "l": [1, None, True]}},
            "queue": "emails" if i % 2 else "default",
            "priority": i % 7,
            "max_attempts": None if i % 5 else 3,
        }
        for i in range(N)
    ]
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, rows)

    by_id = {job.id: job for job in stored_jobs(engine)}
    assert len(ids) == len(set(ids)) == N
    for job_id, row in zip(ids, rows, strict=True):
        job = by_id[job_id]
        assert (job.task, job.args, job.queue, job.priority, job.max_attempts) == (
            row["task"], row["args"], row["queue"], row["priority"], row["max_attempts"],
        )  # fmt: skip
        assert (job.status, job.attempts) == ("queued", 0)


def test_bulk_copy_schedules_by_the_database_clock_like_the_insert(engine: Engine) -> None:
    at = dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)
    rows = [{"task": "now"}, {"task": "later", "delay": 90}, {"task": "at", "run_at": at}] * (
        N // 3
    )
    with Session(engine) as session, session.begin():
        enqueue_many(session, rows)

    jobs = stored_jobs(engine)
    assert len(jobs) == len(rows)
    for job in jobs:
        expected = {
            "now": job.created_at,
            "later": job.created_at + dt.timedelta(seconds=90),
            "at": at,
        }[job.task]
        assert job.run_at == expected


def test_bulk_copy_into_an_unknown_queue_names_it_and_stores_nothing(engine: Engine) -> None:
    rows = [{"task": "t"}] * (N - 1) + [{"task": "t", "queue": "missing"}]
    with Session(engine) as session:
        with pytest.raises(UnknownQueueError, match="sqla-queue queues create missing") as raised:
            enqueue_many(session, rows)
        session.rollback()
    assert isinstance(raised.value.__cause__, IntegrityError)
    assert stored_jobs(engine) == []


def test_rolled_back_bulk_copy_leaves_no_job(engine: Engine) -> None:
    with Session(engine) as session:
        enqueue_many(session, [{"task": "t"}] * N)
        session.rollback()
    assert stored_jobs(engine) == []


def test_jobs_written_by_copy_are_claimed_and_run_once(engine: Engine) -> None:
    registry = Registry()
    seen: list[int] = []

    @registry.task(name="record")
    def record(i: int) -> None:
        seen.append(i)

    with Session(engine) as session, session.begin():
        enqueue_many(session, [{"task": "record", "args": {"i": i}} for i in range(N)])
    stats = run_until_empty(engine, registry)

    assert sorted(seen) == list(range(N))
    assert stats.succeeded == N
    assert stored_jobs(engine) == []


def test_plain_rows_sent_as_copy_lines_store_what_was_given(engine: Engine) -> None:
    # Only task, args, queue and priority: the lines are written without a parameters dict.
    with engine.begin() as conn:
        admin.create_queue(conn, "back\\slash")
    args = [
        {"i": 0, "s": "tab\there, new\nline, cr\r, back\\slash", "u": "é ✓ 😀"},
        {"i": 1, "email": "e-mail e+1", "f": 1.5e-7},
        {"i": 2, "l": [[1, [2, [3]]], {"a": None, "b": True}]},
        None,
    ]
    rows = [
        {
            "task": f"t\\{i % 3}",
            "args": args[i % 4],
            "queue": "back\\slash" if i % 2 else None,
            "priority": i % 5 or None,
        }
        for i in range(N)
    ]
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, rows)

    by_id = {job.id: job for job in stored_jobs(engine)}
    assert len(ids) == len(set(ids)) == N
    for job_id, row in zip(ids, rows, strict=True):
        job = by_id[job_id]
        assert (job.task, job.args, job.queue, job.priority) == (
            row["task"], row["args"] or {}, row["queue"] or "default", row["priority"] or 0,
        )  # fmt: skip
        assert (job.status, job.tags, job.meta, job.max_attempts) == ("queued", [], {}, None)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"priority": -1}, "priority must be between 0"),
        ({"args": {1: "x"}}, "args must be a dict of keyword arguments with str keys"),
        ({"args": {"x": float("nan")}}, "not JSON-serialisable"),
        ({"task": "a\tb"}, "task name must be printable"),
    ],
)
def test_a_bad_row_among_plain_rows_is_refused_as_alone_and_nothing_is_written(
    engine: Engine, bad: dict[str, object], message: str
) -> None:
    rows: list[dict[str, object]] = [{"task": "t", "args": {"n": n}} for n in range(N)]
    rows[N // 2] = {**rows[N // 2], **bad}
    with Session(engine) as session:
        with pytest.raises((ValueError, TypeError), match=message):
            enqueue_many(session, rows)
        session.rollback()
    assert stored_jobs(engine) == []
