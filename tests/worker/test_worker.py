"""The worker: handlers, retries, order, pauses, NOTIFY wake-up, shutdown, retention, fencing."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from typing import Any

import pytest
from helpers.support import (
    WorkerThread,
    count_hot_where,
    count_where,
    database_clock,
    delay_chosen,
    enqueue_jobs,
    jobs_by_id,
    make_due,
    stall_and_reap,
    wait_for,
)
from sqlalchemy import Engine, create_engine, event, func, select, text
from sqlalchemy.orm import Session

from sqla_queue import (
    HistoryJob,
    JobContext,
    Registry,
    RetryPolicy,
    SchemaMissingError,
    admin,
    enqueue,
)
from sqla_queue.db import queries
from sqla_queue.doctor import DoctorOptions, Severity, diagnose
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig


def db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as conn:
        value = conn.scalar(select(func.now()))
    assert value is not None
    return value


def recorder(name: str = "t") -> tuple[Registry, list[Any]]:
    """A registry whose task `name` appends its one argument, `value`, to the returned list."""
    registry = Registry()
    seen: list[Any] = []
    registry.task(name=name)(lambda value: seen.append(value))
    return registry, seen


# -- handlers -------------------------------------------------------------------------------


def test_sync_and_async_handlers_receive_their_arguments(engine: Engine) -> None:
    registry = Registry()
    calls: list[tuple[str, Any]] = []

    @registry.task(name="sync")
    def sync_handler(to: str, queue: str) -> None:
        calls.append(("sync", (to, queue)))

    @registry.task(name="async")
    async def async_handler(n: int) -> None:
        await asyncio.sleep(0)
        calls.append(("async", n))

    with Session(engine) as session, session.begin():
        enqueue(session, "sync", {"to": "a@b.c", "queue": "not-an-option"})
        enqueue(session, "async", {"n": 3})

    stats = run_until_empty(engine, registry, WorkerConfig(concurrency=2, poll_only=True))

    assert sorted(calls) == [("async", 3), ("sync", ("a@b.c", "not-an-option"))]
    assert (stats.succeeded, stats.failed, stats.retried) == (2, 0, 0)
    assert count_where(engine, "true") == 0  # default retention deletes succeeded jobs


def test_pass_context_gives_job_id_attempt_queue_and_task(engine: Engine) -> None:
    registry = Registry()
    seen: list[tuple[int, str, str, int, bool]] = []

    @registry.task(name="ctx.sync", pass_context=True)
    def with_context(ctx: JobContext, x: int) -> None:
        seen.append((ctx.job_id, ctx.task, ctx.queue, ctx.attempt, ctx.heartbeat()))

    @registry.task(name="ctx.async", pass_context=True)
    async def async_with_context(ctx: JobContext, x: int) -> None:
        seen.append((ctx.job_id, ctx.task, ctx.queue, ctx.attempt, not ctx.cancelled))

    with engine.begin() as conn:
        admin.create_queue(conn, "ctx")
    with Session(engine) as session, session.begin():
        first = enqueue(session, "ctx.sync", {"x": 1}, queue="ctx")
        second = enqueue(session, "ctx.async", {"x": 2}, queue="ctx")
        session.flush()
        ids = first.id, second.id

    run_until_empty(engine, registry, WorkerConfig(concurrency=2, poll_only=True))

    assert sorted(seen) == [
        (ids[0], "ctx.sync", "ctx", 1, True),
        (ids[1], "ctx.async", "ctx", 1, True),
    ]


# -- failures -------------------------------------------------------------------------------


def test_failed_attempt_is_retried_later_then_failed_after_max_attempts(engine: Engine) -> None:
    registry = Registry()

    @registry.task(
        name="flaky",
        max_attempts=3,
        retry=RetryPolicy(base=10, factor=3, jitter=0),
        pass_context=True,
    )
    def flaky(ctx: JobContext) -> None:
        raise ValueError(f"boom on attempt {ctx.attempt}")

    (job_id,) = enqueue_jobs(engine, "flaky", 1)

    for attempt, delay in ((1, 10), (2, 30)):
        before = database_clock(engine)
        stats = run_until_empty(engine, registry)
        after = database_clock(engine)
        assert stats.retried == 1
        job = jobs_by_id(engine)[job_id]
        assert (job.status, job.attempts) == ("queued", attempt)
        assert delay in delay_chosen(engine, job_id, before, after)  # due later, not at once
        assert job.last_error is not None
        assert "Traceback (most recent call last)" in job.last_error
        assert f"ValueError: boom on attempt {attempt}" in job.last_error
        assert job.locked_by is None
        assert run_until_empty(engine, registry).claimed == 0  # not due yet
        make_due(engine)

    stats = run_until_empty(engine, registry)
    job = jobs_by_id(engine)[job_id]
    assert stats.failed == 1
    assert (job.status, job.attempts) == ("failed", 3)
    assert job.finished_at is not None
    assert "boom on attempt 3" in (job.last_error or "")


def test_job_max_attempts_overrides_the_task_default(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="broken", max_attempts=10)
    def broken() -> None:
        raise RuntimeError("always")

    enqueue_jobs(engine, "broken", 1, max_attempts=1)
    run_until_empty(engine, registry)
    (job,) = jobs_by_id(engine).values()
    assert (job.status, job.attempts) == ("failed", 1)


def test_retry_delay_grows_exponentially_within_its_jitter_and_cap() -> None:
    policy = RetryPolicy(base=2, factor=2, max_delay=100, jitter=0.25)
    for attempt, expected in ((1, 2), (2, 4), (3, 8), (6, 64), (7, 100), (1000, 100)):
        delays = [policy.delay(attempt) for _ in range(50)]
        assert all(expected * 0.75 <= d <= expected * 1.25 for d in delays), (attempt, delays)
    assert len({policy.delay(3) for _ in range(20)}) > 1  # jittered, not identical


def test_handler_timeout_records_a_timeout_error_and_retries(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="slow", timeout=0.2, retry=RetryPolicy(base=60, jitter=0))
    def slow() -> None:
        time.sleep(1.0)

    enqueue_jobs(engine, "slow", 1)
    stats = run_until_empty(engine, registry, WorkerConfig(concurrency=2, poll_only=True))
    (job,) = jobs_by_id(engine).values()
    assert stats.retried == 1
    assert (job.status, job.attempts) == ("queued", 1)
    assert "ran longer than its timeout of 0.2 s" in (job.last_error or "")


def test_a_task_the_worker_does_not_know_is_left_for_one_that_does_without_using_an_attempt(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling deploy: an old worker (here one serving every queue) takes jobs of a task
    of the new release. It puts them back, attempt refunded, logs the task once, and a
    worker that knows the task runs them, even with max_attempts=1."""
    registry, ran = recorder("known")
    with Session(engine) as session, session.begin():
        enqueue(session, "known", {"value": 1})
        new_ids = [enqueue(session, "new.task", {"value": n}, max_attempts=1) for n in (2, 3)]
        enqueue(session, "known", {"value": 4})
        session.flush()
        new = [job.id for job in new_ids]

    before = database_clock(engine)
    with caplog.at_level("ERROR", logger="sqla_queue.worker"):
        stats = run_until_empty(
            engine, registry, WorkerConfig(concurrency=1, batch=1, poll_only=True)
        )
    after = database_clock(engine)

    assert sorted(ran) == [1, 4]
    assert (stats.succeeded, stats.failed) == (2, 0)
    logged = [r.getMessage() for r in caplog.records if "new.task" in r.getMessage()]
    assert len(logged) == 1, logged  # once per task name, not once per job
    assert "unknown task 'new.task'" in logged[0]
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, status, attempts, max_attempts, last_error "
                "FROM sqla_queue.jobs WHERE id = ANY(:ids)"
            ),
            {"ids": new},
        ).all()
    # a loaded machine may outlast the first delay (1 s): the burst worker then defers the
    # job again; each deferral is counted in last_error and doubles the delay the worker chose
    deferrals = 0
    for row in rows:
        assert (row.status, row.attempts, row.max_attempts) == ("queued", 0, 1)
        times = int(row.last_error.split(" ", 2)[1])
        deferrals += times
        assert row.last_error.startswith(
            f"deferred {times} time(s): unknown task 'new.task' on worker"
        )
        assert 2.0 ** (times - 1) in delay_chosen(engine, row.id, before, after)
    assert stats.deferred == deferrals >= 2

    waiting = {f.name: f for f in diagnose(engine, DoctorOptions(sample=0))}["unknown_tasks"]
    assert waiting.severity is Severity.warn
    assert "2 jobs of task 'new.task' waiting for a worker that knows it" in waiting.value

    with engine.begin() as conn:  # due now, not in a second
        conn.execute(text("UPDATE sqla_queue.jobs SET run_at = now()"))
    knowing = Registry()
    attempts: list[int] = []

    @knowing.task(name="new.task", pass_context=True)
    def new_task(ctx: JobContext, value: int) -> None:
        attempts.append(ctx.attempt)

    stats = run_until_empty(engine, knowing)
    assert (stats.succeeded, stats.failed, attempts) == (2, 0, [1, 1])
    assert jobs_by_id(engine) == {}
    waiting = {f.name: f for f in diagnose(engine, DoctorOptions(sample=0))}["unknown_tasks"]
    assert waiting.severity is Severity.ok


