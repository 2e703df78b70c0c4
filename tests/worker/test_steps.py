"""Durable steps (`ctx.step`, `ctx.step_async`): run once, recorded under (job, name),
replayed by every later run of the job; fenced on the attempt; a session step's writes and
its record commit together; removed with their job by every path that deletes jobs."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from helpers.multixact_support import admin_engine, count_multixacts
from helpers.support import WorkerThread, count_hot_where, count_where, enqueue_jobs, wait_for
from psycopg.pq import Trace
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session

from sqla_queue import (
    JobContext,
    JobLostError,
    Registry,
    RetryPolicy,
    Snooze,
    admin,
    enqueue,
    enqueue_many,
)
from sqla_queue import wait_for as wait_for_result
from sqla_queue.admin.filters import JobFilter, bulk_delete
from sqla_queue.brokers.worker import _no_session
from sqla_queue.db import queries
from sqla_queue.db.database import create_queue_engine
from sqla_queue.db.queries import steps as step_queries
from sqla_queue.errors import ConfigurationError, StepResultError
from sqla_queue.job.steps import MAX_STEP_RESULT_BYTES, StepWrite
from sqla_queue.worker.steps import EngineJournal
from sqla_queue.worker.transactional import job_session

NO_WAIT = RetryPolicy(base=0.0, jitter=0.0)


@pytest.fixture
def ledger(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.ledger (job_id bigint, step text, attempt int)"))
    return engine


def claim_one(engine: Engine) -> JobContext:
    """A claimed job's context as the worker makes it (its steps on `engine`)."""
    if count_where(engine, "status = 'queued'") == 0:
        enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        (row,) = conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w"}).all()
    return context_of(engine, row.id, row.attempts)


def context_of(engine: Engine, job_id: int, attempt: int) -> JobContext:
    return JobContext(job_id, "t", "default", attempt, steps=EngineJournal(engine))


