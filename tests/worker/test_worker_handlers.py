"""The worker's handler threads: a handler keeps its slot (the worker's and its queue's)
until it has returned, even past its timeout or its cancel; one that will not return is
reported."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from helpers.support import (
    WorkerThread,
    count_where,
    enqueue_jobs,
    jobs_by_id,
    make_queue,
    wait_for,
)
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from sqla_queue import Registry, RetryPolicy, admin
from sqla_queue.contrib.metrics import instrument
from sqla_queue.doctor import DoctorOptions, Finding, Severity, diagnose
from sqla_queue.testing import run_until_empty


class Executing:
    """Counts the handlers executing at once, and the most there ever were."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.returned = 0

    @contextmanager
    def one(self) -> Iterator[None]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            yield
        finally:
            with self.lock:
                self.now -= 1
                self.returned += 1


def workers_finding(engine: Engine) -> Finding:
    (finding,) = [f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "workers"]
    return finding


def test_a_timed_out_sync_handler_keeps_its_worker_slot_until_it_returns(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()
    release = threading.Event()
    ran: list[bool] = []

    @registry.task(name="stuck", timeout=0.2, retry=RetryPolicy(base=60, jitter=0))
    def stuck() -> str:
        release.wait(60)  # bounded: the test sets it once the worker timed it out
        return "discarded"

    @registry.task(name="quick")
    def quick() -> None:
        ran.append(release.is_set())

    (stuck_id,) = enqueue_jobs(engine, "stuck", 1, priority=0)
    enqueue_jobs(engine, "quick", 5, priority=1)
    runner = WorkerThread(engine, registry, concurrency=1, batch=1)
    try:
        with runner:
            # the worker's own decision, not a sleep: under load the producer's deadline check
            # can come seconds after the 0.2 s timeout, and a release before it is a success
            wait_for(lambda: "timed out after 0.2s" in caplog.text, timeout=60)
            (held,) = jobs_by_id(engine, [stuck_id]).values()
            assert held.status == "running"  # leased by the worker: not reaped, not retried
            assert ran == []  # -c 1: the one slot is the stuck handler's
            release.set()
            wait_for(lambda: len(ran) == 5, timeout=60)
    finally:
        release.set()

    assert ran == [True] * 5  # each one after the stuck handler returned
    assert runner.stats is not None
    assert (runner.stats.succeeded, runner.stats.retried, runner.stats.timed_out) == (5, 1, 1)
    (job,) = jobs_by_id(engine).values()  # the quick jobs are deleted on success
    assert (job.id, job.status, job.attempts) == (stuck_id, "queued", 1)
    assert "ran longer than its timeout of 0.2 s" in (job.last_error or "")
    assert job.result is None


def test_a_handler_that_returns_past_its_deadline_unseen_by_a_busy_worker_timed_out(
    engine: Engine,
) -> None:
    # Found by the model-based test under load: the producer, which watches deadlines, was
    # busy when the handler returned late, and the job was settled as a success.
    registry = Registry()
    started = threading.Event()

    @registry.task(name="late", timeout=0.2, max_attempts=1)
    def late() -> str:
        started.set()
        time.sleep(0.6)
        return "too late"

    (job_id,) = enqueue_jobs(engine, "late", 1)
    with WorkerThread(engine, registry, concurrency=2, batch=1, poll_interval=0.05):
        assert started.wait(60)
        with engine.connect() as conn, conn.begin():
            # the worker's next claim waits on this lock, past the handler's deadline
            conn.execute(text("LOCK TABLE sqla_queue.jobs IN EXCLUSIVE MODE"))
            time.sleep(1.0)
        wait_for(lambda: count_where(engine, f"id = {job_id} AND status = 'failed'"), timeout=60)

    (job,) = jobs_by_id(engine, [job_id]).values()
    assert "ran longer than its timeout of 0.2 s" in (job.last_error or "")


def test_a_queue_limited_to_two_never_runs_more_than_two_handlers_past_their_timeout(
    engine: Engine,
) -> None:
    make_queue(engine, "limited", concurrency=2)
    registry = Registry()
    executing = Executing()

    @registry.task(name="overruns", queue="limited", timeout=0.3, max_attempts=1)
    def overruns() -> None:
        with executing.one():
            time.sleep(1.2)

    ids = enqueue_jobs(engine, "overruns", 4, queue="limited")
    with WorkerThread(engine, registry, concurrency=8, batch=8, heartbeat=0.2):
        wait_for(lambda: count_where(engine, "status = 'failed'") == 4, timeout=60)

    assert executing.most == 2, "the queue's limit holds while handlers overrun"
    assert executing.returned == 4
    jobs = jobs_by_id(engine, ids).values()
    assert all("ran longer than its timeout of 0.3 s" in (j.last_error or "") for j in jobs)


@pytest.mark.slow
def test_a_worker_at_c2_never_runs_more_than_two_handlers_past_their_timeout(
    engine: Engine,
) -> None:
    registry = Registry()
    executing = Executing()

    @registry.task(name="overruns", timeout=0.3, max_attempts=1)
    def overruns() -> None:
        with executing.one():
            time.sleep(1.5)

    enqueue_jobs(engine, "overruns", 6)
    runner = WorkerThread(engine, registry, concurrency=2, batch=4)
    with runner:
        wait_for(lambda: count_where(engine, "status = 'failed'") == 6, timeout=60)

    assert executing.most == 2
    assert runner.stats is not None
    assert (runner.stats.timed_out, runner.stats.failed) == (6, 6)


def test_a_cancelled_running_job_keeps_its_queue_slot_until_its_handler_returns(
    engine: Engine,
) -> None:
    make_queue(engine, "single", concurrency=1)
    registry = Registry()
    release = threading.Event()
    executing = Executing()
    started: list[int] = []

    @registry.task(name="ignores_cancel", queue="single", pass_context=True)
    def ignores_cancel(ctx: object, n: int) -> None:
        with executing.one():
            started.append(n)
            if n == 1:
                release.wait(60)  # never looks at ctx.cancelled

    first, second = (
        enqueue_jobs(engine, "ignores_cancel", 1, queue="single", args={"n": n})[0] for n in (1, 2)
    )
    # two workers: the second one would take the slot the cancel seemed to free; poll-only
    # (no NOTIFY), so the holder hears of the cancel from its job heartbeat (every 5 s: a
    # 20 s lease, which a loaded keeper's late beats do not let expire, as 2 s did)
    # dead_after 60 s: under load the holder's late registration beat let its slot go
    config = {
        "concurrency": 4,
        "heartbeat": 0.2,
        "poll_interval": 0.05,
        "lease": 20,
        "dead_after": 60,
    }
    one, other = WorkerThread(engine, registry, **config), WorkerThread(engine, registry, **config)
    with one, other:
        try:
            wait_for(lambda: started == [1])
            with engine.begin() as conn:
                assert admin.cancel_jobs(conn, [first]) == {first: "running"}
            wait_for(  # the holder has heard of the cancel (its decision), then a while
                lambda: any(
                    j.ctx.cancelled for w in (one, other) for j in w.worker.board.find(first)
                )
            )
            time.sleep(1.0)
            assert started == [1], "no second handler while the cancelled one runs"
            (cancelled,) = jobs_by_id(engine, [first]).values()
            assert cancelled.status == "cancelled"
            assert cancelled.lease_expires_at is not None  # still holds the slot
            with engine.begin() as conn:  # nor may an admin command free it meanwhile
                assert admin.retry_jobs(conn, [first]) == {}
                assert admin.delete_jobs(conn, [first]) == {}
                admin.prune(conn, older_than=0, statuses=["cancelled"])
            assert count_where(engine, f"id = {first} AND status = 'cancelled'") == 1
        finally:
            release.set()
        wait_for(lambda: started == [1, 2])
        wait_for(lambda: count_where(engine, f"id = {second}") == 0)  # it succeeded

    assert executing.most == 1
    (cancelled,) = jobs_by_id(engine, [first]).values()
    assert (cancelled.status, cancelled.lease_expires_at) == ("cancelled", None)


def test_an_async_handler_that_swallows_its_cancel_keeps_its_slot(engine: Engine) -> None:
    registry = Registry()
    order: list[str] = []

    @registry.task(name="stubborn", timeout=0.2, max_attempts=1)
    async def stubborn() -> None:
        try:
            await asyncio.sleep(60)  # cancelled at its 0.2 s timeout, however late that comes
        except asyncio.CancelledError:  # swallowed: it goes on a while
            order.append("cancelled")
            await asyncio.sleep(0.6)
        order.append("stubborn returned")

    @registry.task(name="next")
    def next_() -> None:
        order.append("next ran")

    enqueue_jobs(engine, "stubborn", 1, priority=0)
    enqueue_jobs(engine, "next", 1, priority=1)
    with WorkerThread(engine, registry, concurrency=1, batch=1):
        wait_for(lambda: "next ran" in order)

    assert order == ["cancelled", "stubborn returned", "next ran"]
    (job,) = jobs_by_id(engine).values()
    assert job.status == "failed"
    assert "ran longer than its timeout of 0.2 s" in (job.last_error or "")


def test_a_handler_that_does_not_return_is_reported_by_doctor_metrics_and_the_log(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()
    release = threading.Event()

    @registry.task(name="hangs", timeout=0.2)
    def hangs() -> None:
        release.wait(60)  # bounded: the test sets it

    prom = CollectorRegistry()
    metrics = instrument(registry, prometheus_registry=prom, depth_interval=60)
    (job_id,) = enqueue_jobs(engine, "hangs", 1)
    # lease and dead_after 60 s: under load a late keeper beat got the worker recorded lost
    # and its held job requeued while the test read the report
    runner = WorkerThread(
        engine,
        registry,
        concurrency=1,
        heartbeat=0.2,
        lease=60,
        dead_after=60,
        shutdown_timeout=0.5,
    )
    try:
        with runner:
            finding = wait_for(
                lambda: (f := workers_finding(engine)).severity is Severity.warn and f, timeout=60
            )
            worker_id = runner.worker.config.worker_id
            assert f"job {job_id} of task hangs has overrun its timeout by" in finding.value
            assert f"its thread still runs on worker {worker_id}" in finding.value
            metrics.refresh(engine, worker_id)
            labels = {"queue": "default", "task": "hangs"}
            assert prom.get_sample_value("sqla_queue_worker_overrunning_handlers", labels) == 1
            longest = prom.get_sample_value("sqla_queue_worker_longest_overrun_seconds")
            assert longest is not None
            assert longest >= 1
            assert f"job {job_id} (hangs) has overrun its timeout by" in caplog.text
            with engine.connect() as conn:  # held and leased meanwhile
                status = conn.scalar(text(f"SELECT status FROM sqla_queue.jobs WHERE id={job_id}"))
            assert status == "running"
    finally:
        release.set()

    # stopped past its shutdown timeout: the job is written as decided (timed out, retried)
    assert runner.stats is not None
    assert (runner.stats.overran, runner.stats.retried) == (1, 1)
    (job,) = jobs_by_id(engine, [job_id]).values()
    assert (job.status, job.attempts) == ("queued", 1)
    assert "ran longer than its timeout of 0.2 s" in (job.last_error or "")


def test_a_sync_handler_that_returns_an_awaitable_is_awaited(engine: Engine) -> None:
    """Defect 6: a sync decorator around an `async def` handler."""
    done: list[str] = []

    async def real(n: int) -> None:
        await asyncio.sleep(0.01)
        done.append(f"awaited {n}")

    def plain_wrapper(n: int) -> Any:  # hides the coroutine function: only the result says
        return real(n)

    @functools.wraps(real)
    def wrapped(n: int) -> Any:
        return real(n)

    registry = Registry()
    plain = registry.task(name="plain")(plain_wrapper)
    registry.task(name="wrapped")(wrapped)
    enqueue_jobs(engine, "plain", 1, args={"n": 1})
    enqueue_jobs(engine, "wrapped", 1, args={"n": 2})
    run_until_empty(engine, registry)
    assert sorted(done) == ["awaited 1", "awaited 2"]
    assert registry["wrapped"].is_async  # detected at registration through functools.wraps
    assert not plain.is_async


def test_an_async_handlers_own_timeout_error_is_its_own(engine: Engine) -> None:
    """Defect 12: not reported as 'ran longer than its timeout of None s'."""
    registry = Registry()

    @registry.task(name="own_timeout", max_attempts=1)
    async def own_timeout() -> None:
        raise asyncio.TimeoutError("the API did not answer")

    (job_id,) = enqueue_jobs(engine, "own_timeout", 1)
    run_until_empty(engine, registry)
    error = jobs_by_id(engine)[job_id].last_error or ""
    assert "TimeoutError: the API did not answer" in error
    assert "ran longer than its timeout" not in error


def test_an_async_handler_that_blocks_the_loop_still_times_out_and_is_reported(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 12: blocking code in an async handler escapes neither its timeout nor the log.
    (Issue 20: its job keeps its slot, running, until the handler returns; then it fails.)"""
    registry = Registry()

    returned, release = threading.Event(), threading.Event()

    @registry.task(name="blocks", timeout=0.5, max_attempts=1)
    async def blocks() -> None:
        # blocks the loop until the test has seen both lines (60 s at most): a worker that
        # told it only on return would log after `returned`, however slow the machine
        release.wait(60)  # blocking the event loop is the point
        returned.set()

    (job_id,) = enqueue_jobs(engine, "blocks", 1)
    caplog.set_level(logging.WARNING, "sqla_queue")
    # dead_after 30 s: a loaded keeper's late beat must not get this worker recorded lost
    # (and its job reaped) while the test watches the blocked loop
    with WorkerThread(engine, registry, heartbeat=0.3, dead_after=30):
        wait_for(lambda: "timed out after 0.5s" in caplog.text, timeout=60)
        told_while_blocked = not returned.is_set()
        wait_for(lambda: "the event loop has not run" in caplog.text, timeout=60)
        assert count_where(engine, "status = 'running'") == 1  # its handler still blocks
        release.set()
        wait_for(lambda: count_where(engine, "status = 'failed'") == 1, timeout=60)
        failed_once_returned = returned.is_set()
    assert told_while_blocked  # told at its 0.5 s timeout, not when the handler returned
    assert failed_once_returned  # written once the handler returned
    assert "ran longer than its timeout of 0.5 s" in (jobs_by_id(engine)[job_id].last_error or "")


def test_a_blocked_event_loop_is_reported_by_doctor_until_it_runs_again(engine: Engine) -> None:
    """Defect 12: the worker records a blocked event loop in its registration; doctor
    names the worker (and clears it once the loop runs again)."""
    registry = Registry()
    release = threading.Event()

    @registry.task(name="blocks", max_attempts=1)
    async def blocks() -> None:
        release.wait(60)  # blocking the event loop is the point

    def workers_finding() -> Finding:
        (finding,) = [f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "workers"]
        return finding

    enqueue_jobs(engine, "blocks", 1)
    # dead_after 30 s: a loaded keeper's late beat must not get this worker recorded lost
    # (and its job reaped) while the test watches the blocked loop
    with WorkerThread(engine, registry, heartbeat=0.3, dead_after=30):
        blocked = wait_for(
            lambda: (f := workers_finding()).severity is Severity.warn and f, timeout=60
        )
        assert "event loop blocked in 1:" in blocked.value
        assert "asyncio.to_thread" in blocked.fix
        (worker,) = blocked.details["workers"]
        assert worker["loop_blocked_seconds"] >= 1.0
        release.set()
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0)
        wait_for(lambda: workers_finding().severity is Severity.ok, timeout=60)