def test_a_job_no_worker_knows_is_put_back_later_each_time_never_hot(engine: Engine) -> None:
    registry, _ = recorder("known")
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "gone.task", {}, flush=True).id
    for delay in (1, 2, 4, 8):  # doubled at each deferral, as the finishing statement chose
        with engine.begin() as conn:
            conn.execute(text("UPDATE sqla_queue.jobs SET run_at = now()"))
        before = database_clock(engine)
        run_until_empty(engine, registry)
        after = database_clock(engine)
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT attempts, last_error FROM sqla_queue.jobs WHERE id = :id"),
                {"id": job_id},
            ).one()
        assert row.attempts == 0
        assert delay in delay_chosen(engine, job_id, before, after)
    assert row.last_error.startswith("deferred 4 time(s): unknown task 'gone.task'")
    with engine.begin() as conn:  # after many deferrals: every 5 minutes at most
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET run_at = now(), "
                "last_error = replace(last_error, 'deferred 4 ', 'deferred 40 ')"
            )
        )
    before = database_clock(engine)
    run_until_empty(engine, registry)
    after = database_clock(engine)
    with engine.connect() as conn:
        error = conn.execute(
            text("SELECT last_error FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    assert error.startswith("deferred 41 time(s): ")
    assert 300 in delay_chosen(engine, job_id, before, after)


def test_worker_refuses_a_database_without_the_schema(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    try:
        with pytest.raises(SchemaMissingError, match="sqla-queue migrate"):
            run_until_empty(engine, Registry())
    finally:
        engine.dispose()


# -- what is claimed, and in which order ------------------------------------------------------


def test_scheduled_jobs_wait_for_their_run_at(engine: Engine) -> None:
    registry, ran = recorder()
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {"value": "past"}, run_at=past)
        enqueue(session, "t", {"value": "future"}, run_at=future)
        enqueue(session, "t", {"value": "delayed"}, delay=3600)
        enqueue(session, "t", {"value": "now"})

    run_until_empty(engine, registry)

    assert sorted(ran) == ["now", "past"]
    assert count_where(engine, "status = 'queued' AND attempts = 0") == 2


@pytest.mark.parametrize("batch", [1, 10])
def test_lower_priority_number_runs_first(engine: Engine, batch: int) -> None:
    registry, order = recorder()
    priorities = [5, 0, 3, 3, 1, 7, 0, 2]
    with Session(engine) as session, session.begin():
        for p in priorities:
            enqueue(session, "t", {"value": p}, priority=p)

    run_until_empty(engine, registry, WorkerConfig(concurrency=1, batch=batch, poll_only=True))

    assert order == sorted(priorities)


def test_paused_queue_is_not_claimed_until_resumed(engine: Engine) -> None:
    registry, ran = recorder()
    with Session(engine) as session, session.begin():
        admin.create_queue(session, "reports")
        admin.set_paused(session, "reports", True)
        enqueue(session, "t", {"value": "reports"}, queue="reports")
        enqueue(session, "t", {"value": "default"})

    run_until_empty(engine, registry)
    run_until_empty(engine, registry, WorkerConfig(queues=["reports"], poll_only=True))
    assert ran == ["default"]
    assert count_where(engine, "queue = 'reports' AND status = 'queued' AND attempts = 0") == 1

    with engine.begin() as conn:
        admin.set_paused(conn, "reports", False)
    run_until_empty(engine, registry)
    assert ran == ["default", "reports"]


def test_worker_claims_only_from_its_queues(engine: Engine) -> None:
    registry, ran = recorder()
    with Session(engine) as session, session.begin():
        admin.create_queue(session, "emails")
        enqueue(session, "t", {"value": "emails"}, queue="emails")
        enqueue(session, "t", {"value": "default"})

    run_until_empty(engine, registry, WorkerConfig(queues=["emails"], poll_only=True))
    assert ran == ["emails"]


def test_a_single_queue_name_is_one_queue_not_a_sequence_of_letters(engine: Engine) -> None:
    registry, ran = recorder()
    with Session(engine) as session, session.begin():
        admin.create_queue(session, "emails")
        enqueue(session, "t", {"value": "emails"}, queue="emails")

    run_until_empty(engine, registry, WorkerConfig(queues="emails", poll_only=True))
    assert ran == ["emails"]


# -- waking up --------------------------------------------------------------------------------


def test_notify_wakes_an_idle_worker_long_before_its_poll_interval(engine: Engine) -> None:
    """Each claim that finds less than it asked for doubles the poll backoff (towards the
    poll interval, an hour here), so a worker that only polled would wait about as long
    as it had been idle: 0.3, 0.05, 2.9, 12.5, 30 s for the first five jobs with a 30 s
    interval, twice as long for each next one. Only NOTIFY delivers all eight before the
    deadline, which guards against that wait and measures nothing (a loaded machine may
    take seconds per job; a worker that polls, minutes)."""
    registry = Registry()
    done: dict[int, float] = {}

    @registry.task(name="wake")
    def wake(n: int) -> None:
        done[n] = time.monotonic()

    def listening() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                    )
                )
            )

    with WorkerThread(engine, registry, poll_interval=3600, poll_only=False, concurrency=1):
        wait_for(listening)
        time.sleep(1.0)  # idle: the polling backoff has grown past a second
        latencies = []
        for n in range(8):
            with Session(engine) as session, session.begin():
                enqueue(session, "wake", {"n": n})
            committed = time.monotonic()
            wait_for(lambda n=n: n in done, timeout=60, interval=0.01)
            latencies.append(done[n] - committed)
            time.sleep(0.3)
    assert sorted(done) == list(range(8))
    print(f"\ncommit to handler, s: {[round(x, 3) for x in latencies]}")


