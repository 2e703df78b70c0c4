"""Stored results and `wait_for`: the finishing statement keeps the result and NOTIFYs the
waiters, which wake without polling; failures are raised; results of queues that delete
their jobs are kept for the queue's result_ttl."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest
from helpers.statements import claim_all, succeed
from helpers.support import (
    WorkerThread,
    count_hot_where,
    count_where,
    database_clock,
    delay_chosen,
    enqueue_jobs,
    nested,
)
from helpers.support import wait_for as support_wait_for
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    JobFailedError,
    Registry,
    ResultMissingError,
    ResultTimeoutError,
    RetryPolicy,
    admin,
    wait_for,
    wait_for_async,
)
from sqla_queue.db import queries
from sqla_queue.db.database import normalize_url
from sqla_queue.enqueue.results import sync_engine_of
from sqla_queue.testing import drain, run_until_empty
from sqla_queue.worker import WorkerConfig

NO_POLLING = 600.0
"""A recheck interval no test waits out: a waiter that returns was woken by NOTIFY."""


def later(delay: float, action: Any) -> threading.Thread:
    thread = threading.Timer(delay, action)
    thread.start()
    return thread


@pytest.fixture
def one_job(engine: Engine) -> int:
    (job_id,) = enqueue_jobs(engine, "t", 1)
    return job_id


def test_wait_for_returns_the_result_the_finishing_statement_kept(
    engine: Engine, one_job: int
) -> None:
    claimed = claim_all(engine)
    finisher = later(0.2, lambda: succeed(engine, claimed, {one_job: {"total": 42, "ok": True}}))
    result = wait_for(engine, one_job, timeout=60, recheck=NO_POLLING)
    finisher.join()
    assert result == {"total": 42, "ok": True}


def test_wait_for_raises_the_jobs_failure_with_its_error(engine: Engine, one_job: int) -> None:
    claimed = claim_all(engine)

    def fail() -> None:
        params = {
            "job_ids": [one_job],
            "job_attempts": [claimed[one_job]],
            "job_errors": ["ValueError: card declined"],
        }
        with engine.begin() as conn:
            conn.execute(queries.fail_jobs(), params)

    finisher = later(0.2, fail)
    with pytest.raises(JobFailedError, match="card declined") as raised:
        wait_for(engine, one_job, timeout=60, recheck=NO_POLLING)
    finisher.join()
    assert (raised.value.job_id, raised.value.status) == (one_job, "failed")


def test_wait_for_a_cancelled_job_raises_on_its_next_look(engine: Engine, one_job: int) -> None:
    with engine.begin() as conn:
        admin.cancel_jobs(conn, [one_job])
    with pytest.raises(JobFailedError, match="ended cancelled"):
        wait_for(engine, one_job, timeout=5)


def test_wait_for_times_out_naming_the_jobs_status(engine: Engine, one_job: int) -> None:
    with pytest.raises(ResultTimeoutError, match=r"within 0.3 s \(it is queued\)"):
        wait_for(engine, one_job, timeout=0.3)


def test_wait_for_an_unknown_job_says_why_there_may_be_no_row(engine: Engine) -> None:
    with pytest.raises(ResultMissingError, match="keep_result=True"):
        wait_for(engine, 123456789, timeout=1)


def test_wait_for_takes_a_session_and_returns_none_for_a_job_kept_without_a_result(
    engine: Engine, one_job: int
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    succeed(engine, claim_all(engine), {})
    with Session(engine) as session:
        assert wait_for(session, one_job, timeout=5) is None


def test_a_result_in_a_deleting_queue_is_kept_until_its_ttl_then_the_reaper_deletes_it(
    engine: Engine,
) -> None:
    kept, plain = enqueue_jobs(engine, "t", 2)
    assert succeed(engine, claim_all(engine), {kept: [1, 2, 3]}) == 2
    assert count_where(engine, f"id = {plain}") == 0  # no result: deleted as before
    assert count_where(engine, f"id = {kept} AND status = 'done'") == 1
    assert wait_for(engine, kept, timeout=5) == [1, 2, 3]
    with engine.begin() as conn:
        conn.execute(queries.reap_stale_jobs())  # within its ttl (a day): left alone
    assert count_where(engine, f"id = {kept}") == 1
    with engine.begin() as conn:
        admin.set_result_ttl(conn, "default", 0)
    with engine.begin() as conn:
        conn.execute(queries.reap_stale_jobs())
    assert count_where(engine, f"id = {kept}") == 0


def test_an_archiving_queue_archives_the_result_and_wait_for_reads_it_there(
    engine: Engine, one_job: int
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "archive")
    succeed(engine, claim_all(engine), {one_job: "receipt-7.pdf"})
    assert count_hot_where(engine, f"id = {one_job}") == 0
    with engine.connect() as conn:
        stored = conn.scalar(
            text("SELECT result FROM sqla_queue.jobs_history WHERE id = :id"), {"id": one_job}
        )
    assert stored == "receipt-7.pdf"
    assert wait_for(engine, one_job, timeout=5) == "receipt-7.pdf"


def test_a_stale_attempt_keeps_no_result(engine: Engine, one_job: int) -> None:
    claimed = claim_all(engine)
    stale = {one_job: claimed[one_job] + 1}
    assert succeed(engine, stale, {one_job: "late"}) == 0
    assert count_where(engine, f"id = {one_job} AND status = 'running' AND result IS NULL") == 1


def test_ten_threads_waiting_for_a_hundred_jobs_each_get_their_own_result(
    engine: Engine,
) -> None:
    ids = enqueue_jobs(engine, "t", 100)
    got: dict[int, Any] = {}
    errors: list[BaseException] = []

    def waiter(mine: list[int]) -> None:
        try:
            for job_id in mine:
                got[job_id] = wait_for(engine, job_id, timeout=60, recheck=NO_POLLING)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=waiter, args=(ids[i::10],)) for i in range(10)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    claimed = claim_all(engine)
    for batch in (ids[:50], ids[50:]):
        succeed(engine, {i: claimed[i] for i in batch}, {i: {"n": i} for i in batch})
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert got == {i: {"n": i} for i in ids}


def test_wait_for_async_returns_the_result_with_the_loop_free(
    database_url: str, engine: Engine, one_job: int
) -> None:
    claimed = claim_all(engine)
    async_engine = create_async_engine(
        database_url.replace("postgresql://", "postgresql+psycopg://")
    )

    async def main() -> tuple[Any, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, lambda: succeed(engine, claimed, {one_job: "async ok"}))
        try:
            return await wait_for_async(async_engine, one_job, 60, recheck=NO_POLLING), ticks
        finally:
            ticker.cancel()
            await async_engine.dispose()

    result, ticks = asyncio.run(main())
    assert result == "async ok"
    assert ticks > 5, "the event loop ran while the job was awaited"


def test_an_async_engine_s_sync_companion_is_disposed_with_it(
    database_url: str, engine: Engine, one_job: int
) -> None:
    succeed(engine, claim_all(engine), {one_job: "done"})
    async_engine = create_async_engine(
        database_url.replace("postgresql://", "postgresql+psycopg://")
    )

    async def main() -> tuple[Any, Engine, int]:
        result = await wait_for_async(async_engine, one_job, 5)
        companion = sync_engine_of(async_engine)
        pooled = companion.pool.checkedin()
        await async_engine.dispose()
        return result, companion, pooled

    result, companion, pooled = asyncio.run(main())
    assert result == "done"
    assert pooled >= 1
    assert companion.pool.checkedin() == 0  # disposed with its async engine
    assert sync_engine_of(async_engine) is not companion  # a later wait makes another
    asyncio.run(async_engine.dispose())


# -- handlers: drain and the worker --------------------------------------------------------------


def keeping_registry() -> Registry:
    registry = Registry()

    @registry.task(name="calc", keep_result=True)
    def calc(n: int) -> dict[str, int]:
        return {"double": n * 2}

    @registry.task(name="opaque", keep_result=True, max_attempts=1)
    def opaque() -> object:
        return object()

    @registry.task(name="plain")
    def plain() -> str:
        return "not kept"

    return registry


@pytest.mark.parametrize("runner", ["drain", "worker"])
def test_a_task_with_keep_result_keeps_its_return_value_and_others_do_not(
    engine: Engine, runner: str
) -> None:
    registry = keeping_registry()
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (calc,) = enqueue_jobs(engine, "calc", 1, args={"n": 21})
    (opaque,) = enqueue_jobs(engine, "opaque", 1)
    (plain,) = enqueue_jobs(engine, "plain", 1)
    if runner == "drain":
        drain(engine, registry)
    else:
        run_until_empty(engine, registry)
    assert wait_for(engine, calc, timeout=5) == {"double": 42}
    assert wait_for(engine, plain, timeout=5) is None
    with pytest.raises(JobFailedError, match="not JSON-serialisable"):
        wait_for(engine, opaque, timeout=5)


def test_an_absurd_result_ttl_in_one_queue_stops_no_workers_reaper_for_another(
    engine: Engine,
) -> None:
    # A ttl no interval holds, written before input was bounded (or by hand): the reaper's
    # statement, one for all queues, must still requeue another queue's abandoned job.
    with engine.begin() as conn:
        admin.create_queue(conn, "results")
        admin.create_queue(conn, "work", "keep")
        conn.execute(text("UPDATE sqla_queue.queues SET result_ttl = 1e300 WHERE name = 'results'"))
    (kept,) = enqueue_jobs(engine, "t", 1, queue="results")
    assert succeed(engine, claim_all(engine), {kept: "kept"}) == 1
    (abandoned,) = enqueue_jobs(engine, "t", 1, queue="work")
    claim_all(engine)  # by a worker that never comes back: its lease ran out an hour ago
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET lease_expires_at = now() - interval '1 hour'")
        )
    registry = Registry()
    ran: list[int] = []
    registry.task(name="t", pass_context=True)(lambda ctx: ran.append(ctx.job_id))

    with WorkerThread(engine, registry, queues=["work"], heartbeat=0.25, dead_after=1.0):
        support_wait_for(lambda: ran, timeout=60)

    assert ran == [abandoned]
    assert count_where(engine, f"id = {abandoned} AND status = 'done'") == 1
    assert count_where(engine, f"id = {kept} AND status = 'done'") == 1  # its ttl: not yet


def test_settings_stored_past_their_bounds_fail_no_claim_or_reaper_round(engine: Engine) -> None:
    # Values no input takes any more, written by hand: a window and a ttl no interval holds,
    # and a budget at the int4 limit that a refund would push past it.
    with engine.begin() as conn:
        admin.create_queue(conn, "odd")
    (limited,) = enqueue_jobs(engine, "t", 1, queue="odd")
    (plain,) = enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.queues SET rate_limit = 1, rate_window = 1e300, "
                "result_ttl = 'NaN' WHERE name = 'odd'"
            )
        )
        conn.execute(text(f"UPDATE sqla_queue.jobs SET max_attempts = {2**31 - 1}"))
    assert sorted(claim_all(engine)) == [limited, plain]
    with engine.begin() as conn:  # the claimer died before either handler started
        conn.execute(
            text("UPDATE sqla_queue.jobs SET lease_expires_at = now() - interval '1 hour'")
        )
        reaped = conn.execute(queries.reap_stale_jobs()).all()
    assert sorted(row.id for row in reaped) == [limited, plain]
    assert count_where(engine, f"max_attempts = {2**31 - 1} AND status = 'queued'") == 2


# -- outcomes PostgreSQL refuses: recorded as a failure, never run again -----------------------


class deep_recursion:
    """Lets json.dumps nest deeper than PostgreSQL's stack allows (jsonb then refuses)."""

    def __enter__(self) -> None:
        self.limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(self.limit, 100_000))

    def __exit__(self, *exc: object) -> None:
        sys.setrecursionlimit(self.limit)


