"""Insert hooks: every enqueue path passes them; they may change a job or refuse it cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.support import REPO_ROOT, jobs_by_id
from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    InvalidJobError,
    Job,
    NewJob,
    Registry,
    UnknownQueueError,
    enqueue,
    enqueue_many,
    enqueue_many_async,
    set_default_registry,
)
from sqla_queue.db.database import normalize_url
from sqla_queue.enqueue import COPY_MIN_ROWS


@pytest.fixture
def default_registry() -> Iterator[Registry]:
    """A registry set as the application's default for this test only."""
    registry = Registry()
    registry.task(name="report")(lambda **kwargs: None)
    registry.task(name="forbidden")(lambda **kwargs: None)
    set_default_registry(registry)
    yield registry
    set_default_registry(None)


def tag_for_tenant(job: NewJob) -> None:
    job.args = {**job.args, "tenant": "acme"}
    job.queue = "emails"
    job.priority = 7
    job.max_attempts = 2


def refuse_forbidden(job: NewJob) -> None:
    if job.task == "forbidden":
        raise ValueError("forbidden jobs are off today")


def write_one_job_per_path(engine: Engine, database_url: str, task: str) -> list[Callable[[], Any]]:
    """One callable per enqueue path, each writing one job of `task` in its own transaction."""

    def with_session(write: Callable[[Session], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with Session(engine) as session, session.begin():
                return write(session)

        return run

    def async_path() -> Any:
        async def scenario() -> None:
            async_engine = create_async_engine(normalize_url(database_url))
            try:
                async with async_sessionmaker(async_engine)() as session, session.begin():
                    await enqueue_many_async(session, [{"task": task, "args": {"path": "a"}}])
            finally:
                await async_engine.dispose()

        asyncio.run(scenario())

    return [
        with_session(lambda s: enqueue(s, task, {"path": "enqueue"})),
        with_session(lambda s: enqueue_many(s, [{"task": task, "args": {"path": "insert"}}])),
        with_session(
            lambda s: enqueue_many(s, [{"task": task, "args": {"path": "copy"}}] * COPY_MIN_ROWS)
        ),
        async_path,
        with_session(lambda s: s.add(Job(task=task, args={"path": "add"}))),
    ]


def test_insert_hook_changes_the_job_on_every_enqueue_path(
    engine: Engine, database_url: str, default_registry: Registry, emails_queue: str
) -> None:
    default_registry.on_insert(tag_for_tenant)
    for write in write_one_job_per_path(engine, database_url, "report"):
        write()

    jobs = list(jobs_by_id(engine).values())
    assert len(jobs) == 4 + COPY_MIN_ROWS
    assert {j.args["path"] for j in jobs} == {"enqueue", "insert", "copy", "a", "add"}
    assert {(j.args["tenant"], j.queue, j.priority, j.max_attempts) for j in jobs} == {
        ("acme", "emails", 7, 2)
    }


def test_insert_hook_refusal_names_the_hook_and_keeps_the_transaction(
    engine: Engine, database_url: str, default_registry: Registry
) -> None:
    default_registry.on_insert(refuse_forbidden)
    for write in write_one_job_per_path(engine, database_url, "forbidden"):
        with pytest.raises(InvalidJobError) as raised:
            write()
        message = str(raised.value)
        assert "'forbidden'" in message
        assert f"refused by insert hook {__name__}.refuse_forbidden" in message
        assert "forbidden jobs are off today" in message
    assert jobs_by_id(engine) == {}

    # The caller's transaction goes on: its other writes, and other jobs, commit.
    with Session(engine) as session:
        session.execute(text("CREATE TABLE public.note (body text)"))
        session.execute(text("INSERT INTO public.note VALUES ('kept')"))
        with pytest.raises(InvalidJobError, match="refused by insert hook"):
            enqueue(session, "forbidden")
        session.add(Job(task="forbidden"))
        with pytest.raises(InvalidJobError, match="refused by insert hook"):
            session.flush()
        enqueue(session, "report", {"n": 1})
        session.commit()
    assert [j.task for j in jobs_by_id(engine).values()] == ["report"]
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT body FROM public.note")) == "kept"


def test_insert_hooks_run_in_registration_order_and_see_earlier_changes(
    engine: Engine, emails_queue: str
) -> None:
    seen: list[tuple[str, str]] = []

    def first(job: NewJob) -> None:
        seen.append(("first", job.queue))
        job.queue = emails_queue

    def second(job: NewJob) -> None:
        seen.append(("second", job.queue))

    registry = Registry(insert_hooks=[first])
    registry.on_insert(second)
    set_default_registry(registry)
    try:
        registry.task(name="t")(lambda: None)
        with Session(engine) as session, session.begin():
            job = enqueue(session, "t", flush=True)
            queue = job.queue
    finally:
        set_default_registry(None)
    assert seen == [("first", "default"), ("second", "emails")]
    assert queue == "emails"


def test_task_enqueue_runs_its_own_registry_hooks_without_a_default(
    engine: Engine, emails_queue: str
) -> None:
    registry = Registry(insert_hooks=[tag_for_tenant])

    @registry.task
    def report(tenant: str) -> None: ...  # the hook adds it

    other = Registry()  # hooks of a registry that is not the default nor the task's: unused
    other.on_insert(refuse_forbidden)
    with Session(engine) as session, session.begin():
        job = report.enqueue(session, flush=True)
        plain = enqueue(session, "forbidden", flush=True)  # no default registry: no hooks
        ids = (job.id, plain.id)
    stored = jobs_by_id(engine, ids)
    assert (stored[ids[0]].args, stored[ids[0]].queue) == ({"tenant": "acme"}, "emails")
    assert (stored[ids[1]].args, stored[ids[1]].queue) == ({}, "default")


def test_a_hook_that_breaks_raises_its_own_error_untouched(
    engine: Engine, default_registry: Registry
) -> None:
    def broken(job: NewJob) -> None:
        raise KeyError("bug in the hook")

    default_registry.on_insert(broken)
    with Session(engine) as session:
        with pytest.raises(KeyError, match="bug in the hook"):
            enqueue(session, "report")
        session.add(Job(task="report"))
        with pytest.raises(KeyError, match="bug in the hook"):
            session.flush()
        session.commit()  # the job whose hook broke is not written later, hooks skipped
    assert jobs_by_id(engine) == {}


def test_hook_changes_are_validated_like_the_callers_fields(
    engine: Engine, default_registry: Registry
) -> None:
    def bad_priority(job: NewJob) -> None:
        job.priority = -3

    default_registry.on_insert(bad_priority)
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match="priority must be between 0"):
            enqueue(session, "report")
        with pytest.raises(InvalidJobError, match="priority must be between 0"):
            enqueue_many(session, [{"task": "report"}] * COPY_MIN_ROWS)
        session.add(Job(task="report"))
        with pytest.raises(InvalidJobError, match="priority must be between 0"):
            session.flush()
        assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_refusal_reads_as_the_docs_quote_it(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="shop.tasks.charge")(lambda order_id: None)

    @registry.on_insert
    def no_charges_in_maintenance(job: NewJob) -> None:
        if job.task == "shop.tasks.charge":
            raise ValueError("charges are paused for maintenance")

    charge = registry["shop.tasks.charge"]
    with Session(engine) as session, pytest.raises(InvalidJobError) as raised:
        charge.enqueue(session, {"order_id": 1})
    hook = f"{__name__}.test_refusal_reads_as_the_docs_quote_it.<locals>."
    quoted = str(raised.value).replace(hook, "shop.tasks.")
    guide = " ".join((REPO_ROOT / "docs" / "tasks.md").read_text().split())
    assert f"`InvalidJobError: {quoted}`" in guide


@pytest.fixture
def strict_default() -> Iterator[Registry]:
    registry = Registry()
    registry.task(name="known", queue="default")(lambda **kwargs: None)

    @registry.on_insert
    def stamp_or_refuse(job: NewJob) -> None:
        if job.args.get("refuse"):
            raise ValueError("refused by policy")
        job.args = {**job.args, "stamped": True}

    set_default_registry(registry)
    yield registry
    set_default_registry(None)


@pytest.mark.parametrize(
    "options",
    [{}, {"unique": True}, {"depends_on": [1]}],
    ids=["plain", "unique", "depends_on"],
)
def test_a_merged_new_job_is_refused_naming_session_add(
    engine: Engine, strict_default: Registry, options: dict[str, Any]
) -> None:
    """Issue 33, defect 7: merge's copy wrote the job without its key or its edge (it ran
    before its parent); `session.add` of the same Job is right."""
    with Session(engine) as session:
        session.merge(Job(task="known", args={"n": 1}, **options))
        with pytest.raises(
            InvalidJobError, match=r"session\.merge\(Job\(\.\.\.\)\) .*session\.add"
        ):
            session.flush()
        session.add(Job(task="known", args={"n": 2}))  # the session goes on without it
        session.commit()
    assert [job.args for job in jobs_by_id(engine).values()] == [{"n": 2, "stamped": True}]


def test_a_job_whose_flush_failed_is_not_hooked_twice(
    engine: Engine, strict_default: Registry
) -> None:
    with Session(engine) as session:
        job = Job(task="known", args={}, queue="missing")
        session.add(job)
        with pytest.raises(UnknownQueueError):
            session.flush()
        session.rollback()
        job.queue = "default"
        session.add(job)
        session.commit()
    assert [job.args for job in jobs_by_id(engine).values()] == [{"stamped": True}]