# -- shutdown --------------------------------------------------------------------------------


class Gate:
    """A handler that holds its job until released (or until the worker gives the job up)."""

    def __init__(self, registry: Registry) -> None:
        self.release = threading.Event()
        self.started: list[int] = []
        self.saw_cancel: list[int] = []
        self.finished: list[int] = []

        @registry.task(name="gate", pass_context=True)
        def gate(ctx: JobContext) -> None:
            self.started.append(ctx.job_id)
            deadline = time.monotonic() + 30  # past any stop's wait: finishing is the defect
            while not self.release.is_set() and time.monotonic() < deadline:
                if ctx.cancelled:
                    self.saw_cancel.append(ctx.job_id)
                    return
                time.sleep(0.02)
            self.finished.append(ctx.job_id)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_stop_returns_unfinished_jobs_to_queued(engine: Engine, concurrency: int) -> None:
    registry = Registry()
    gate = Gate(registry)
    ids = enqueue_jobs(engine, "gate", 5)

    runner = WorkerThread(engine, registry, concurrency=concurrency, batch=3, shutdown_timeout=0.3)
    with runner:
        wait_for(lambda: len(gate.started) == concurrency)
        held = min(concurrency + 2, 3)  # claims up to concurrency + batch - 1, batch at a time
        wait_for(lambda: count_where(engine, "status = 'running'") == held)
        stats = runner.stop()  # a worker that waited for the gate would append to finished

    jobs = jobs_by_id(engine, ids)
    assert {j.status for j in jobs.values()} == {"queued"}
    assert {j.locked_by for j in jobs.values()} == {None}
    # Interrupted handlers keep their attempt; held but unstarted jobs get theirs back.
    attempts = sorted(j.attempts for j in jobs.values())
    assert attempts == [0] * (5 - concurrency) + [1] * concurrency
    assert {j.id for j in jobs.values() if j.attempts == 1} == set(gate.started)
    assert stats.released == held
    wait_for(lambda: sorted(gate.saw_cancel) == sorted(gate.started))  # told to give up
    assert gate.finished == []