def refusing_registry(calls: dict[str, int]) -> Registry:
    registry = Registry()

    def counted(name: str, value: Any, max_attempts: int = 3) -> None:
        @registry.task(name=name, keep_result=True, max_attempts=max_attempts)
        def handler() -> Any:
            calls[name] = calls.get(name, 0) + 1
            if isinstance(value, BaseException):
                raise value
            return value

    counted("surrogate", "caf\udce9")
    counted("surrogate_key", {"caf\udce9": 1})
    counted("nan", {"ratio": float("nan")})
    counted("infinity", [float("inf")])
    counted("nul", "a\x00b")
    counted("too_deep", nested(30_000, leaf=[]))
    counted("odd_error", ValueError("bad \x00 byte in caf\udce9"), max_attempts=1)
    counted("fine", {"ok": True})
    return registry


@pytest.mark.parametrize("retention", ["keep", "delete"])
def test_a_result_or_error_postgresql_refuses_runs_once_and_fails_with_a_clear_reason(
    engine: Engine, retention: str
) -> None:
    calls: dict[str, int] = {}
    registry = refusing_registry(calls)
    with engine.begin() as conn:
        admin.set_retention(conn, "default", retention)
    ids = {name: enqueue_jobs(engine, name, 1)[0] for name in registry}
    with deep_recursion():  # the handlers run on this worker's threads, in this process
        run_until_empty(engine, registry, WorkerConfig(concurrency=2, batch=50, poll_only=True))
    assert calls == dict.fromkeys(registry, 1), "a refused outcome ran its job again"
    assert wait_for(engine, ids["fine"], timeout=5) == {"ok": True}
    reasons = {
        "surrogate": "lone surrogate",
        "surrogate_key": "lone surrogate",
        "nan": "NaN or infinity",
        "infinity": "NaN or infinity",
        "nul": "NUL character",
        "too_deep": "the handler's result could not be stored: stack depth limit exceeded",
        "odd_error": r"ValueError: bad \x00 byte in caf\udce9",
    }
    for name, reason in reasons.items():
        with pytest.raises(JobFailedError) as failed:
            wait_for(engine, ids[name], timeout=5)
        assert reason in (failed.value.error or ""), name
    assert count_where(engine, "status = 'running'") == 0


