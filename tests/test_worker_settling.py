"""The defects a review found in the worker (issue 8, section 3), one test each."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import Any

import pytest
from apps.support import WorkerThread, count_where, enqueue_jobs, jobs_by_id, wait_for
from sqlalchemy import Engine, create_engine, text

from sqla_queue import JobContext, Registry, RetryPolicy, WorkerConfig, admin, queries
from sqla_queue.doctor import DoctorOptions, Finding, Severity, diagnose
from sqla_queue.testing import run_until_empty

NO_WAIT = RetryPolicy(base=0, jitter=0)


def test_a_job_reclaimed_by_the_same_worker_keeps_its_new_attempt_alive(engine: Engine) -> None:
    """Defect 1: the old attempt's late finish must not drop the new attempt's entry."""
    registry = Registry()
    started: list[int] = []

    @registry.task(name="slow", pass_context=True, retry=NO_WAIT)
    def slow(ctx: JobContext) -> None:
        started.append(ctx.attempt)
        time.sleep(3 if ctx.attempt == 1 else 4)  # each longer than the 1 s lease

    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (job_id,) = enqueue_jobs(engine, "slow", 1)
    with WorkerThread(engine, registry, lease=1, concurrency=2, poll_only=False) as runner:
        wait_for(lambda: started == [1])
        with engine.begin() as conn:  # reaped from outside while attempt 1 runs
            conn.execute(
                text(
                    "UPDATE sqla_queue.jobs SET started_at = now(), "
                    "lease_expires_at = now() - interval '1 second'"
                )
            )
            assert len(conn.execute(queries.reap_stale_jobs()).all()) == 1
        # The same worker claims attempt 2; attempt 1 finishes (fenced off) meanwhile.
        wait_for(lambda: count_where(engine, "status = 'done'") == 1, timeout=20)
        reaped_by_worker = runner.worker.stats.reaped
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts) == ("done", 2)
    assert started == [1, 2]
    assert reaped_by_worker == 0  # attempt 2 kept its heartbeats


def _insert_raw_job(engine: Engine, args_sql: str) -> int:
    with engine.begin() as conn:
        return int(
            conn.scalar(
                text(
                    "INSERT INTO sqla_queue.jobs (task, args) "
                    f"VALUES ('t', ({args_sql})::jsonb) RETURNING id"
                )
            )
        )


def test_poison_args_fail_only_their_own_job(engine: Engine) -> None:
    """Defect 2: args that cannot be decoded fail that job; the batch's others run."""
    registry = Registry()
    ran: list[int] = []
    registry.task(name="t")(lambda n=0, **_: ran.append(n))
    deep = _insert_raw_job(engine, "'{\"a\": ' || repeat('[', 5000) || repeat(']', 5000) || '}'")
    huge = _insert_raw_job(engine, "'{\"n\": ' || repeat('9', 5000) || '}'")
    good = enqueue_jobs(engine, "t", 3, args={"n": 1})

    stats = run_until_empty(engine, registry, WorkerConfig(batch=10, poll_only=True))

    assert ran == [1, 1, 1]
    assert stats.succeeded == len(good)
    with engine.connect() as conn:  # not through Job: the ORM would decode the args too
        rows = conn.execute(text("SELECT id, status, last_error FROM sqla_queue.jobs"))
        poison = {row.id: (row.status, row.last_error) for row in rows}
    assert set(poison) == {deep, huge}
    assert poison[deep][0] == poison[huge][0] == "failed"
    assert "args cannot be decoded (RecursionError" in poison[deep][1]
    assert "args cannot be decoded (ValueError" in poison[huge][1]


def test_attempts_beyond_max_attempts_are_failed_by_the_claim_itself(engine: Engine) -> None:
    """Defect 2: a queued job already at its max_attempts never runs again."""
    (job_id,) = enqueue_jobs(engine, "t", 1, max_attempts=2)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET attempts = 2"))
        rows = conn.execute(queries.claim_jobs(None), {"limit": 5, "worker_id": "w"}).all()
    assert [row.status for row in rows] == ["failed"]
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts) == ("failed", 3)
    assert "attempt 3 exceeds max_attempts 2" in (job.last_error or "")