def test_stop_cancels_async_handlers_past_the_timeout_and_requeues_their_jobs(
    engine: Engine,
) -> None:
    registry = Registry()
    started: list[int] = []
    cancelled: list[int] = []

    @registry.task(name="sleeps", pass_context=True)
    async def sleeps(ctx: JobContext) -> None:
        started.append(ctx.job_id)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(ctx.job_id)  # a chance to clean up, not a silent drop
            raise

    ids = enqueue_jobs(engine, "sleeps", 3)
    runner = WorkerThread(engine, registry, concurrency=2, batch=1, shutdown_timeout=0.3)
    with runner:
        wait_for(lambda: len(started) == 2)
        stats = runner.stop()  # one that waited for the sleeps would mark their jobs done

    jobs = jobs_by_id(engine, ids)
    assert {(j.status, j.locked_by) for j in jobs.values()} == {("queued", None)}
    assert sorted(j.attempts for j in jobs.values()) == [0, 1, 1]
    assert stats.released == 2
    assert sorted(cancelled) == sorted(started)


def test_stop_lets_in_flight_jobs_finish_within_the_shutdown_timeout(engine: Engine) -> None:
    registry = Registry()
    gate = Gate(registry)
    enqueue_jobs(engine, "gate", 4)

    runner = WorkerThread(engine, registry, concurrency=2, batch=1, shutdown_timeout=10)
    with runner:
        wait_for(lambda: len(gate.started) == 2)
        stopper = threading.Thread(target=runner.stop)
        stopper.start()
        time.sleep(0.2)
        gate.release.set()
        stopper.join(60)

    assert sorted(gate.finished) == sorted(gate.started)
    assert count_where(engine, "true") == 2  # the two finished jobs were deleted
    assert count_where(engine, "status = 'queued' AND attempts = 0") == 2


