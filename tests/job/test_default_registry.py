"""A default registry: unknown task names refused at enqueue, and each task's own defaults."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Iterator

import pytest
from helpers.support import jobs_by_id
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    Job,
    JobContext,
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
from sqla_queue.db.database import normalize_url
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
        (bulk,) = enqueue_many(
            session, [{"task": "shop.tasks.send_receipt", "args": {"order_id": 4}}]
        )
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


# -- args that do not fit the handler's signature ------------------------------------------------


@pytest.fixture
def billing() -> Iterator[Registry]:
    registry = Registry()

    @registry.task(name="charge")
    def charge(order_id: int, note: str = "") -> None: ...

    @registry.task(name="audit", pass_context=True)
    def audit(ctx: JobContext, order_id: int) -> None: ...

    @registry.task(name="anything")
    def anything(**fields: object) -> None: ...

    @registry.task(name="keyword_only")
    def keyword_only(*, order_id: int) -> None: ...

    set_default_registry(registry)
    yield registry
    set_default_registry(None)


@pytest.mark.parametrize(
    ("task", "args"),
    [
        ("charge", {"order_id": 1}),
        ("charge", {"order_id": 1, "note": "rush"}),
        ("audit", {"order_id": 1}),
        ("anything", {}),
        ("anything", {"a": 1, "b": [2]}),
        ("keyword_only", {"order_id": 1}),
    ],
)
def test_args_that_fit_the_handlers_signature_are_enqueued(
    engine: Engine, billing: Registry, task: str, args: dict[str, object]
) -> None:
    with Session(engine) as session, session.begin():
        job_id = billing[task].enqueue(session, args, flush=True).id
    assert jobs_by_id(engine)[job_id].args == args


@pytest.mark.parametrize(
    ("task", "args", "why"),
    [
        ("charge", {}, "missing required argument order_id"),
        (
            "charge",
            {"oder_id": 1},
            "missing required argument order_id; unexpected argument oder_id "
            "(did you mean order_id?)",
        ),
        ("charge", {"order_id": 1, "extra": 2}, "unexpected argument extra"),
        ("audit", {}, "missing required argument order_id"),
        ("audit", {"ctx": 1, "order_id": 1}, "multiple values for argument 'ctx'"),
        ("keyword_only", {"id": 1}, "missing required argument order_id"),
    ],
)
def test_task_enqueue_refuses_args_that_do_not_fit_the_handler_naming_them(
    engine: Engine, billing: Registry, task: str, args: dict[str, object], why: str
) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidJobError) as raised:
            billing[task].enqueue(session, args, flush=True)
        session.execute(text("SELECT 1"))  # refused before anything was sent: still usable
        session.commit()
    message = str(raised.value)
    assert f"task {task!r}" in message
    assert why in message
    assert str(inspect.signature(billing[task].func)) in message
    assert ("pass_context=True" in message) == (task == "audit")
    assert jobs_by_id(engine) == {}


def test_enqueue_by_name_checks_the_args_on_every_path_of_the_registry_in_force(
    engine: Engine, billing: Registry
) -> None:
    writes = [
        lambda s: enqueue(s, "charge", {"oder_id": 1}),
        lambda s: enqueue(s, "charge", {"oder_id": 1}, unique=True),
        lambda s: enqueue(s.connection(), "charge", {"oder_id": 1}),
        lambda s: (s.add(Job(task="charge", args={"oder_id": 1})), s.flush()),
        lambda s: enqueue_many(
            s, [{"task": "charge", "args": {"order_id": 1}}, {"task": "charge"}]
        ),
        lambda s: enqueue_many(s, [{"task": "charge", "args": {"oder_id": 1}}] * COPY_MIN_ROWS),
    ]
    for write in writes:
        with Session(engine) as session:
            with pytest.raises(InvalidJobError, match="missing required argument order_id"):
                write(session)
            session.rollback()
    set_default_registry(None)  # no registry in force: nothing is known of the handler
    with Session(engine) as session, session.begin():
        enqueue(session, "charge", {"oder_id": 1})
    assert [job.args for job in jobs_by_id(engine).values()] == [{"oder_id": 1}]


def test_the_args_an_insert_hook_leaves_are_the_ones_checked(
    engine: Engine, billing: Registry
) -> None:
    @billing.on_insert
    def fill_order_id(job: NewJob) -> None:
        if job.task == "charge" and "ref" in job.args:
            job.args = {"order_id": job.args["ref"]}

    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "charge", {"ref": 5}, flush=True).id
    assert jobs_by_id(engine)[job_id].args == {"order_id": 5}


def test_a_handler_wrapped_by_a_decorator_is_checked_by_the_wrappers_signature(
    engine: Engine,
) -> None:
    # The worker calls the wrapper, which supplies `db` itself: the inner signature's
    # required `db` must not refuse the job.
    def with_db(func: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(func)
        def wrapper(*args: object, **kwargs: object) -> None:
            func(*args, db="the session", **kwargs)

        return wrapper

    registry = Registry()

    @registry.task(name="receipt")
    @with_db
    def receipt(order_id: int, db: str) -> None: ...

    with Session(engine) as session, session.begin():
        registry["receipt"].enqueue(session, {"order_id": 1})
    assert [job.task for job in jobs_by_id(engine).values()] == ["receipt"]