def test_an_error_text_postgres_cannot_store_is_cleaned_not_fatal(engine: Engine) -> None:
    """Defect 3: a NUL or a lone surrogate in an exception's text."""
    registry = Registry()

    @registry.task(name="nul", max_attempts=1)
    def nul() -> None:
        raise ValueError("before\x00after \udc80 end")

    registry.task(name="ok")(lambda: None)
    (bad,) = enqueue_jobs(engine, "nul", 1)
    enqueue_jobs(engine, "ok", 2)
    stats = run_until_empty(engine, registry, WorkerConfig(batch=10, poll_only=True))
    assert (stats.succeeded, stats.failed) == (2, 1)
    error = jobs_by_id(engine)[bad].last_error or ""
    assert "before\\x00after \\udc80 end" in error


def test_a_job_already_in_the_archive_is_finished_without_a_duplicate_key(engine: Engine) -> None:
    """Defect 3: archiving an id the archive already holds changes nothing, crashes nothing."""
    registry = Registry()
    registry.task(name="ok")(lambda: None)
    with engine.begin() as conn:
        admin.create_queue(conn, "arch", "archive")
    ids = enqueue_jobs(engine, "ok", 3, queue="arch")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs_archive (id, queue, task, args, status, priority, "
                "run_at, attempts, created_at) "
                "VALUES (:id, 'arch', 'old', '{}', 'done', 0, now(), 1, now())"
            ),
            {"id": ids[0]},
        )
    stats = run_until_empty(engine, registry, WorkerConfig(batch=10, poll_only=True))
    assert stats.succeeded == 3
    assert count_where(engine, "true") == 0
    with engine.connect() as conn:
        tasks = conn.execute(text("SELECT id, task FROM sqla_queue.jobs_archive ORDER BY id"))
        assert tasks.all() == [(ids[0], "old"), (ids[1], "ok"), (ids[2], "ok")]


def test_one_locked_row_does_not_stop_the_heartbeats_of_the_others(engine: Engine) -> None:
    """Defect 4: a cancel left open in another transaction for longer than the lease."""
    registry = Registry()
    runs: list[tuple[int, int]] = []

    @registry.task(name="work", pass_context=True, retry=NO_WAIT)
    def work(ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and not ctx.cancelled:
            time.sleep(0.05)

    locked, *healthy = enqueue_jobs(engine, "work", 4)
    with WorkerThread(engine, registry, lease=1, concurrency=4) as runner:
        wait_for(lambda: len(runs) == 4)
        with engine.begin() as conn:  # a cancel, left open for three leases
            admin.cancel_jobs(conn, [locked])
            time.sleep(3)
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0, timeout=20)
        reaped = runner.worker.stats.reaped
    assert sorted(runs) == sorted([(locked, 1)] + [(job_id, 1) for job_id in healthy])
    assert reaped == 0
    assert jobs_by_id(engine)[locked].status == "cancelled"


def test_a_handlers_own_heartbeat_on_a_row_locked_elsewhere_is_not_a_lost_job(
    engine: Engine,
) -> None:
    """The handler's `ctx.heartbeat()` meets its row locked at that instant (the keeper's
    own beat, a cancel being decided): the job is still its own, not lost."""
    registry = Registry()
    beats: list[bool] = []
    started = threading.Event()
    locked = threading.Event()

    @registry.task(name="beat", pass_context=True)
    def beat(ctx: JobContext) -> None:
        started.set()
        assert locked.wait(10)
        beats.append(ctx.heartbeat())
        beats.append(ctx.cancelled)

    (job_id,) = enqueue_jobs(engine, "beat", 1)
    with WorkerThread(engine, registry, lease=60, concurrency=1) as runner:
        assert started.wait(10)
        with engine.begin() as conn:  # another session holds the row while the handler beats
            conn.execute(
                text("SELECT id FROM sqla_queue.jobs WHERE id = :id FOR UPDATE"), {"id": job_id}
            )
            locked.set()
            wait_for(lambda: len(beats) == 2)
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0)
        # The worker counts a success once its statement has returned: wait for the count.
        succeeded = wait_for(lambda: runner.worker.stats.succeeded or None)
    assert beats == [True, False]  # still ours, and not cancelled
    assert succeeded == 1