# -- retention --------------------------------------------------------------------------------


@pytest.mark.parametrize("retention", ["keep", "delete", "archive"])
def test_succeeded_job_is_kept_deleted_or_archived_per_queue(
    engine: Engine, retention: str
) -> None:
    registry = Registry()
    registry.task(name="ok")(lambda a: None)
    with Session(engine) as session, session.begin():
        admin.create_queue(session, "q", retention)
    with Session(engine) as session, session.begin():
        job = enqueue(session, "ok", {"a": 1}, queue="q")
        session.flush()
        job_id = job.id

    assert run_until_empty(engine, registry).succeeded == 1

    kept = jobs_by_id(engine)
    with Session(engine) as session:
        archived = session.scalars(select(HistoryJob).where(HistoryJob.id == job_id)).first()
        archived_row = archived and (
            archived.status,
            archived.task,
            archived.args,
            archived.attempts,
        )
    if retention == "delete":
        assert kept == {}
        assert archived_row is None
    else:  # keep and archive: moved to the history, out of the hot table
        assert (kept[job_id].status, kept[job_id].attempts) == ("done", 1)
        assert kept[job_id].finished_at is not None
        assert archived_row == ("done", "ok", {"a": 1}, 1)
        assert count_hot_where(engine, "true") == 0


def test_prune_deletes_kept_jobs_older_than_the_cutoff(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="ok")(lambda: None)
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    enqueue_jobs(engine, "ok", 3)
    run_until_empty(engine, registry)
    assert count_hot_where(engine, "true") == 0  # the kept jobs are in the history
    with engine.begin() as conn:
        assert admin.prune(conn, 3600) == 0
        conn.execute(
            text("UPDATE sqla_queue.jobs_history SET finished_at = now() - interval '2 hours'")
        )
        assert admin.prune(conn, 3600) == 3
    assert count_where(engine, "true") == 0


