"""A refused job never costs the caller's business write silently (review of issues 8 and 15).

A refusal in Python leaves the transaction usable; a refusal by the database aborts it, and
then the error says so. The queue's error translation never claims another table's errors.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.enqueue_paths import PATHS
from helpers.support import jobs_by_id, order_count
from sqlalchemy import Engine, create_engine, insert, text
from sqlalchemy.exc import IntegrityError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    InvalidJobError,
    Job,
    Registry,
    SchemaMissingError,
    SqlaQueueError,
    UnknownQueueError,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    limits,
)
from sqla_queue.db.database import normalize_url
from sqla_queue.enqueue import COPY_MIN_ROWS


@pytest.fixture
def orders(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.orders (id serial PRIMARY KEY)"))
    return engine


@pytest.mark.parametrize("path", sorted(PATHS))
def test_args_that_grow_past_the_limit_as_jsonb_are_refused_before_the_transaction_is_harmed(
    orders: Engine, path: str
) -> None:
    # 1e300 is 6 characters of JSON but 301 digits as jsonb numeric: the CHECK would refuse it.
    args = {"v": [1e300] * 3400}
    assert len(json.dumps(args)) < limits.max_args_bytes
    with Session(orders) as session:
        session.execute(text("INSERT INTO public.orders DEFAULT VALUES"))
        with pytest.raises(InvalidJobError, match="as jsonb") as raised:
            PATHS[path](session, {"task": "t", "args": args})
        assert "CHECK constraint" not in str(raised.value)  # refused before anything was sent
        session.commit()  # the caller caught the refusal and goes on: the order must commit
    assert order_count(orders) == 1
    assert jobs_by_id(orders) == {}


def test_floats_in_exponent_form_within_the_limit_are_accepted(engine: Engine) -> None:
    args = {"small": [1.5e-07] * 10, "big": [-1e300] * 10, "text": "e+1 e-5"}
    with Session(engine) as session, session.begin():
        (job_id,) = enqueue_many(session, [{"task": "t", "args": args}])
    stored = jobs_by_id(engine)[job_id].args
    assert stored["small"] == args["small"]
    assert stored["text"] == args["text"]
    assert [float(v) for v in stored["big"]] == args["big"]  # jsonb writes 1e300 out in full


@pytest.mark.parametrize("path", ["insert", "copy"])
def test_a_job_the_database_refuses_says_the_transaction_is_aborted(
    orders: Engine, path: str
) -> None:
    with Session(orders) as session:
        session.execute(text("INSERT INTO public.orders DEFAULT VALUES"))
        with pytest.raises(UnknownQueueError) as raised:
            PATHS[path](session, {"task": "t", "queue": "missing"})
        session.rollback()
    message = str(raised.value)
    assert "sqla-queue queues create missing" in message
    assert "aborted" in message
    assert "roll it back" in message
    assert "\n" not in message


def test_a_check_violation_says_the_transaction_is_aborted(engine: Engine) -> None:
    with engine.connect() as conn, pytest.raises(InvalidJobError) as raised:
        conn.execute(insert(Job).values(task="t", priority=-1))
    assert "CHECK constraint ck_jobs_priority" in str(raised.value)
    assert "aborted" in str(raised.value)


def test_an_applications_own_jobs_table_keeps_its_own_errors(engine: Engine) -> None:
    # Same table and constraint names as the queue's (a common naming convention), other schema.
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.queues (name text PRIMARY KEY)"))
        conn.execute(
            text(
                "CREATE TABLE public.jobs (id serial PRIMARY KEY,"
                " queue text CONSTRAINT fk_jobs_queue_queues REFERENCES public.queues (name),"
                " priority int CONSTRAINT ck_jobs_priority CHECK (priority < 10))"
            )
        )
    for statement in (
        "INSERT INTO public.jobs (priority) VALUES (50)",
        "INSERT INTO public.jobs (queue) VALUES ('nope')",
    ):
        with engine.connect() as conn, pytest.raises(IntegrityError) as raised:
            conn.execute(text(statement))
        assert not isinstance(raised.value, InvalidJobError | UnknownQueueError)


# -- session.merge -------------------------------------------------------------------------------


# -- an unmigrated database ----------------------------------------------------------------------


def task_enqueue(session: Session) -> Job:
    registry = Registry()
    send_receipt = registry.task(name="send_receipt")(lambda order_id: None)
    return send_receipt.enqueue(session, {"order_id": 1}, flush=True)


Enqueue = Callable[[Session], Any]
UNMIGRATED_PATHS: dict[str, Enqueue] = {
    "enqueue": lambda s: enqueue(s, "t", {"n": 1}, flush=True),
    "enqueue at commit": lambda s: (enqueue(s, "t", {"n": 1}), s.commit()),
    "enqueue unique": lambda s: enqueue(s, "t", {"n": 1}, unique=True),
    "enqueue connection": lambda s: enqueue(s.connection(), "t", {"n": 1}),
    "Task.enqueue": task_enqueue,
    "session.add": lambda s: (s.add(Job(task="t")), s.flush()),
    "session.add unique": lambda s: (s.add(Job(task="t", unique=True)), s.flush()),
    "enqueue_many": lambda s: enqueue_many(s, [{"task": "t"}]),
    "enqueue_many copy": lambda s: enqueue_many(s, [{"task": "t"}] * COPY_MIN_ROWS),
    "enqueue_many unique": lambda s: enqueue_many(
        s, [{"task": "t", "args": {"i": i}, "unique": True} for i in range(COPY_MIN_ROWS)]
    ),
}


def assert_names_the_migration(error: BaseException) -> None:
    message = str(error)
    assert isinstance(error, SchemaMissingError)
    assert "sqla-queue migrate" in message
    assert "alembic upgrade" in message
    assert "aborted this transaction" in message
    assert "roll it back" in message
    assert "\n" not in message
    assert "INSERT" not in message  # not the raw statement
    assert isinstance(error.__cause__, psycopg.Error)  # the database's own, kept


@pytest.fixture
def unmigrated(empty_database_url: str) -> Iterator[Engine]:
    engine = create_engine(normalize_url(empty_database_url))
    yield engine
    engine.dispose()


@pytest.mark.parametrize("path", sorted(UNMIGRATED_PATHS))
def test_enqueue_into_an_unmigrated_database_names_the_migration(
    unmigrated: Engine, path: str
) -> None:
    with Session(unmigrated) as session:
        with pytest.raises(SqlaQueueError) as raised:
            UNMIGRATED_PATHS[path](session)
        session.rollback()
    assert_names_the_migration(raised.value)


def test_async_enqueue_into_an_unmigrated_database_names_the_migration(
    empty_database_url: str,
) -> None:
    async def attempt(write: Callable[[AsyncSession], Awaitable[Any]]) -> BaseException:
        engine = create_async_engine(normalize_url(empty_database_url))
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(SqlaQueueError) as raised:
                    await write(session)
                await session.rollback()
            return raised.value
        finally:
            await engine.dispose()

    async def add_and_flush(session: AsyncSession) -> None:
        enqueue(session, "t", {"n": 1})
        await session.flush()

    for write in (
        add_and_flush,
        lambda s: enqueue_async(s, "t", {"n": 1}, unique=True),
        lambda s: enqueue_many_async(s, [{"task": "t"}] * 3),
    ):
        assert_names_the_migration(asyncio.run(attempt(write)))


def test_an_applications_own_missing_table_keeps_its_own_error(unmigrated: Engine) -> None:
    with unmigrated.connect() as conn, pytest.raises(ProgrammingError) as raised:
        conn.execute(text("SELECT * FROM public.jobs"))
    assert not isinstance(raised.value, SqlaQueueError)