def test_a_raising_retry_policy_still_settles_the_job(engine: Engine) -> None:
    """Defect 5: the backoff computation raises; the job is retried, not wedged."""

    class Broken(RetryPolicy):
        def delay(self, attempt: int) -> float:
            raise ZeroDivisionError("bad policy")

    registry = Registry()

    @registry.task(name="flaky", retry=Broken())
    def flaky() -> None:
        raise RuntimeError("handler failed")

    (job_id,) = enqueue_jobs(engine, "flaky", 1)
    stats = run_until_empty(engine, registry)
    job = jobs_by_id(engine)[job_id]
    assert stats.retried == 1
    assert (job.status, job.attempts) == ("queued", 1)  # with the default backoff
    assert "handler failed" in (job.last_error or "")


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


@pytest.mark.parametrize("poll_only", [False, True])
def test_a_cancelled_job_that_was_claimed_but_not_started_never_runs(
    engine: Engine, poll_only: bool
) -> None:
    """Defect 7: NOTIFY tells the worker at once; without it, a check before starting."""
    registry = Registry()
    gate = threading.Event()
    ran: list[int] = []

    @registry.task(name="g", pass_context=True)
    def g(ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        gate.wait(10)

    first, *waiting = enqueue_jobs(engine, "g", 4)
    with WorkerThread(engine, registry, concurrency=1, batch=4, poll_only=poll_only):
        wait_for(lambda: ran == [first])
        wait_for(lambda: count_where(engine, "status = 'running'") == 4)  # all held here
        with engine.begin() as conn:
            assert admin.cancel_jobs(conn, waiting[:2]) == dict.fromkeys(waiting[:2], "running")
        time.sleep(1.2 if poll_only else 0.3)
        gate.set()
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0)
    assert ran == [first, waiting[2]]
    assert {jobs_by_id(engine)[i].status for i in waiting[:2]} == {"cancelled"}


def test_a_retention_change_is_honoured_at_once(engine: Engine) -> None:
    """Defect 9: no cached map of queue retention."""
    registry = Registry()
    registry.task(name="ok")(lambda: None)
    with engine.begin() as conn:
        admin.create_queue(conn, "q")
    with WorkerThread(engine, registry, poll_interval=0.1):
        time.sleep(0.5)  # the worker is running before the change
        with engine.begin() as conn:
            admin.set_retention(conn, "q", "keep")
        (job_id,) = enqueue_jobs(engine, "ok", 1, queue="q")
        wait_for(lambda: count_where(engine, "status = 'done'") == 1, timeout=5)
    assert jobs_by_id(engine)[job_id].status == "done"


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

    @registry.task(name="blocks", timeout=0.5, max_attempts=1)
    async def blocks() -> None:
        time.sleep(4)  # noqa: ASYNC251 -- blocking the event loop is the point

    (job_id,) = enqueue_jobs(engine, "blocks", 1)
    caplog.set_level(logging.WARNING, "sqla_queue")
    started = time.monotonic()
    with WorkerThread(engine, registry, heartbeat=0.3, dead_after=2):
        wait_for(lambda: "timed out after 0.5s" in caplog.text, timeout=10)
        timed_out_after = time.monotonic() - started
        wait_for(lambda: "the event loop has not run" in caplog.text, timeout=10)
        assert count_where(engine, "status = 'running'") == 1  # its handler still blocks
        wait_for(lambda: count_where(engine, "status = 'failed'") == 1, timeout=10)
        failed_after = time.monotonic() - started
    assert timed_out_after < 3.5  # told at its 0.5 s timeout
    assert failed_after >= 4  # written once the handler returned
    assert "ran longer than its timeout of 0.5 s" in (jobs_by_id(engine)[job_id].last_error or "")


