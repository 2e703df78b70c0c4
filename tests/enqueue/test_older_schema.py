"""Head enqueues into a database an older release migrated (issue 35): every enqueue path
names only the columns its job uses, so a job without a start deadline is written into a
schema without `jobs.expires_at` (revision sqlaq_0020); a job with one is refused in one
line naming `sqla-queue migrate`."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
from helpers.support import count_where
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import Job, Registry, SchemaMissingError, Unique, enqueue, enqueue_many
from sqla_queue.db import migrate
from sqla_queue.db.database import normalize_url
from sqla_queue.enqueue import COPY_MIN_ROWS, enqueue_async

BEFORE_EXPIRES = "sqlaq_0019_signals"
"""The revision before `jobs.expires_at`; `signal_key` (0019) is there, expires_at is not."""
OLD_RELEASE = "sqlaq_0017"
"""What the old-code test's release migrated to: neither signal_key nor expires_at."""


@pytest.fixture(params=[OLD_RELEASE, BEFORE_EXPIRES])
def old_engine(request: pytest.FixtureRequest, empty_database_url: str) -> Iterator[Engine]:
    engine = create_engine(empty_database_url)
    migrate.upgrade(engine, request.param)
    yield engine
    engine.dispose()


def _inserts(engine: Engine) -> list[str]:
    """The INSERT statements sent on `engine` from now on (appended as they are sent)."""
    sent: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _record(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "INSERT INTO sqla_queue.jobs" in statement or "COPY sqla_queue.jobs" in statement:
            sent.append(statement)

    return sent


def test_every_enqueue_path_writes_into_a_schema_without_the_newer_columns(
    old_engine: Engine,
) -> None:
    registry = Registry()

    @registry.task(name="hello")
    def hello(who: str) -> str:
        return who

    sent = _inserts(old_engine)
    with Session(old_engine) as session, session.begin():
        enqueue(session, "hello", {"who": "enqueue"})
        session.add(Job(task="hello", args={"who": "orm"}, max_attempts=3))
        hello.defer(session, who="defer")
        hello.using(delay=60).defer(session, who="delayed")
        enqueue(session, "hello", {"who": "unique"}, unique=True)
        enqueue_many(session, [{"task": "hello", "args": {"who": f"few {i}"}} for i in range(3)])
        enqueue_many(
            session,
            [{"task": "hello", "args": {"who": f"copy {i}"}} for i in range(COPY_MIN_ROWS)],
        )
        enqueue_many(
            session,
            [
                {"task": "hello", "args": {"who": f"staged {i}"}, "unique": True}
                for i in range(COPY_MIN_ROWS)
            ],
        )
    with old_engine.begin() as connection:
        enqueue(connection, "hello", {"who": "core"}, sequence="s1")
    expected = 5 + 3 + 2 * COPY_MIN_ROWS + 1
    assert count_where(old_engine, "status = 'queued'") == expected
    assert count_where(old_engine, "args->>'who' = 'orm' AND max_attempts = 3") == 1
    assert count_where(old_engine, "args->>'who' = 'core' AND sequence = 's1'") == 1
    newer = re.compile(r"\b(expires_at|signal_key)\b")  # lease_expires_at is old
    assert sent
    assert not [s for s in sent if newer.search(s)]


def test_enqueue_async_writes_into_a_schema_without_the_newer_columns(
    old_engine: Engine,
) -> None:
    async def run() -> None:
        async_engine = create_async_engine(normalize_url(old_engine.url))
        try:
            async with async_sessionmaker(async_engine)() as session, session.begin():
                await enqueue_async(session, "hello", {"who": "async"})
        finally:
            await async_engine.dispose()

    asyncio.run(run())
    assert count_where(old_engine, "args->>'who' = 'async'") == 1


@pytest.mark.parametrize("path", ["session", "orm", "connection", "many", "copy"])
def test_a_job_with_a_start_deadline_is_refused_in_one_line_naming_migrate(
    old_engine: Engine, path: str
) -> None:
    def write(session: Session) -> None:
        if path == "session":
            enqueue(session, "hello", {}, expires_in=60, flush=True)
        elif path == "orm":
            session.add(Job(task="hello", expires_in=60))
            session.flush()
        elif path == "connection":
            enqueue(session.connection(), "hello", {}, expires_in=60)
        else:
            rows = COPY_MIN_ROWS if path == "copy" else 2
            enqueue_many(session, [{"task": "hello", "expires_in": 60}] * rows)

    with Session(old_engine) as session, pytest.raises(SchemaMissingError) as caught:
        write(session)
    message = str(caught.value)
    assert "\n" not in message
    assert "jobs table has no column expires_at, which this job uses" in message
    assert "`sqla-queue migrate`" in message
    assert count_where(old_engine, "true") == 0


def test_an_applications_own_missing_column_is_not_taken_for_an_old_schema(
    old_engine: Engine,
) -> None:
    with Session(old_engine) as session:
        session.execute(text("CREATE TABLE public.jobs (id int)"))
        enqueue(session, "hello", {})  # installs the error translation
        with pytest.raises(Exception) as caught:
            session.execute(text("INSERT INTO public.jobs (expires_at) VALUES (now())"))
    assert not isinstance(caught.value, SchemaMissingError)


def test_unique_on_a_newer_column_is_refused_but_plain_unique_is_written(
    old_engine: Engine,
) -> None:
    with Session(old_engine) as session, session.begin():
        job = enqueue(session, "hello", {"who": "u"}, unique=Unique(key="k"))
        assert job.id is not None
    with Session(old_engine) as session, pytest.raises(SchemaMissingError):
        enqueue(session, "hello", {"who": "v"}, unique=Unique(key="v"), expires_in=5)
    assert count_where(old_engine, "args->>'who' = 'u'") == 1