# -- liveness: fencing and the reaper ---------------------------------------------------------


@pytest.mark.parametrize("outcome", ["succeed", "raise", "raise on the last attempt"])
def test_late_outcome_of_a_reaped_job_changes_nothing(engine: Engine, outcome: str) -> None:
    registry = Registry()
    release = threading.Event()
    started = threading.Event()

    @registry.task(name="stalls")
    def stalls() -> None:
        started.set()
        release.wait(60)
        if outcome != "succeed":
            raise RuntimeError("late failure")

    max_attempts = 1 if outcome == "raise on the last attempt" else 5
    (job_id,) = enqueue_jobs(engine, "stalls", 1, max_attempts=max_attempts)
    last_attempt = outcome == "raise on the last attempt"
    with WorkerThread(engine, registry, concurrency=2) as runner:
        assert started.wait(60)
        # On its last attempt the reaper fails the job itself; otherwise another worker
        # claims attempt 2.
        assert stall_and_reap(engine) == (0 if last_attempt else 2)
        release.set()
        stats = runner.worker.stats
        wait_for(lambda: stats.succeeded + stats.retried + stats.failed == 1)

    job = jobs_by_id(engine)[job_id]
    if last_attempt:
        assert (job.status, job.attempts, job.locked_by) == ("failed", 1, None)
        assert "stopped heartbeating during attempt 1, the last of 1" in (job.last_error or "")
    else:
        assert (job.status, job.attempts, job.locked_by) == ("running", 2, "successor")
        assert job.finished_at is None
    assert "late failure" not in (job.last_error or "")


@pytest.mark.parametrize(
    ("started", "max_attempts", "outcome", "attempts"),
    [
        (True, None, "done", [2]),  # it ran: the next run is attempt 2
        (True, 1, "failed", []),  # it ran its last attempt: failed by the reaper itself
        (False, 1, "done", [2]),  # never started: the attempt is refunded (defect 10)
    ],
)
def test_reaper_requeues_a_job_whose_lease_expired(
    engine: Engine, started: bool, max_attempts: int | None, outcome: str, attempts: list[int]
) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="orphan", pass_context=True)
    def orphan(ctx: JobContext) -> None:
        ran.append(ctx.attempt)

    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (job_id,) = enqueue_jobs(engine, "orphan", 1, max_attempts=max_attempts)
    with engine.begin() as conn:
        conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "dead-worker"})
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET lease_expires_at = now() - interval '1 second', "
                "started_at = CASE WHEN :started THEN now() END"
            ),
            {"started": started},
        )

    with WorkerThread(engine, registry, poll_only=False) as runner:
        wait_for(lambda: count_where(engine, f"status = '{outcome}'") == 1)
        # counted just after the reap commits (autocommit): a poll can see the row first
        wait_for(lambda: runner.worker.stats.reaped >= 1)
        assert runner.worker.stats.reaped == 1

    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts) == (outcome, attempts[-1] if attempts else 1)
    assert ran == attempts
    if not started:  # the attempt number still grows (fencing); the budget grew with it
        assert job.max_attempts == 2
        assert "lease expired before its handler started" in (job.last_error or "")
    elif outcome == "failed":
        assert "dead-worker stopped heartbeating during attempt 1, the last of 1" in (
            job.last_error or ""
        )
    else:
        assert "dead-worker stopped heartbeating" in (job.last_error or "")


