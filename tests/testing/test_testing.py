"""sqla_queue.testing: assertions on enqueued jobs, drain, inline mode, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import inspect
import time

import pytest
from helpers.support import task_statuses
from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    HistoryJob,
    Job,
    JobContext,
    Registry,
    RetryPolicy,
    enqueue,
    enqueue_many,
)
from sqla_queue.job.outcome import Outcome
from sqla_queue.testing import (
    DrainResult,
    QueueHelper,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued_jobs,
    inline,
)
from sqla_queue.testing.assertions import JobFilters

calls: list[tuple[str, dict[str, object]]] = []
registry = Registry()


@registry.task(name="t.ok")
def ok(**args: object) -> None:
    calls.append(("t.ok", args))


@registry.task(name="t.boom", max_attempts=3, retry=RetryPolicy(base=60, jitter=0))
def boom(**args: object) -> None:
    calls.append(("t.boom", args))
    raise ValueError("boom")


# 1 s: a 0.01 s sleep must not time out on a loaded machine, a 5 s one must
@registry.task(name="t.slow_async", timeout=1.0)
async def slow_async(seconds: float) -> None:
    await asyncio.sleep(seconds)
    calls.append(("t.slow_async", {"seconds": seconds}))


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


# -- assertions ----------------------------------------------------------------------------------


def test_assert_enqueued_sees_a_job_the_session_has_not_committed(
    sqla_queue_session: Session,
) -> None:
    enqueue(
        sqla_queue_session, "t.ok", {"order_id": 7, "email": "ada@example.com"}, queue="default"
    )
    [job] = assert_enqueued(sqla_queue_session, task="t.ok", args={"order_id": 7})
    assert job.args == {"order_id": 7, "email": "ada@example.com"}
    assert_enqueued(sqla_queue_session, task=ok, count=1)  # a registered Task works as the name


def test_assert_enqueued_failure_lists_the_jobs_that_are_there(
    sqla_queue_session: Session,
) -> None:
    enqueue(sqla_queue_session, "t.ok", {"order_id": 7})
    with pytest.raises(AssertionError) as failure:
        assert_enqueued(sqla_queue_session, task="t.ok", args={"order_id": 8})
    message = str(failure.value)
    assert "expected a job matching task='t.ok', args={'order_id': 8}" in message
    assert "found 0" in message
    assert "task='t.ok' args={'order_id': 7} queue='default'" in message
    with pytest.raises(AssertionError, match="expected 2 job"):
        assert_enqueued(sqla_queue_session, task="t.ok", count=2)


def test_assert_not_enqueued_fails_naming_the_matching_job(sqla_queue_session: Session) -> None:
    assert_not_enqueued(sqla_queue_session, task="t.ok")
    enqueue(sqla_queue_session, "t.ok", {"n": 1})
    with pytest.raises(AssertionError, match=r"expected no job matching task='t.ok'.*found 1"):
        assert_not_enqueued(sqla_queue_session, task="t.ok")
    assert_not_enqueued(sqla_queue_session, task="t.ok", queue="elsewhere")


def test_enqueued_jobs_reads_committed_jobs_through_an_engine(sqla_queue_engine: Engine) -> None:
    with Session(sqla_queue_engine) as session, session.begin():
        enqueue_many(session, [{"task": "t.ok", "args": {"n": n}} for n in range(3)])
    jobs = enqueued_jobs(sqla_queue_engine, task="t.ok")
    assert [job.args["n"] for job in jobs] == [0, 1, 2]
    assert enqueued_jobs(sqla_queue_engine, status="done") == []


# -- drain ---------------------------------------------------------------------------------------


def test_drain_runs_due_jobs_inside_the_test_transaction_and_counts_outcomes(
    sqla_queue_session: Session,
) -> None:
    enqueue(sqla_queue_session, "t.ok", {"n": 1})
    enqueue(sqla_queue_session, "t.boom", {"n": 2})
    enqueue(sqla_queue_session, "t.nobody_registered_this", {})
    later = enqueue(sqla_queue_session, "t.ok", {"n": 3}, delay=3600)

    result = drain(sqla_queue_session, registry)

    assert result == DrainResult(succeeded=1, retried=1, deferred=1)
    assert calls == [("t.ok", {"n": 1}), ("t.boom", {"n": 2})]
    assert any("unknown task 't.nobody_registered_this'" in e for _, e in result.errors)
    # the succeeded job was deleted (default retention); the retry waits out its backoff;
    # the unknown task's job is put back for a worker that knows it, as the worker does
    assert task_statuses(sqla_queue_session) == [
        ("t.boom", "queued", 1),
        ("t.nobody_registered_this", "queued", 0),
        ("t.ok", "queued", 0),
    ]
    assert later.status == "queued"  # the session's objects were refreshed


def test_drain_knows_the_tasks_of_the_registrys_included_modules(
    sqla_queue_session: Session,
) -> None:
    from helpers.apps.drain_included import registry as including

    enqueue(sqla_queue_session, "included.count", {"n": 7})

    result = drain(sqla_queue_session, including)

    assert result == DrainResult(succeeded=1)
    assert importlib.import_module("helpers.apps.drain_included_tasks").ran == [7]


def test_drain_with_include_scheduled_runs_retries_until_max_attempts(
    sqla_queue_session: Session,
) -> None:
    enqueue(sqla_queue_session, "t.boom", {})
    enqueue(
        sqla_queue_session,
        "t.ok",
        {},
        run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1),
    )
    result = drain(sqla_queue_session, registry, include_scheduled=True)
    assert result == DrainResult(succeeded=1, retried=2, failed=1)
    [failed] = enqueued_jobs(sqla_queue_session, status="failed")
    assert (failed.task, failed.attempts) == ("t.boom", 3)
    assert "ValueError: boom" in (failed.last_error or "")


def test_drain_keeps_to_its_queue_and_max_jobs(sqla_queue_session: Session) -> None:
    sqla_queue_session.execute(text("INSERT INTO sqla_queue.queues (name) VALUES ('other')"))
    for n in range(3):
        enqueue(sqla_queue_session, "t.ok", {"n": n})
    enqueue(sqla_queue_session, "t.ok", {"n": 99}, queue="other")
    assert drain(sqla_queue_session, registry, queue="default", max_jobs=2).succeeded == 2
    assert calls == [("t.ok", {"n": 0}), ("t.ok", {"n": 1})]
    assert drain(sqla_queue_session, registry, queue=["default"]).succeeded == 1
    assert_enqueued(sqla_queue_session, queue="other", count=1)


def test_drain_on_an_engine_commits_and_follows_the_queue_retention(
    sqla_queue_engine: Engine,
) -> None:
    with sqla_queue_engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.queues SET retention = 'keep' WHERE name = 'default'"))
    with Session(sqla_queue_engine) as session, session.begin():
        enqueue(session, "t.ok", {"n": 1})
    assert drain(sqla_queue_engine, registry) == DrainResult(succeeded=1)
    with sqla_queue_engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Job)) == 0  # none in jobs
        row = conn.execute(select(HistoryJob.status, HistoryJob.finished_at)).one()
    assert row.status == "done"  # moved to the history, as the worker does
    assert row.finished_at is not None
    [kept] = enqueued_jobs(sqla_queue_engine, task="t.ok", status="done")  # read there too
    assert isinstance(kept, HistoryJob)
    assert kept.args == {"n": 1}
    assert [job.id for job in enqueued_jobs(sqla_queue_engine, status=None)] == [kept.id]
    assert enqueued_jobs(sqla_queue_engine, status="failed") == []
    assert_enqueued(sqla_queue_engine, task=ok, args={"n": 1}, status="done", count=1)


def test_drain_on_a_connection_outside_a_transaction_commits_each_step(
    sqla_queue_engine: Engine,
) -> None:
    with Session(sqla_queue_engine) as session, session.begin():
        enqueue(session, "t.ok", {})
    with sqla_queue_engine.connect() as conn:
        assert drain(conn, registry).succeeded == 1
        assert not conn.in_transaction()
    assert enqueued_jobs(sqla_queue_engine, status=None) == []


def test_drain_reraise_raises_the_handler_error_after_writing_its_outcome(
    sqla_queue_session: Session,
) -> None:
    enqueue(sqla_queue_session, "t.boom", {})
    with pytest.raises(ValueError, match="boom"):
        drain(sqla_queue_session, registry, reraise=True)
    assert task_statuses(sqla_queue_session) == [("t.boom", "queued", 1)]


def test_drain_runs_async_handlers_and_enforces_their_timeout(
    sqla_queue_session: Session,
) -> None:
    enqueue(sqla_queue_session, "t.slow_async", {"seconds": 0.01})
    enqueue(sqla_queue_session, "t.slow_async", {"seconds": 5})
    result = drain(sqla_queue_session, registry)
    assert result == DrainResult(succeeded=1, retried=1)
    assert calls == [("t.slow_async", {"seconds": 0.01})]
    assert "ran longer than its timeout of 1.0 s" in result.errors[0][1]


def test_drain_times_out_a_sync_handler_that_returns_past_its_timeout(
    sqla_queue_session: Session,
) -> None:
    own = Registry()

    @own.task(name="t.slow_sync", timeout=0.05, retry=RetryPolicy(base=60, jitter=0))
    def slow_sync() -> None:
        time.sleep(0.2)  # a sync handler cannot be interrupted: it times out as it returns

    enqueue(sqla_queue_session, "t.slow_sync", {})
    result = drain(sqla_queue_session, own)
    assert result == DrainResult(retried=1)
    assert "ran longer than its timeout of 0.05 s" in result.errors[0][1]
    assert task_statuses(sqla_queue_session) == [("t.slow_sync", "queued", 1)]


def test_drain_fires_the_lifecycle_hooks_as_the_worker_does(
    sqla_queue_session: Session,
) -> None:
    own = Registry()
    seen: list[tuple[str, str, str]] = []

    @own.task(name="t.fine")
    def fine() -> None:
        pass

    @own.on_job_claimed
    def claimed(ctx: object) -> None:
        seen.append(("claimed", getattr(ctx, "task", "?"), ""))

    @own.on_job_finished
    def finished(ctx: object, outcome: Outcome) -> None:
        seen.append(("finished", outcome.job.task, outcome.kind.value))

    enqueue(sqla_queue_session, "t.fine", {})
    assert drain(sqla_queue_session, own) == DrainResult(succeeded=1)
    assert seen == [("claimed", "t.fine", ""), ("finished", "t.fine", "succeeded")]


def test_drain_defers_an_unknown_task_once_even_with_include_scheduled(
    sqla_queue_session: Session,
) -> None:
    enqueue(sqla_queue_session, "t.nobody_registered_this", {})
    enqueue(sqla_queue_session, "t.ok", {"n": 1}, delay=3600)
    result = drain(sqla_queue_session, registry, include_scheduled=True)
    assert result == DrainResult(succeeded=1, deferred=1)  # not claimed again and again
    assert task_statuses(sqla_queue_session) == [("t.nobody_registered_this", "queued", 0)]


def test_drain_from_async_code_runs_async_handlers_on_another_loop(
    sqla_queue_database_url: str,
) -> None:
    async def scenario() -> DrainResult:
        engine = create_async_engine(sqla_queue_database_url)
        async with AsyncSession(engine) as session, session.begin():
            enqueue(session, "t.slow_async", {"seconds": 0.01})
            result = await session.run_sync(lambda sync: drain(sync, registry))
        await engine.dispose()
        return result

    assert asyncio.run(scenario()) == DrainResult(succeeded=1)


def test_drain_refuses_an_async_session_naming_the_fix(sqla_queue_database_url: str) -> None:
    session = AsyncSession(create_async_engine(sqla_queue_database_url))
    with pytest.raises(ConfigurationError, match=r"await session\.run_sync"):
        drain(session, registry)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_jobs must not be negative"):
        drain(session.sync_session, registry, max_jobs=-1)


# -- inline --------------------------------------------------------------------------------------


def test_inline_runs_jobs_at_commit_and_nothing_for_a_rollback(sqla_queue_engine: Engine) -> None:
    with inline(registry) as runs:
        with Session(sqla_queue_engine) as session, session.begin():
            enqueue(session, "t.ok", {"n": 1})
            assert calls == []  # not before the commit
        assert calls == [("t.ok", {"n": 1})]
        with Session(sqla_queue_engine) as session, session.begin():
            enqueue(session, "t.ok", {"n": 2})
            session.rollback()
    assert runs == DrainResult(succeeded=1)
    assert calls == [("t.ok", {"n": 1})]
    with Session(sqla_queue_engine) as session, session.begin():
        enqueue(session, "t.ok", {"n": 3})  # after the block: no longer inline
    assert_enqueued(sqla_queue_engine, args={"n": 3})


def test_inline_works_with_the_rolled_back_test_session(sqla_queue_session: Session) -> None:
    with inline(registry) as runs:
        enqueue(sqla_queue_session, "t.ok", {"n": 1})
        sqla_queue_session.commit()  # a savepoint of the test's transaction
    assert runs.succeeded == 1
    assert calls == [("t.ok", {"n": 1})]


def test_inline_raises_a_handler_error_from_commit(sqla_queue_engine: Engine) -> None:
    with inline(registry) as runs, Session(sqla_queue_engine) as session:
        enqueue(session, "t.boom", {})
        with pytest.raises(ValueError, match="boom"):
            session.commit()
    assert runs == DrainResult(retried=1)
    assert_enqueued(sqla_queue_engine, task="t.boom")  # committed, then retried as usual


def test_queue_helper_binds_target_and_registry(sqla_queue_session: Session) -> None:
    helper = QueueHelper(sqla_queue_session)
    enqueue(sqla_queue_session, "t.ok", {"n": 1})
    helper.assert_enqueued(task="t.ok")
    with pytest.raises(ConfigurationError, match="sqla_queue_registry"):
        helper.drain()
    assert helper.drain(registry) == DrainResult(succeeded=1)
    helper.assert_not_enqueued(task="t.ok")


def test_queue_helper_passes_on_the_filters_that_enqueued_jobs_takes() -> None:
    keywords = inspect.signature(enqueued_jobs).parameters.values()
    assert set(JobFilters.__annotations__) == {p.name for p in keywords if p.kind is p.KEYWORD_ONLY}


def test_inline_runs_at_an_async_session_commit(sqla_queue_database_url: str) -> None:
    async def scenario() -> DrainResult:
        engine = create_async_engine(sqla_queue_database_url)
        with inline(registry) as runs:
            async with AsyncSession(engine) as session, session.begin():
                enqueue(session, "t.ok", {"n": 1})
                enqueue(session, "t.slow_async", {"seconds": 0.01})
        await engine.dispose()
        return runs

    assert asyncio.run(scenario()) == DrainResult(succeeded=2)
    assert sorted(name for name, _ in calls) == ["t.ok", "t.slow_async"]


def test_drain_records_steps_in_the_sessions_transaction_and_replays_them_on_retry(
    sqla_queue_session: Session,
) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.task(name="stepped", pass_context=True, retry=RetryPolicy(base=0, jitter=0))
    def stepped(ctx: JobContext) -> int:
        n = ctx.step("count", lambda: calls.append(1) or len(calls))
        if ctx.attempt == 1:
            raise RuntimeError("once")
        return int(n)

    enqueue(sqla_queue_session, "stepped", {})
    result = drain(sqla_queue_session, registry, include_scheduled=True)
    assert (result.retried, result.succeeded) == (1, 1)
    assert calls == [1]


def test_drain_refuses_a_session_step_naming_the_worker(sqla_queue_session: Session) -> None:
    registry = Registry()

    @registry.task(name="saves", pass_context=True, max_attempts=1)
    def saves(ctx: JobContext) -> None:
        ctx.step("save", lambda session: None, session=True)

    enqueue(sqla_queue_session, "saves", {})
    with pytest.raises(ConfigurationError, match="session=True step needs a job run by a worker"):
        drain(sqla_queue_session, registry, reraise=True)
