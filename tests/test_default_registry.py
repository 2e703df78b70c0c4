"""A default registry: unknown task names refused at enqueue, and each task's own defaults."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from apps.support import jobs_by_id
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    Job,
    NewJob,
    Registry,
    Task,
    UnknownTaskError,
    admin,
    default_registry,
    enqueue,
    enqueue_many,
    set_default_registry,
)
from sqla_queue.database import normalize_url
from sqla_queue.enqueue import COPY_MIN_ROWS


@pytest.fixture
def shop(engine: Engine) -> Iterator[Registry]:
    """The README's shop registry, set as the application's default for this test only."""
    with engine.begin() as conn:
        admin.create_queue(conn, "emails")
    registry = Registry()
    registry.task(name="shop.tasks.send_receipt", queue="emails", max_attempts=10, priority=3)(
        lambda order_id: None
    )
    registry.task(name="shop.tasks.charge")(lambda order_id: None)
    set_default_registry(registry)
    assert default_registry() is registry
    yield registry
    set_default_registry(None)


def test_unknown_task_is_refused_at_enqueue_naming_close_matches(
    engine: Engine, shop: Registry
) -> None:
    with Session(engine) as session:
        session.execute(text("CREATE TABLE public.note (body text)"))
        with pytest.raises(UnknownTaskError) as raised:
            enqueue(session, "shop.send_receipt", {"order_id": 1})
        assert "'shop.send_receipt'" in str(raised.value)
        assert "did you mean 'shop.tasks.send_receipt'?" in str(raised.value)
        with pytest.raises(UnknownTaskError, match=r"did you mean 'shop\.tasks\.charge'"):
            enqueue_many(session, [{"task": "shop.tasks.charg"}] * COPY_MIN_ROWS)
        with pytest.raises(UnknownTaskError, match=r"register this one with @registry\.task"):
            enqueue_many(session, [{"task": "zzz"}])
        session.add(Job(task="shop.tasks.send_reciept"))
        with pytest.raises(UnknownTaskError, match=r"did you mean 'shop\.tasks\.send_receipt'"):
            session.flush()
        # Refused before anything was sent: the transaction is intact and commits.
        session.execute(text("INSERT INTO public.note VALUES ('kept')"))
        enqueue(session, "shop.tasks.charge", {"order_id": 1})
        session.commit()
    assert [j.task for j in jobs_by_id(engine).values()] == ["shop.tasks.charge"]


def test_name_based_enqueue_takes_the_task_defaults_unless_overridden(
    engine: Engine, shop: Registry
) -> None:
    with Session(engine) as session, session.begin():
        by_name = enqueue(session, "shop.tasks.send_receipt", {"order_id": 1}, flush=True)
        overridden = enqueue(
            session,
            "shop.tasks.send_receipt",
            {"order_id": 2},
            queue="default",
            priority=0,
            max_attempts=1,
            flush=True,
        )
        added = Job(task="shop.tasks.send_receipt", args={"order_id": 3})
        session.add(added)
        (bulk,) = enqueue_many(session, [{"task": "shop.tasks.send_receipt"}])
        session.flush()
        ids = [by_name.id, overridden.id, added.id, bulk]
    stored = jobs_by_id(engine, ids)
    fields = [(stored[i].queue, stored[i].priority, stored[i].max_attempts) for i in ids]
    assert fields == [("emails", 3, 10), ("default", 0, 1), ("emails", 3, 10), ("emails", 3, 10)]


def test_task_bound_enqueue_is_the_same_as_by_name(engine: Engine, shop: Registry) -> None:
    send_receipt: Task = shop["shop.tasks.send_receipt"]
    set_default_registry(None)  # the task knows its registry without a default
    with Session(engine) as session, session.begin():
        job = send_receipt.enqueue(session, {"order_id": 1}, flush=True)
        job_id = job.id
    stored = jobs_by_id(engine)[job_id]
    assert (stored.task, stored.queue, stored.priority, stored.max_attempts) == (
        "shop.tasks.send_receipt",
        "emails",
        3,
        10,
    )


def test_without_a_default_registry_any_name_is_written_as_given(engine: Engine) -> None:
    assert default_registry() is None
    with Session(engine) as session, session.begin():
        job = enqueue(session, "shop.send_receipt", {"order_id": 1}, flush=True)
        job_id = job.id
    stored = jobs_by_id(engine)[job_id]
    assert (stored.task, stored.queue, stored.priority, stored.max_attempts) == (
        "shop.send_receipt",
        "default",
        0,
        None,
    )


def test_enqueue_flush_gives_the_id_at_once_and_commits_nothing(engine: Engine) -> None:
    with Session(engine) as session:
        pending = enqueue(session, "t")
        assert pending.id is None  # the documented default: the id comes with the flush
        job = enqueue(session, "t", flush=True)
        assert isinstance(job.id, int)
        assert isinstance(pending.id, int)  # a flush sends every pending change
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM sqla_queue.jobs")) == 0
        session.rollback()


def test_enqueue_flush_with_an_async_session_says_to_await_flush(database_url: str) -> None:
    async def scenario() -> None:
        async_engine = create_async_engine(normalize_url(database_url))
        try:
            async with async_sessionmaker(async_engine)() as session:
                with pytest.raises(TypeError, match=r"await session\.flush"):
                    enqueue(session, "t", flush=True)
                job = enqueue(session, "t")
                await session.flush()
                assert isinstance(job.id, int)
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())


def test_a_task_priority_out_of_range_is_refused_at_registration() -> None:
    with pytest.raises(ConfigurationError, match="priority must be between 0"):
        Registry().task(name="t", priority=-1)(lambda: None)


def test_hooks_see_only_known_tasks_and_a_renamed_task_is_checked_again(
    engine: Engine, shop: Registry
) -> None:
    seen: list[str] = []

    @shop.on_insert
    def rename_charges(job: NewJob) -> None:
        seen.append(job.task)
        if job.task == "shop.tasks.charge":
            job.task = "shop.tasks.charge_v2"

    with Session(engine) as session:
        with pytest.raises(UnknownTaskError, match=r"'shop\.tasks\.nope'"):
            enqueue(session, "shop.tasks.nope")
        with pytest.raises(UnknownTaskError, match=r"'shop\.tasks\.charge_v2'"):
            enqueue(session, "shop.tasks.charge")
    assert seen == ["shop.tasks.charge"]
