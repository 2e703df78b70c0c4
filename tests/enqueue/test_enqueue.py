"""Writing jobs in the caller's transaction: Job rows, enqueue(), enqueue_many(), NOTIFY, async."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers.support import database_clock, delay_chosen, jobs_by_id, order_count, received
from sqlalchemy import Engine, event, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import (
    InvalidJobError,
    Job,
    Queue,
    Registry,
    UnknownQueueError,
    enqueue,
    enqueue_many,
    enqueue_many_async,
)
from sqla_queue.db.database import normalize_url
from sqla_queue.db.models import NOTIFY_CHANNEL


def job_count(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


@pytest.fixture
def listener(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection LISTENing on the queue's channel."""
    conn = psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True)
    conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
    yield conn
    conn.close()


# -- the two stable ways to write a job -------------------------------------------------------


class AppBase(DeclarativeBase):
    """The application's own models, in its own metadata (the default schema)."""


class Order(AppBase):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(unique=True)


@pytest.fixture
def orders(engine: Engine) -> type[Order]:
    AppBase.metadata.create_all(engine)
    return Order


def test_job_added_to_the_session_commits_with_the_domain_write(
    engine: Engine, orders: type[Order]
) -> None:
    with Session(engine) as session, session.begin():
        session.add(orders(id=1, email="a@b.c"))
        session.add(Job(task="emails.send", args={"to": "a@b.c"}))

    (job,) = jobs_by_id(engine).values()
    assert (job.task, job.args, job.queue, job.status) == (
        "emails.send",
        {"to": "a@b.c"},
        "default",
        "queued",
    )
    assert order_count(engine) == 1


def test_failed_domain_write_takes_its_job_with_it(engine: Engine, orders: type[Order]) -> None:
    with Session(engine) as session, session.begin():
        session.add(orders(id=1, email="a@b.c"))
    with Session(engine) as session:
        session.add(orders(id=2, email="a@b.c"))  # violates the unique email
        enqueue(session, "emails.send", {"order_id": 2})
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
    assert job_count(engine) == 0
    assert order_count(engine) == 1


def test_enqueue_returns_the_job_and_never_commits_by_itself(engine: Engine) -> None:
    with Session(engine) as session:
        job = enqueue(session, "emails.send", {"to": "a@b.c"})
        session.flush()
        assert isinstance(job, Job)
        assert job.id is not None
        assert job_count(engine) == 0  # flushed but not committed: invisible elsewhere
        session.commit()
    assert job_count(engine) == 1


def test_a_queue_added_in_the_same_transaction_as_its_jobs_is_written_first(
    engine: Engine,
) -> None:
    """session.add(Queue(...)) and jobs for it, by each way of enqueuing, in one flush:
    the queue row goes first (the unit of work alone would order them at random)."""
    with Session(engine) as session:
        session.add(Queue(name="reports", retention="keep"))
        session.add(Job(task="reports.build", queue="reports"))
        session.add(Queue(name="digests"))
        enqueue(session, "digests.send", queue="digests")
        session.commit()
        assert session.get(Queue, "reports") is not None
    with Session(engine) as session:
        reports = session.get(Queue, "reports")
        digests = session.get(Queue, "digests")
        assert reports is not None
        assert digests is not None
        assert (reports.retention, reports.paused) == ("keep", False)
        assert (digests.retention, digests.result_ttl) == ("delete", 86400)
        assert sorted(session.scalars(select(Job.queue))) == ["digests", "reports"]


def test_rolled_back_transaction_leaves_no_job(engine: Engine) -> None:
    with Session(engine) as session:
        enqueue(session, "emails.send", {"to": "a@b.c"})
        session.add(Job(task="emails.send"))
        enqueue_many(session, [{"task": "emails.send"}] * 3)
        session.rollback()
    assert job_count(engine) == 0


def test_enqueue_stores_every_option(engine: Engine, emails_queue: str) -> None:
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    before = database_clock(engine)
    with Session(engine) as session, session.begin():
        # The task's own arguments may be called queue/delay: they live in one dict.
        scheduled = enqueue(
            session,
            "emails.send",
            {"queue": "x", "delay": 5},
            queue=emails_queue,
            priority=7,
            run_at=later,
            max_attempts=3,
        )
        delayed = enqueue(session, "emails.send", delay=600)
        session.flush()
        ids = (scheduled.id, delayed.id)
    after = database_clock(engine)
    rows = jobs_by_id(engine, ids)
    job = rows[ids[0]]
    assert (job.args, job.queue, job.priority, job.max_attempts) == (
        {"queue": "x", "delay": 5},
        "emails",
        7,
        3,
    )
    assert job.run_at == later
    assert 600 in delay_chosen(engine, ids[1], before, after)


def test_task_enqueue_uses_the_task_defaults(engine: Engine, emails_queue: str) -> None:
    registry = Registry()

    @registry.task(queue=emails_queue, max_attempts=9)
    def send(to: str) -> None: ...

    with Session(engine) as session, session.begin():
        job = send.enqueue(session, {"to": "a@b.c"})
        session.flush()
        job_id = job.id
    stored = jobs_by_id(engine)[job_id]
    assert (stored.task, stored.queue, stored.max_attempts) == (
        f"{__name__}.test_task_enqueue_uses_the_task_defaults.<locals>.send",
        "emails",
        9,
    )