def test_a_blocked_event_loop_is_reported_by_doctor_until_it_runs_again(engine: Engine) -> None:
    """Defect 12: the worker records a blocked event loop in its registration; doctor
    names the worker (and clears it once the loop runs again)."""
    registry = Registry()
    release = threading.Event()

    @registry.task(name="blocks", max_attempts=1)
    async def blocks() -> None:
        release.wait(20)  # blocking the event loop is the point

    def workers_finding() -> Finding:
        (finding,) = [f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "workers"]
        return finding

    enqueue_jobs(engine, "blocks", 1)
    with WorkerThread(engine, registry, heartbeat=0.3, dead_after=2):
        blocked = wait_for(
            lambda: (f := workers_finding()).severity is Severity.warn and f, timeout=10
        )
        assert "event loop blocked in 1:" in blocked.value
        assert "asyncio.to_thread" in blocked.fix
        (worker,) = blocked.details["workers"]
        assert worker["loop_blocked_seconds"] >= 1.0
        release.set()
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0)
        wait_for(lambda: workers_finding().severity is Severity.ok, timeout=10)


def test_a_statement_error_is_waited_out_with_backoff_and_logged_once(
    database_url: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 12: a lock timeout is not a lost connection: backoff, one warning."""
    registry = Registry()
    ran: list[int] = []
    registry.task(name="t")(lambda: ran.append(1))
    impatient = create_engine(database_url, connect_args={"options": "-c lock_timeout=50"})
    caplog.set_level(logging.WARNING, "sqla_queue")
    try:
        with engine.connect() as blocker:
            blocker.execute(text("LOCK TABLE sqla_queue.jobs IN ACCESS EXCLUSIVE MODE"))
            runner = WorkerThread(impatient, registry, poll_interval=0.1)
            with runner:
                time.sleep(3)  # every claim meanwhile hits the lock timeout
                blocker.rollback()
                enqueue_jobs(engine, "t", 1)
                wait_for(lambda: ran == [1])
    finally:
        impatient.dispose()
    warnings = [r.getMessage() for r in caplog.records if "lock timeout" in r.getMessage()]
    # One from the claim loop, at most one from the keeper and one from the first claim's
    # statistics check (its ANALYZE waits on the same lock): not one per attempt.
    assert len([w for w in warnings if w.startswith("database error")]) == 1, warnings
    assert len([w for w in warnings if w.startswith("could not refresh")]) <= 1, warnings
    assert len(warnings) <= 3, warnings
    assert "reconnecting" not in caplog.text
    assert "database reachable again" in caplog.text


def test_each_retry_is_a_warning_and_each_final_failure_an_error_and_a_storm_is_summarised(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.task(name="fails", max_attempts=2, retry=RetryPolicy(base=3600, jitter=0))
    def fails() -> None:
        raise KeyError("missing")

    caplog.set_level(logging.WARNING, "sqla_queue.worker")
    ids = enqueue_jobs(engine, "fails", 25)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET attempts = 1 WHERE id = :id"), {"id": ids[0]})
    run_until_empty(engine, registry, WorkerConfig(batch=25, concurrency=1, poll_only=True))

    failures = [
        r for r in caplog.records if "fails" in r.getMessage() and "attempt" in r.getMessage()
    ]
    final = [r for r in failures if r.levelno == logging.ERROR]
    retries = [r for r in failures if r.levelno == logging.WARNING]
    assert len(final) == 1
    assert f"job {ids[0]} (fails) failed for good on attempt 2 of 2" in final[0].getMessage()
    assert "KeyError: 'missing'" in final[0].getMessage()
    assert "Traceback (most recent call last)" in final[0].getMessage()
    assert len(retries) == 9  # ten per task per window with a traceback, the rest counted
    assert "attempt 1 of 2 failed (KeyError: 'missing'); retrying in 3600.0 s" in (
        retries[0].getMessage()
    )