def test_heartbeats_keep_a_long_job_from_being_reaped(engine: Engine) -> None:
    registry = Registry()
    attempts: list[int] = []

    @registry.task(name="long", pass_context=True)
    def long(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        time.sleep(3.2)  # three leases

    enqueue_jobs(engine, "long", 1)
    with WorkerThread(engine, registry, lease=1, concurrency=2) as runner:
        wait_for(lambda: count_where(engine, "true") == 0)
        assert runner.worker.stats.reaped == 0
    assert attempts == [1]


@pytest.mark.parametrize("retention", ["keep", "archive"])
def test_every_finished_job_that_ran_records_when_it_started(
    engine: Engine, retention: str
) -> None:
    """A job that ran without a heartbeat (quicker than one) still shows when it started."""
    registry = Registry()

    @registry.task(name="quick")
    def quick() -> None:
        pass

    @registry.task(name="kept", keep_result=True)
    def kept() -> int:
        return 1

    @registry.task(name="broken", max_attempts=1)
    def broken() -> None:
        raise RuntimeError("no")

    with engine.begin() as conn:
        admin.set_retention(conn, "default", retention)
    ids = [enqueue_jobs(engine, name, 1)[0] for name in ("quick", "kept", "broken")]
    run_until_empty(engine, registry)
    with engine.connect() as conn:
        jobs = [admin.get_job(conn, job_id) for job_id in ids]
    for job in jobs:
        assert job is not None
        assert job.finished_at is not None
        assert job.started_at is not None, f"job {job.task} ({job.status}) has no start"
        assert job.created_at <= job.started_at <= job.finished_at
    assert [job.status for job in jobs] == ["done", "done", "failed"]


def test_a_burst_until_empty_runs_a_job_that_fell_due_between_its_claim_and_its_look_ahead(
    engine: Engine,
) -> None:
    """Race, held on purpose: the job falls due after a claim that saw it not yet due and
    during the burst's read of what is due later. That read once came after the claim and
    counted jobs by a window of the worker's own clock, which missed this one whenever the
    other transaction took longer than the claim had (stop 43's CI and the next stop's:
    "0 succeeded"); now the read comes first and the claim after it sees the job due."""
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="later", pass_context=True)
    def later(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    (job_id,) = enqueue_jobs(engine, "later", 1, delay=3600)
    fell_due: list[bool] = []

    def fall_due(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "min(sqla_queue.jobs.run_at)" in statement and not fell_due:
            fell_due.append(True)  # the claim before saw it an hour ahead; the hour passes
            with engine.begin() as other:
                # a slow transaction: the job falls due at its start, 0.3 s before the read
                # (a window the read after the claim could not see; with the read first,
                # the claim after it sees the job due however long this takes)
                other.execute(text("SELECT pg_sleep(0.3)"))
                other.execute(
                    text("UPDATE sqla_queue.jobs SET run_at = now() WHERE id = :id"),
                    {"id": job_id},
                )

    event.listen(engine, "before_cursor_execute", fall_due)
    try:
        config = WorkerConfig(
            concurrency=1, batch=1, poll_only=True, burst=True, burst_until_empty=True
        )
        result: list[Any] = []
        thread = threading.Thread(
            target=lambda: result.append(run_until_empty(engine, registry, config)), daemon=True
        )
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "the burst worker did not exit within 60 s"
    finally:
        event.remove(engine, "before_cursor_execute", fall_due)

    assert fell_due == [True]
    assert ran == [job_id]
    (stats,) = result
    assert (stats.succeeded, stats.not_yet_due) == (1, 0)
    assert count_hot_where(engine, f"id = {job_id}") == 0