def test_enqueue_many_returns_ids_in_input_order(engine: Engine, emails_queue: str) -> None:
    rows = [{"task": f"t{i}", "args": {"i": i}, "queue": emails_queue} for i in range(20)]
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, rows)
    stored = jobs_by_id(engine, ids)
    assert [stored[i].args["i"] for i in ids] == list(range(20))
    assert {j.queue for j in stored.values()} == {"emails"}


def test_enqueue_many_sends_one_insert_per_batch_not_per_job(engine: Engine) -> None:
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, [{"task": "t", "args": {"i": i}} for i in range(2500)])
    event.remove(engine, "before_cursor_execute", count)

    notifies = [s for s in statements if "pg_notify" in s]
    assert len(ids) == len(set(ids)) == 2500
    # One COPY (on the driver connection, so not seen here) after one id reservation.
    assert len(statements) <= 3
    assert len(notifies) == 1
    assert job_count(engine) == 2500


def test_enqueue_many_with_no_rows_sends_nothing(engine: Engine) -> None:
    with Session(engine) as session:
        assert enqueue_many(session, []) == []
        assert not session.in_transaction()


# -- NOTIFY -------------------------------------------------------------------------------------


def test_notify_is_delivered_on_commit_once_per_queue(
    engine: Engine, emails_queue: str, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        for i in range(3):
            enqueue(session, "t", {"i": i})
            session.flush()  # several flushes in one transaction still notify once
        session.add(Job(task="t", queue=emails_queue))
        enqueue_many(session, [{"task": "t", "queue": emails_queue}] * 5)
        enqueue_many(session, [{"task": "t"}] * 5)
        session.flush()
        assert received(listener) == []  # nothing before commit
        session.commit()
    assert sorted(received(listener, expect=2)) == ["default", "emails"]


def test_notify_is_sent_again_in_the_next_transaction(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        enqueue(session, "t")
        session.commit()
        enqueue(session, "t")
        session.commit()
    assert received(listener, expect=2) == ["default", "default"]


def test_rolled_back_transaction_notifies_nobody(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        enqueue(session, "t")
        enqueue_many(session, [{"task": "t"}])
        session.flush()
        session.rollback()
        enqueue(session, "t")  # the next transaction notifies afresh
        session.commit()
    assert received(listener, expect=1) == ["default"]


def test_job_after_a_rolled_back_savepoint_still_notifies(
    engine: Engine, emails_queue: str, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session, session.begin():
        savepoint = session.begin_nested()
        enqueue(session, "t", queue=emails_queue)
        session.flush()  # notified inside the savepoint ...
        savepoint.rollback()  # ... and PostgreSQL drops that notification with it
        enqueue(session, "t", queue=emails_queue)
    assert received(listener, expect=1) == ["emails"]
    assert job_count(engine) == 1


# -- AsyncSession --------------------------------------------------------------------------------


def test_enqueue_and_enqueue_many_work_from_an_async_session(
    database_url: str, engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    async def scenario() -> list[int]:
        async_engine = create_async_engine(normalize_url(database_url))
        make_session = async_sessionmaker(async_engine)
        try:
            async with make_session() as session:
                enqueue(session, "t", {"one": 1})
                ids = await enqueue_many_async(
                    session, [{"task": "t", "args": {"i": i}} for i in range(3)]
                )
                await session.commit()
            async with make_session() as session:
                enqueue(session, "t", {"rolled": "back"})
                await enqueue_many_async(session, [{"task": "t"}])
                await session.rollback()
            async with make_session() as session:
                assert isinstance(session, AsyncSession)
                count = await session.scalar(select(func.count()).select_from(Job))
                assert count == 4
            return ids
        finally:
            await async_engine.dispose()

    ids = asyncio.run(scenario())
    stored = jobs_by_id(engine)
    assert len(stored) == 4
    assert [stored[i].args for i in ids] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert received(listener, expect=1) == ["default"]


# -- bad input ------------------------------------------------------------------------------------


class Customer:
    pass


def test_non_json_args_raise_type_error_naming_task_and_type(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(TypeError, match=r"'emails\.send'.*Customer"):
            enqueue(session, "emails.send", {"customer": Customer()})
        with pytest.raises(TypeError, match=r"'emails\.send'.*datetime"):
            session.add(Job(task="emails.send", args={"at": dt.datetime.now()}))
        with pytest.raises(TypeError, match=r"'bulk\.task'.*set"):
            enqueue_many(session, [{"task": "ok"}, {"task": "bulk.task", "args": {"s": {1}}}])
        session.commit()
    assert job_count(engine) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": -1}, "priority must be between 0"),
        ({"max_attempts": 0}, "max_attempts must be a whole number from 1 to 1000000"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at has no time zone"),
        ({"delay": -5}, "delay must be a number of seconds from 0 to"),
        ({"delay": 5, "run_at": dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)}, "not both"),
    ],
)
def test_invalid_job_fields_are_refused_before_the_database(
    engine: Engine, options: dict[str, Any], message: str
) -> None:
    with Session(engine) as session, pytest.raises(InvalidJobError, match=message):
        enqueue(session, "t", {}, **options)


def test_unknown_queue_names_the_queue_and_the_command_that_creates_it(engine: Engine) -> None:
    with Session(engine) as session:
        enqueue(session, "t", queue="nope")
        with pytest.raises(UnknownQueueError) as raised:
            session.commit()
    assert "'nope'" in str(raised.value)
    assert "sqla-queue queues create nope" in str(raised.value)

    with Session(engine) as session:
        with pytest.raises(UnknownQueueError, match="sqla-queue queues create missing"):
            enqueue_many(session, [{"task": "t", "queue": "missing"}])
        session.rollback()
    assert job_count(engine) == 0