def next_attempt(engine: Engine, ctx: JobContext) -> JobContext:
    """The job reaped and claimed again: the next attempt's context (the old one is stale)."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET attempts = attempts + 1 WHERE id = :id"),
            {"id": ctx.job_id},
        )
    return context_of(engine, ctx.job_id, ctx.attempt + 1)


def steps_of(engine: Engine, job_id: int) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(step_queries.list_job_steps(), {"job_id": job_id}).all())


def ledger_rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, step, attempt FROM public.ledger ORDER BY 3"))
        return [tuple(r) for r in rows]


def test_a_step_runs_once_and_every_later_attempt_gets_its_recorded_result(engine: Engine) -> None:
    calls: list[int] = []

    def charge(order: int) -> dict[str, Any]:
        calls.append(order)
        return {"charge": f"ch_{order}", "amounts": (5, 7)}

    first = claim_one(engine)
    assert first.step("charge", charge, 42) == {"charge": "ch_42", "amounts": [5, 7]}
    second = next_attempt(engine, first)
    assert second.step("charge", charge, 42) == {"charge": "ch_42", "amounts": [5, 7]}
    assert calls == [42]
    assert (first.steps_run, first.steps_replayed) == (1, 0)
    assert (second.steps_run, second.steps_replayed) == (0, 1)
    (row,) = steps_of(engine, first.job_id)
    assert (row.name, row.status, row.attempt, row.tries) == ("charge", "done", first.attempt, 1)


def test_steps_are_keyed_by_name_so_a_reordered_or_added_step_is_safe(engine: Engine) -> None:
    ran: list[str] = []

    def step(label: str) -> str:
        ran.append(label)
        return label

    first = claim_one(engine)
    first.step("a", step, "a")
    first.step("b", step, "b")
    second = next_attempt(engine, first)  # a deploy in between: b first, a new step c, then a
    assert [second.step(n, step, n) for n in ("b", "c", "a")] == ["b", "c", "a"]
    assert ran == ["a", "b", "c"]


def test_a_stale_attempt_cannot_record_a_step(engine: Engine) -> None:
    stale = claim_one(engine)
    current = next_attempt(engine, stale)
    with pytest.raises(JobLostError, match=f"Job {stale.job_id} is no longer held"):
        stale.step("charge", lambda: "stale")
    assert steps_of(engine, stale.job_id) == []
    assert current.step("charge", lambda: "current") == "current"


def test_a_session_step_commits_its_writes_with_its_record(ledger: Engine) -> None:
    def save(session: Session, job_id: int, attempt: int) -> int:
        session.execute(
            text("INSERT INTO public.ledger VALUES (:j, 'save', :a)"), {"j": job_id, "a": attempt}
        )
        return 7

    first = claim_one(ledger)
    assert first.step("save", save, first.job_id, first.attempt, session=True) == 7
    second = next_attempt(ledger, first)
    assert second.step("save", save, second.job_id, second.attempt, session=True) == 7
    assert ledger_rows(ledger) == [(first.job_id, "save", first.attempt)]


def test_a_stale_session_step_rolls_its_writes_back(ledger: Engine) -> None:
    stale = claim_one(ledger)
    next_attempt(ledger, stale)

    def save(session: Session) -> None:
        session.execute(text("INSERT INTO public.ledger VALUES (1, 'save', 1)"))

    with pytest.raises(JobLostError):
        stale.step("save", save, session=True)
    assert ledger_rows(ledger) == []
    assert steps_of(ledger, stale.job_id) == []


def test_a_session_step_that_raises_rolls_back_and_records_its_error(ledger: Engine) -> None:
    ctx = claim_one(ledger)

    def save(session: Session) -> None:
        session.execute(text("INSERT INTO public.ledger VALUES (1, 'save', 1)"))
        raise KeyError("order")

    with pytest.raises(KeyError):
        ctx.step("save", save, session=True)
    assert ledger_rows(ledger) == []
    (row,) = steps_of(ledger, ctx.job_id)
    assert (row.status, row.error) == ("failed", "KeyError: 'order'")


def test_two_attempts_racing_a_session_step_commit_its_writes_once(ledger: Engine) -> None:
    """The stale attempt passed its fence and holds its record uncommitted; the next attempt
    runs the step meanwhile: it waits on the step's key, then records nothing and rolls its
    writes back, and returns the result the first one committed."""
    stale = claim_one(ledger)
    record = step_queries.record_step()
    holder = ledger.connect()
    transaction = holder.begin()
    holder.execute(
        text("INSERT INTO public.ledger VALUES (:j, 'save', :a)"),
        {"j": stale.job_id, "a": stale.attempt},
    )
    write = StepWrite(
        stale.job_id, stale.attempt, "save", "step", "done", 1, database_now(ledger), '"first"'
    )
    params = {**write.__dict__, "result": write.result_json}
    del params["result_json"]
    assert holder.execute(record, params).first() is not None
    current = next_attempt(ledger, stale)
    got: list[Any] = []

    def save(session: Session) -> str:
        session.execute(
            text("INSERT INTO public.ledger VALUES (:j, 'save', :a)"),
            {"j": current.job_id, "a": current.attempt},
        )
        return "second"

    racer = threading.Thread(target=lambda: got.append(current.step("save", save, session=True)))
    racer.start()
    wait_for(lambda: waiting_on_a_lock(ledger), 10)
    transaction.commit()
    holder.close()
    racer.join(20)
    assert got == ["first"]
    assert ledger_rows(ledger) == [(stale.job_id, "save", stale.attempt)]
    assert (current.steps_run, current.steps_replayed) == (0, 1)


def database_now(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_a_result_over_the_limit_is_refused_naming_the_limit_and_the_fix(engine: Engine) -> None:
    ctx = claim_one(engine)
    with pytest.raises(StepResultError) as caught:
        ctx.step("big", lambda: "x" * MAX_STEP_RESULT_BYTES)
    message = str(caught.value)
    assert f"Step 'big' of job {ctx.job_id} ran, but its result cannot be recorded" in message
    assert "65,536-byte limit" in message
    assert "return its key" in message
    assert "\n" not in message
    (row,) = steps_of(engine, ctx.job_id)
    assert row.status == "failed"
    assert row.error.startswith("StepResultError")


def test_a_result_that_is_not_json_is_refused_clearly(engine: Engine) -> None:
    ctx = claim_one(engine)
    with pytest.raises(StepResultError, match=r"not JSON-serialisable.*return only dicts"):
        ctx.step("obj", object)


def test_a_step_retries_on_its_own_without_failing_the_job(engine: Engine) -> None:
    ctx = claim_one(engine)
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("gateway down")
        return "ok"

    assert ctx.step("call", flaky, attempts=3, backoff=NO_WAIT) == "ok"
    (row,) = steps_of(engine, ctx.job_id)
    assert (row.status, row.tries) == ("done", 3)


def test_a_step_out_of_tries_records_its_error_and_runs_again_next_attempt(engine: Engine) -> None:
    first = claim_one(engine)
    with pytest.raises(ConnectionError):
        first.step("call", _always_down, attempts=2, backoff=NO_WAIT)
    (row,) = steps_of(engine, first.job_id)
    assert (row.status, row.tries, row.error) == ("failed", 2, "ConnectionError: down")
    second = next_attempt(engine, first)
    assert second.step("call", lambda: "up") == "up"
    (row,) = steps_of(engine, first.job_id)
    assert (row.status, row.attempt, row.error) == ("done", second.attempt, None)


def _always_down() -> None:
    raise ConnectionError("down")


def test_bad_step_options_are_refused_in_one_line(engine: Engine) -> None:
    ctx = claim_one(engine)
    with pytest.raises(ConfigurationError, match="attempts must be a whole number of 1 or more"):
        ctx.step("x", lambda: 1, attempts=0)
    with pytest.raises(ConfigurationError, match="step's name must be a non-empty string"):
        ctx.step("", lambda: 1)

    async def coro() -> int:
        return 1

    with pytest.raises(TypeError, match=r"use `await ctx.step_async\(...\)`"):
        ctx.step("x", coro)


def test_a_context_without_a_journal_says_which_runner_records_steps() -> None:
    ctx = JobContext(1, "t", "default", 1)
    with pytest.raises(ConfigurationError, match="need a job run by the table worker"):
        ctx.step("x", lambda: 1)


def test_an_async_step_runs_a_coroutine_once_and_replays_it(ledger: Engine) -> None:
    calls: list[int] = []

    async def charge(order: int) -> str:
        await asyncio.sleep(0)
        calls.append(order)
        return f"ch_{order}"

    def save(session: Session) -> int:
        session.execute(text("INSERT INTO public.ledger VALUES (1, 'save', 1)"))
        return 1

    first = claim_one(ledger)
    assert asyncio.run(first.step_async("charge", charge, 3)) == "ch_3"
    assert asyncio.run(first.step_async("save", save, session=True)) == 1
    second = next_attempt(ledger, first)
    assert asyncio.run(second.step_async("charge", charge, 3)) == "ch_3"
    assert asyncio.run(second.step_async("save", save, session=True)) == 1
    assert calls == [3]
    assert len(ledger_rows(ledger)) == 1


# -- with a worker ---------------------------------------------------------------------------


def test_a_job_retried_after_a_failure_skips_its_finished_steps(ledger: Engine) -> None:
    registry = Registry()
    charged: list[int] = []

    @registry.task(name="order", pass_context=True, retry=NO_WAIT, max_attempts=3)
    def order(ctx: JobContext, order_id: int) -> None:
        ctx.step("charge", lambda: charged.append(order_id) or f"ch_{order_id}")
        ctx.step("save", _save_ledger, ctx.job_id, ctx.attempt, session=True)
        if ctx.attempt == 1:
            raise RuntimeError("the receipt mailer is down")

    with ledger.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (job_id,) = enqueue_jobs(ledger, "order", 1, args={"order_id": 9})
    with WorkerThread(ledger, registry, burst=True, burst_wait=10):
        wait_for(lambda: count_where(ledger, "status = 'done'") == 1, 30)
    assert charged == [9]
    assert ledger_rows(ledger) == [(job_id, "save", 1)]
    assert {row.name for row in steps_of(ledger, job_id)} == {"charge", "save"}


def _slow_double(n: int) -> int:
    time.sleep(0.005)
    return n * 2


def _save_ledger(session: Session, job_id: int, attempt: int) -> None:
    session.execute(
        text("INSERT INTO public.ledger VALUES (:j, 'save', :a)"), {"j": job_id, "a": attempt}
    )


# -- removed with their job ------------------------------------------------------------------


def finished_job_with_a_step(engine: Engine, status: str = "done") -> int:
    ctx = claim_one(engine)
    ctx.step("s", lambda: 1)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = :s, finished_at = now() - interval '2 days', "
                "locked_by = NULL, heartbeat_at = NULL, lease_expires_at = NULL WHERE id = :id"
            ),
            {"s": status, "id": ctx.job_id},
        )
    assert count_where(engine, "true") >= 1
    return ctx.job_id


def step_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM sqla_queue.job_steps")).scalar_one())


def test_prune_removes_the_steps_of_the_jobs_it_deletes(engine: Engine) -> None:
    finished_job_with_a_step(engine)
    with engine.begin() as conn:
        assert admin.prune(conn, older_than=3600) == 1
    assert step_rows(engine) == 0


def test_deleting_a_job_removes_its_steps_and_keeps_the_others(engine: Engine) -> None:
    gone = finished_job_with_a_step(engine)
    enqueue_jobs(engine, "t", 1)
    kept = claim_one(engine)
    kept.step("s", lambda: 2)
    with engine.begin() as conn:
        admin.delete_jobs(conn, [gone])
    assert [r.name for r in steps_of(engine, kept.job_id)] == ["s"]
    assert steps_of(engine, gone) == []


def test_a_bulk_delete_removes_the_steps_of_its_jobs(engine: Engine) -> None:
    finished_job_with_a_step(engine, status="failed")
    result = bulk_delete(engine, JobFilter(status="failed"))
    assert result.acted == 1
    assert step_rows(engine) == 0


def test_deleting_a_queue_removes_the_steps_of_its_jobs(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "gone")
    enqueue_jobs(engine, "t", 1, queue="gone")
    ctx = claim_one(engine)
    ctx.step("s", lambda: 1)
    with engine.begin() as conn:
        admin.delete_queue(conn, "gone", force=True)
    assert step_rows(engine) == 0


def run_jobs_of_one_step(engine: Engine, count: int) -> None:
    """`count` jobs each recording one step, run by a worker until none is left."""
    registry = Registry()

    @registry.task(name="t", pass_context=True)
    def t(ctx: JobContext) -> None:
        ctx.step("s", lambda: 1)

    enqueue_jobs(engine, "t", count)
    with WorkerThread(engine, registry, burst=True):
        wait_for(lambda: count_hot_where(engine, "true") == 0, 30)


def test_a_job_finished_by_a_queue_that_deletes_its_jobs_takes_its_steps(engine: Engine) -> None:
    run_jobs_of_one_step(engine, 3)
    assert step_rows(engine) == 0


def test_a_job_moved_to_the_history_keeps_its_steps_until_its_partition_is_dropped(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "archive")
    run_jobs_of_one_step(engine, 2)
    with engine.connect() as conn:
        archived = conn.execute(text("SELECT count(*) FROM sqla_queue.jobs_history")).scalar()
    assert archived == 2
    assert step_rows(engine) == 2  # jobs show still shows them
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs_history SET finished_at = now() - interval '9 days'")
        )
        conn.execute(text("SELECT sqla_queue.keep_history(1, 0, 0)"))
        assert admin.prune(conn, 7 * 86400) == 2
    assert step_rows(engine) == 0


def test_sleep_length_is_bounded_and_typed(engine: Engine) -> None:
    ctx = claim_one(engine)
    with pytest.raises(TypeError, match=r"needs a timedelta.*ctx.sleep\(timedelta\(days=3\)\)"):
        ctx.sleep(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="from 0 to 3650 days"):
        ctx.sleep(timedelta(days=-1))


# -- MultiXacts ------------------------------------------------------------------------------


@pytest.mark.slow
def test_steps_and_sleeps_mint_no_multixacts_under_concurrency(private_url: str) -> None:
    """Two workers of 4 handler threads each run jobs of seven steps (one through its
    session), a sleep and its wake, while heartbeats every 20 ms extend the leases of the
    same job rows; on the private cluster (MultiXact ids are cluster-wide), none is minted.
    Overlaps are left to chance here; the next test forces one, where a foreign key mints."""
    engine = create_engine(private_url, pool_size=12)
    admin_db = admin_engine(private_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE public.ledger (job_id bigint, step text, attempt int)"))
            admin.set_retention(conn, "default", "keep")
        registry = Registry()

        @registry.task(name="durable", pass_context=True)
        def durable(ctx: JobContext, n: int) -> None:
            ctx.step("charge", lambda: {"n": n})
            ctx.step("save", _save_ledger, ctx.job_id, ctx.attempt, session=True)
            ctx.sleep(timedelta(0))  # recorded, over at once: the run goes on
            for k in range(5):  # the job's row is updated (its lease) while steps record
                ctx.step(f"mail{k}", _slow_double, n)
            if ctx.attempt == 1 and n % 10 == 0:
                ctx.sleep(timedelta(milliseconds=200), name="nap")  # ends the run, wakes soon

        jobs = 200
        with Session(engine) as session, session.begin():
            enqueue_many(session, [{"task": "durable", "args": {"n": n}} for n in range(jobs)])

        def run() -> None:
            with (
                WorkerThread(engine, registry, concurrency=4),
                WorkerThread(engine, registry, concurrency=4),
            ):
                wait_for(lambda: count_where(engine, "status = 'done'") == jobs, 120)

        minted = count_multixacts(admin_db, run)
        assert count_where(engine, "status = 'done'") == jobs
        with engine.connect() as conn:
            steps = conn.execute(text("SELECT count(*) FROM sqla_queue.job_steps")).scalar()
        assert steps == jobs * 8 + jobs // 10  # charge, save, sleep#1, mail0-4 (+ nap)
        assert len(ledger_rows(engine)) == jobs
        assert minted == 0
        print(f"\nMultiXacts minted by {jobs} jobs of 8 steps and sleeps: {minted}")
    finally:
        admin_db.dispose()
        engine.dispose()


def test_recording_steps_while_the_worker_updates_the_job_row_mints_no_multixact(
    private_url: str,
) -> None:
    """The worker's heartbeat holds its UPDATE of the job's row uncommitted while the job
    records a step, a session step and a sleep: none waits for it, and no MultiXact is
    minted (with a foreign key from job_steps to jobs, its FOR KEY SHARE on that row minted 6
    here: checked by hand)."""
    engine = create_engine(private_url)
    admin_db = admin_engine(private_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE public.ledger (job_id bigint, step text, attempt int)"))
        ctx = claim_one(engine)
        done: list[str] = []

        def record_while_the_row_is_updated() -> None:
            with engine.connect() as heartbeat:
                heartbeat.execute(
                    text("UPDATE sqla_queue.jobs SET heartbeat_at = now() WHERE id = :id"),
                    {"id": ctx.job_id},
                )
                done.append(ctx.step("charge", lambda: "ch_1"))
                done.append(ctx.step("save", _save_ledger, ctx.job_id, ctx.attempt, session=True))
                ctx.sleep(timedelta(0))
                done.append("slept")
                heartbeat.commit()

        minted = count_multixacts(admin_db, record_while_the_row_is_updated)
        assert done == ["ch_1", None, "slept"]
        assert minted == 0
    finally:
        admin_db.dispose()
        engine.dispose()


# -- where steps meet other features -----------------------------------------------------------


def test_a_session_step_enqueues_its_follow_up_job_exactly_once(engine: Engine) -> None:
    def ship(session: Session, order: int) -> int:
        return enqueue(session, "shop.ship", {"order": order}, flush=True).id

    first = claim_one(engine)
    follow_up = first.step("ship", ship, 7, session=True)
    second = next_attempt(engine, first)
    assert second.step("ship", ship, 7, session=True) == follow_up
    assert count_where(engine, "task = 'shop.ship'") == 1


def test_a_cancelled_job_cannot_record_a_step(engine: Engine) -> None:
    ctx = claim_one(engine)
    with engine.begin() as conn:
        assert admin.cancel_jobs(conn, [ctx.job_id]) == {ctx.job_id: "running"}
    with pytest.raises(JobLostError):
        ctx.step("charge", lambda: "too late")
    assert steps_of(engine, ctx.job_id) == []


def test_a_timeout_ends_a_steps_wait_between_its_tries(engine: Engine) -> None:
    registry = Registry()
    tries: list[int] = []

    # The timeout must outlast the first try's start on a loaded machine (0.5 s did not, at
    # load 28), and end the 10-minute wait between tries well before the test's deadline.
    @registry.task(name="slow", pass_context=True, timeout=5.0, max_attempts=1)
    def slow(ctx: JobContext) -> None:
        ctx.step("call", _count_and_fail, tries, attempts=5, backoff=RetryPolicy(base=600))

    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (job_id,) = enqueue_jobs(engine, "slow", 1)
    with WorkerThread(engine, registry, burst=True, burst_wait=5):
        wait_for(lambda: count_where(engine, "status = 'failed'") == 1, 60)
    assert count_where(engine, "last_error LIKE '%JobTimeoutError%'") == 1
    assert tries == [1]  # its 10-minute wait for the second try ended with the timeout
    (row,) = steps_of(engine, job_id)
    assert (row.status, row.tries) == ("failed", 1)


def _count_and_fail(tries: list[int]) -> None:
    tries.append(1)
    raise ConnectionError("down")


def test_a_snoozed_job_replays_the_steps_it_finished(engine: Engine) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="snoozy", pass_context=True)
    def snoozy(ctx: JobContext) -> None:
        ctx.step("once", ran.append, ctx.attempt)
        if ctx.attempt == 1:
            raise Snooze(0)

    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    enqueue_jobs(engine, "snoozy", 1)
    with WorkerThread(engine, registry, burst=True, burst_wait=5):
        wait_for(lambda: count_where(engine, "status = 'done'") == 1, 30)
    assert ran == [1]
    assert count_where(engine, "attempts = 2") == 1


def test_the_kept_result_is_built_from_recorded_steps_across_a_retry(engine: Engine) -> None:
    registry = Registry()
    values = iter(range(100))

    @registry.task(name="kept", pass_context=True, keep_result=True, retry=NO_WAIT)
    def kept(ctx: JobContext) -> dict[str, int]:
        v = ctx.step("v", lambda: next(values))
        if ctx.attempt == 1:
            raise RuntimeError("once")
        return {"v": v}

    (job_id,) = enqueue_jobs(engine, "kept", 1)
    with WorkerThread(engine, registry, burst=True, burst_wait=5):
        assert wait_for_result(engine, job_id, timeout=30) == {"v": 0}


def test_a_session_step_does_not_finish_the_job_its_ctx_session_does(engine: Engine) -> None:
    ctx = JobContext(
        claim_one(engine).job_id,
        "t",
        "default",
        1,
        session_factory=functools.partial(job_session, engine),
        steps=EngineJournal(engine),
    )
    ctx.step("save", lambda session: session.execute(text("SELECT 1")).scalar(), session=True)
    assert count_where(engine, f"id = {ctx.job_id} AND status = 'running'") == 1
    with ctx.session() as session:
        session.commit()
    assert ctx.committed
    assert count_where(engine, f"id = {ctx.job_id}") == 0  # finished: deleted by retention
    assert step_rows(engine) == 0  # and its steps with it


def test_a_broker_jobs_context_refuses_steps_and_sleeps() -> None:
    ctx = JobContext(7, "t", "default", 1, session_factory=_no_session)  # as a broker's
    with pytest.raises(ConfigurationError, match="need a job run by the table worker"):
        ctx.step("x", lambda: 1)
    with pytest.raises(ConfigurationError, match="need a job run by the table worker"):
        ctx.sleep(timedelta(seconds=1))


def test_a_step_called_twice_in_one_run_runs_once(engine: Engine) -> None:
    calls: list[int] = []
    ctx = claim_one(engine)
    assert ctx.step("once", lambda: calls.append(1) or len(calls)) == 1
    assert ctx.step("once", lambda: calls.append(1) or len(calls)) == 1
    assert calls == [1]
    assert (ctx.steps_run, ctx.steps_replayed) == (1, 1)


class Wire:
    """What a worker's engine sends, observed on a real engine (`create_queue_engine`, the
    worker's pool and pre-ping): the statements SQLAlchemy executes (`before_cursor_execute`)
    and, from libpq's own trace of every connection, the round trips (each ends with the
    server's ReadyForQuery) and the BEGIN and COMMIT that psycopg sends by itself."""

    def __init__(self, url: str, folder: Any) -> None:
        self.engine = create_queue_engine(url)
        self.statements: list[str] = []
        self._traced: list[list[Any]] = []
        """Per connection: its libpq connection, the trace's descriptor (None: stopped), the
        trace's file."""
        self._folder = folder
        event.listen(self.engine, "before_cursor_execute", self._statement)
        event.listen(self.engine.pool, "connect", self._trace)

    def _statement(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        self.statements.append(statement.split(None, 1)[0].upper())

    def _trace(self, dbapi_connection: Any, _record: Any) -> None:
        path = self._folder / f"libpq-{len(self._traced)}.trace"
        self._traced.append([dbapi_connection.pgconn, None, path])
        self._start(self._traced[-1])

    def _start(self, traced: list[Any]) -> None:
        traced[1] = os.open(traced[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        traced[0].trace(traced[1])
        traced[0].set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)

    def _stop(self) -> None:
        for traced in self._traced:
            if traced[1] is not None:
                traced[0].untrace()  # flushes what it wrote
                os.close(traced[1])
                traced[1] = None

    def reset(self) -> None:
        """Start counting afresh: no statement counted, every connection's trace emptied."""
        self._stop()
        self.statements.clear()
        for traced in self._traced:
            self._start(traced)

    def sent(self) -> list[str]:
        """Every message every connection traced since the last `reset` (the trace stops)."""
        self._stop()
        return [line for _, _, path in self._traced for line in path.read_text().splitlines()]

    def round_trips(self, lines: list[str]) -> int:
        return sum(1 for line in lines if "\tReadyForQuery\t" in line)

    def close(self) -> None:
        self._stop()
        self.engine.dispose()


@pytest.fixture
def wire(database_url: str, tmp_path: Any) -> Iterator[Wire]:
    observed = Wire(database_url, tmp_path)
    with observed.engine.connect():  # the dialect's first-connect queries, not counted
        pass
    yield observed
    observed.close()


def five_steps(ctx: JobContext, session: bool = False) -> list[Any]:
    if session:
        return [ctx.step(f"s{i}", _save_ledger, ctx.job_id, i, session=True) for i in range(5)]
    return [ctx.step(f"s{i}", lambda i=i: {"i": i}) for i in range(5)]


def test_a_plain_step_costs_one_statement_and_no_begin_or_commit(
    engine: Engine, wire: Wire
) -> None:
    """A 5-step handler sends one read of its job's steps and one record per step, each an
    autocommit statement of its own: no BEGIN, no COMMIT; a round trip each beside the
    pool's pre-ping of its checkout. A later attempt replaying them sends the read alone."""
    job = claim_one(engine)
    first = JobContext(job.job_id, "t", "default", job.attempt, steps=EngineJournal(wire.engine))
    wire.reset()
    assert five_steps(first) == [{"i": i} for i in range(5)]
    sent, statements = wire.sent(), list(wire.statements)
    assert statements == ["SELECT"] + ["INSERT"] * 5
    assert [line for line in sent if '"BEGIN' in line or '"COMMIT"' in line] == []
    assert wire.round_trips(sent) == 2 * 6  # each checkout's pre-ping, and its statement
    assert (first.steps_run, first.steps_replayed) == (5, 0)

    again = next_attempt(engine, job)
    replay = JobContext(job.job_id, "t", "default", again.attempt, steps=EngineJournal(wire.engine))
    wire.reset()
    assert five_steps(replay) == [{"i": i} for i in range(5)]
    sent = wire.sent()
    assert wire.statements == ["SELECT"]
    assert wire.round_trips(sent) == 2
    assert (replay.steps_run, replay.steps_replayed) == (0, 5)


def test_a_session_step_commits_its_writes_and_record_in_one_transaction(
    ledger: Engine, wire: Wire
) -> None:
    """A session step needs its transaction: BEGIN, its writes, its record, COMMIT."""
    job = claim_one(ledger)
    ctx = JobContext(job.job_id, "t", "default", job.attempt, steps=EngineJournal(wire.engine))
    wire.reset()
    five_steps(ctx, session=True)
    sent = wire.sent()
    assert wire.statements == ["SELECT"] + ["INSERT", "INSERT"] * 5  # the ledger's, the record
    assert sum(1 for line in sent if '\tQuery\t "BEGIN' in line) == 5
    assert sum(1 for line in sent if '\tQuery\t "COMMIT"' in line) == 5
    assert wire.round_trips(sent) == 2 + 5 * 5  # read; pre-ping, BEGIN, 2 INSERTs, COMMIT
    assert ledger_rows(ledger) == [(job.job_id, "save", i) for i in range(5)]