class BrokenPolicy(RetryPolicy):
    """A retry policy whose delays PostgreSQL cannot add to a timestamp."""

    def delay(self, attempt: int) -> float:
        return float("nan") if attempt == 1 else 1e300


def test_a_retry_delay_postgresql_cannot_store_is_replaced_by_the_default_backoff(
    engine: Engine,
) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.task(name="flaky", max_attempts=3, retry=BrokenPolicy())
    def flaky() -> None:
        calls.append(1)
        raise RuntimeError("try again")

    (job_id,) = enqueue_jobs(engine, "flaky", 1)
    before = database_clock(engine)
    run_until_empty(engine, registry)
    after = database_clock(engine)
    assert calls == [1]
    with engine.connect() as conn:
        status, attempts = conn.execute(
            text("SELECT status, attempts FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        ).one()
    assert (status, attempts) == ("queued", 1)
    low, high = delay_chosen(engine, job_id, before, after)
    # the default backoff's first delay, within its jitter, not a lost outcome
    first, spread = RetryPolicy(jitter=0).delay(1), RetryPolicy().jitter
    assert low <= first * (1 + spread) + 1e-6
    assert high >= first * (1 - spread) - 1e-6


# -- a zero or small timeout is a poll: the row is read before any LISTEN ------------------------


@pytest.mark.parametrize("retention", ["keep", "delete"])
@pytest.mark.parametrize("timeout", [0, 0.001, 0.05])
def test_wait_for_with_a_zero_or_small_timeout_returns_a_result_that_is_already_kept(
    database_url: str, engine: Engine, retention: str, timeout: float
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", retention)
    (job_id,) = enqueue_jobs(engine, "t", 1)
    succeed(engine, claim_all(engine), {job_id: {"paid": True}})
    fresh = create_engine(
        normalize_url(database_url)
    )  # no LISTEN connection yet: the poll needs none
    try:
        assert wait_for(fresh, job_id, timeout=timeout) == {"paid": True}
    finally:
        fresh.dispose()


def test_wait_for_with_a_zero_timeout_raises_a_jobs_failure_at_once(
    database_url: str, engine: Engine, one_job: int
) -> None:
    with engine.begin() as conn:
        admin.cancel_jobs(conn, [one_job])
    fresh = create_engine(normalize_url(database_url))
    try:
        with pytest.raises(JobFailedError, match="ended cancelled"):
            wait_for(fresh, one_job, timeout=0)
    finally:
        fresh.dispose()


@pytest.mark.parametrize("timeout", [0, 0.05])
def test_wait_for_with_a_zero_or_small_timeout_on_a_queued_job_times_out_by_its_timeout(
    database_url: str, one_job: int, timeout: float
) -> None:
    """The timeout bounds every wait, the LISTEN's start and the looks between
    notifications: with an hour between looks, a wait that let either run past its timeout
    would still be waiting at the deadline (a guard against a hang, not a measure)."""
    fresh = create_engine(normalize_url(database_url))
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            wait_for(fresh, one_job, timeout=timeout, recheck=3600)
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    try:
        waiter.start()
        waiter.join(120)
        assert not waiter.is_alive(), "wait_for waited past its timeout"
        (raised,) = outcome
        assert isinstance(raised, ResultTimeoutError), raised
        assert "(it is queued)" in str(raised)
    finally:
        fresh.dispose()


def test_wait_for_async_with_a_zero_timeout_polls_without_blocking(
    database_url: str, engine: Engine
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (done,) = enqueue_jobs(engine, "t", 1)
    succeed(engine, claim_all(engine), {done: 7})
    (queued,) = enqueue_jobs(engine, "t", 1)
    async_engine = create_async_engine(
        database_url.replace("postgresql://", "postgresql+psycopg://")
    )

    async def main() -> Any:
        try:
            with pytest.raises(ResultTimeoutError, match=r"\(it is queued\)"):
                await wait_for_async(async_engine, queued, timeout=0)
            return await wait_for_async(async_engine, done, timeout=0)
        finally:
            await async_engine.dispose()

    assert asyncio.run(main()) == 7


@pytest.mark.parametrize("timeout", [-1, -0.001, float("nan"), "5", True])
def test_wait_for_refuses_a_negative_nan_or_non_numeric_timeout(
    engine: Engine, one_job: int, timeout: Any
) -> None:
    with pytest.raises((ValueError, TypeError), match="timeout must be 0 or more seconds"):
        wait_for(engine, one_job, timeout=timeout)
    with pytest.raises((ValueError, TypeError), match="timeout must be 0 or more seconds"):
        asyncio.run(wait_for_async(create_async_engine("postgresql+psycopg://"), 1, timeout))


@pytest.mark.parametrize("recheck", [0, -5, float("nan")])
def test_wait_for_refuses_a_recheck_that_is_not_positive(
    engine: Engine, one_job: int, recheck: float
) -> None:
    with pytest.raises(ValueError, match="recheck must be more than 0 seconds"):
        wait_for(engine, one_job, timeout=1, recheck=recheck)
