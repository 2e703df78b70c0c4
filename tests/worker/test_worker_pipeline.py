"""The worker's seams: middleware around every execution, lifecycle hooks, resources handed
to handlers, the per-job lease, and a Worker run inside the application's own process."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from helpers.support import WorkerThread, count_where, enqueue_jobs, jobs_by_id, wait_for
from sqlalchemy import Engine, text

from sqla_queue import (
    ConfigurationError,
    JobContext,
    Outcome,
    OutcomeKind,
    Registry,
    RetryPolicy,
    Worker,
    WorkerConfig,
    admin,
)
from sqla_queue.testing import run_until_empty

NO_WAIT = RetryPolicy(base=0, jitter=0)


def test_middleware_sees_every_job_with_its_outcome_in_the_documented_order(
    engine: Engine,
) -> None:
    calls: list[tuple[str, str, Any]] = []

    def named(name: str) -> Any:
        def middleware(ctx: JobContext, call_next: Any) -> Any:
            calls.append((name, "before", ctx.task))
            try:
                result = call_next()
            except Exception as exc:
                calls.append((name, "raised", type(exc).__name__))
                raise
            calls.append((name, "after", result))
            return result

        return middleware

    registry = Registry(middleware=[named("outer"), named("inner")])

    @registry.task(name="sync", middleware=[named("task")])
    def sync_handler(n: int) -> int:
        calls.append(("handler", "sync", n))
        return n * 10

    @registry.task(name="async")
    async def async_handler(n: int) -> int:
        await asyncio.sleep(0)
        calls.append(("handler", "async", n))
        return n * 100

    @registry.task(name="broken", max_attempts=1, retry=NO_WAIT)
    def broken() -> None:
        raise ValueError("no")

    outcomes: list[tuple[str, OutcomeKind]] = []

    @registry.on_job_finished
    def finished(ctx: JobContext, outcome: Outcome) -> None:
        outcomes.append((ctx.task, outcome.kind))

    for task, args in (("sync", {"n": 1}), ("async", {"n": 2}), ("broken", {})):
        enqueue_jobs(engine, task, 1, args=args)
    run_until_empty(engine, registry, WorkerConfig(concurrency=1, batch=1, poll_only=True))

    assert calls == [
        ("outer", "before", "sync"),
        ("inner", "before", "sync"),
        ("task", "before", "sync"),
        ("handler", "sync", 1),
        ("task", "after", 10),
        ("inner", "after", 10),
        ("outer", "after", 10),
        # An async handler: the same middleware, on the same protocol, sees its result.
        ("outer", "before", "async"),
        ("inner", "before", "async"),
        ("handler", "async", 2),
        ("inner", "after", 200),
        ("outer", "after", 200),
        ("outer", "before", "broken"),
        ("inner", "before", "broken"),
        ("inner", "raised", "ValueError"),
        ("outer", "raised", "ValueError"),
    ]
    assert outcomes == [
        ("sync", OutcomeKind.succeeded),
        ("async", OutcomeKind.succeeded),
        ("broken", OutcomeKind.failed),
    ]


def test_middleware_can_refuse_to_run_a_job_or_fail_its_attempt(engine: Engine) -> None:
    ran: list[int] = []

    def gate(ctx: JobContext, call_next: Any) -> Any:
        n = ctx.state["n"] = ctx.job_id
        if ctx.queue == "skipped":
            return None  # refuse: the handler never runs, the job counts as done
        if ctx.queue == "refused":
            raise PermissionError(f"job {n} refused by middleware")
        return call_next()

    registry = Registry(middleware=[gate])
    registry.task(name="t", retry=RetryPolicy(base=3600, jitter=0))(lambda: ran.append(1))
    with engine.begin() as conn:
        admin.create_queue(conn, "skipped")
        admin.create_queue(conn, "refused")
    enqueue_jobs(engine, "t", 1, queue="skipped")
    (refused,) = enqueue_jobs(engine, "t", 1, queue="refused")
    enqueue_jobs(engine, "t", 1)

    stats = run_until_empty(engine, registry)

    assert ran == [1]
    assert (stats.succeeded, stats.retried) == (2, 1)
    job = jobs_by_id(engine)[refused]
    assert (job.status, job.attempts) == ("queued", 1)
    assert f"PermissionError: job {refused} refused by middleware" in (job.last_error or "")


def test_hooks_see_the_worker_start_and_stop_and_every_job_claimed_and_finished(
    engine: Engine,
) -> None:
    registry = Registry()
    registry.task(name="ok")(lambda: None)
    registry.task(name="bad", max_attempts=2, retry=RetryPolicy(base=3600, jitter=0))(lambda: 1 / 0)
    events: list[Any] = []
    registry.on_worker_started(lambda worker: events.append(("started", worker.config.batch)))
    registry.on_worker_stopping(lambda worker: events.append(("stopping", worker.stats.claimed)))
    registry.on_job_claimed(lambda ctx: events.append(("claimed", ctx.task, ctx.attempt)))
    registry.on_job_finished(lambda ctx, outcome: events.append(("finished", outcome.kind.value)))

    @registry.on_job_finished
    def broken_hook(ctx: JobContext, outcome: Outcome) -> None:
        raise RuntimeError("a hook's bug")  # logged and ignored: it cannot fail a job

    enqueue_jobs(engine, "ok", 1)
    enqueue_jobs(engine, "bad", 1)
    stats = run_until_empty(engine, registry, WorkerConfig(concurrency=1, batch=7, poll_only=True))

    assert (stats.succeeded, stats.retried) == (1, 1)
    assert events[0] == ("started", 7)
    assert events[-1] == ("stopping", 2)
    assert sorted(events[1:-1]) == sorted(
        [
            ("claimed", "ok", 1),
            ("claimed", "bad", 1),
            ("finished", "succeeded"),
            ("finished", "retried"),
        ]
    )
    with pytest.raises(ConfigurationError, match="a hook must be callable"):
        registry.on_job_claimed("not a function")


def test_a_handler_receives_resources_from_the_context(engine: Engine) -> None:
    registry = Registry(resources={"db": engine, "greeting": "hello"})

    @registry.task(name="uses_db", pass_context=True)
    def uses_db(ctx: JobContext, n: int) -> None:
        with ctx.resources["db"].begin() as conn:
            conn.execute(
                text("INSERT INTO public.seen (n, greeting) VALUES (:n, :g)"),
                {"n": n, "g": ctx.resource("greeting")},
            )

    @registry.task(name="asks_for_missing", pass_context=True, max_attempts=1)
    def asks_for_missing(ctx: JobContext) -> None:
        ctx.resource("cache")

    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.seen (n int, greeting text)"))
    enqueue_jobs(engine, "uses_db", 1, args={"n": 5})
    (missing,) = enqueue_jobs(engine, "asks_for_missing", 1)

    # The worker's own resources override the registry's of the same name.
    config = WorkerConfig(poll_only=True, resources={"greeting": "bonjour"})
    run_until_empty(engine, registry, config)

    with engine.connect() as conn:
        assert conn.execute(text("SELECT n, greeting FROM public.seen")).all() == [(5, "bonjour")]
    error = jobs_by_id(engine)[missing].last_error or ""
    assert "no resource named 'cache' (known: db, greeting)" in error


def test_a_worker_runs_inside_the_applications_own_process(engine: Engine) -> None:
    registry = Registry()
    done: list[int] = []
    registry.task(name="t")(lambda n: done.append(n))
    worker = Worker(engine, registry, WorkerConfig(poll_only=True, poll_interval=0.1))
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        for n in range(3):
            enqueue_jobs(engine, "t", 1, args={"n": n})
        wait_for(lambda: len(done) == 3)
        with engine.connect() as conn:
            live = conn.execute(text("SELECT id FROM sqla_queue.workers")).scalars().all()
        assert live == [worker.config.worker_id]  # registered while it runs
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert sorted(done) == [0, 1, 2]
    assert worker.stats.succeeded == 3
    with engine.connect() as conn:  # a clean stop removes its registration
        assert conn.scalar(text("SELECT count(*) FROM sqla_queue.workers")) == 0


# -- the per-job lease ----------------------------------------------------------------------


def test_a_short_lease_worker_never_reaps_the_long_job_of_a_long_lease_worker(
    engine: Engine,
) -> None:
    long_registry, short_registry = Registry(), Registry()
    ran: list[tuple[str, int]] = []

    @long_registry.task(name="long", pass_context=True)
    def long_job(ctx: JobContext) -> None:
        ran.append(("long-lease worker", ctx.attempt))
        time.sleep(10)

    @short_registry.task(name="long", pass_context=True)
    def same_task_elsewhere(ctx: JobContext) -> None:
        ran.append(("short-lease worker", ctx.attempt))

    (job_id,) = enqueue_jobs(engine, "long", 1)
    with WorkerThread(engine, long_registry, lease=60) as long_worker:
        wait_for(lambda: ran)
        with WorkerThread(engine, short_registry, lease=2, poll_interval=0.2) as short_worker:
            time.sleep(5)  # more than two of the short lease; its reaper runs every ~2 s
            assert jobs_by_id(engine)[job_id].status == "running"
        wait_for(lambda: count_where(engine, "true") == 0, timeout=60)
    assert ran == [("long-lease worker", 1)]
    assert short_worker.worker.stats.reaped == 0
    assert long_worker.worker.stats.reaped == 0


def test_the_claim_stores_the_tasks_own_lease_else_the_workers(engine: Engine) -> None:
    registry = Registry()
    seen: dict[str, float] = {}
    release = threading.Event()

    def lease_left(ctx: JobContext) -> None:
        with engine.connect() as conn:
            seen[ctx.task] = conn.scalar(
                text(
                    "SELECT extract(epoch FROM lease_expires_at - locked_at) "
                    "FROM sqla_queue.jobs WHERE id = :id"
                ),
                {"id": ctx.job_id},
            )
        release.wait(5)

    registry.task(name="own", pass_context=True, lease=300)(lease_left)
    registry.task(name="default", pass_context=True)(lease_left)
    enqueue_jobs(engine, "own", 1)
    enqueue_jobs(engine, "default", 1)
    with WorkerThread(engine, registry, lease=45, concurrency=2):
        wait_for(lambda: len(seen) == 2)
        release.set()
    assert seen["own"] == pytest.approx(300, abs=1)
    assert seen["default"] == pytest.approx(45, abs=1)


def test_a_lease_under_one_second_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="lease must be at least 1 s"):
        WorkerConfig(lease=0.05)
    with pytest.raises(ConfigurationError, match="lease must be at least 1 s"):
        Registry().task(name="t", lease=0.5)(lambda: None)


def test_a_bad_retry_policy_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="invalid RetryPolicy"):
        RetryPolicy(base=-1)
    with pytest.raises(ConfigurationError, match="invalid RetryPolicy"):
        RetryPolicy(max_delay=float("inf"))


def test_doctor_calls_stuck_exactly_what_the_reaper_requeues(engine: Engine) -> None:
    from sqla_queue.db import queries
    from sqla_queue.doctor import DoctorOptions, check_stuck_jobs

    enqueue_jobs(engine, "t", 4)
    with engine.begin() as conn:
        conn.execute(queries.claim_jobs(None), {"limit": 4, "worker_id": "alive"})
        conn.execute(
            text(
                "INSERT INTO sqla_queue.workers (id, hostname, pid, concurrency, expires_at) "
                "VALUES ('alive', 'h', 1, 1, now() + interval '1 minute'), "
                "('dead', 'h', 2, 1, now() - interval '1 second')"
            )
        )
        # One past its own deadline, one held by an expired worker, two healthy.
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET lease_expires_at = now() - interval '5 seconds' "
                "WHERE id = 1"
            )
        )
        conn.execute(text("UPDATE sqla_queue.jobs SET locked_by = 'dead' WHERE id = 2"))
    with engine.connect() as conn:
        finding = check_stuck_jobs(conn, DoctorOptions())
    assert finding.details["count"] == 2
    with engine.begin() as conn:
        reaped = conn.execute(queries.reap_stale_jobs()).mappings().all()
    assert sorted(row["id"] for row in reaped) == [1, 2]


def test_jobs_released_at_shutdown_are_reported_to_the_finished_hooks(engine: Engine) -> None:
    registry = Registry()
    started = threading.Event()

    @registry.task(name="hold", pass_context=True)
    def hold(ctx: JobContext) -> None:
        started.set()
        while not ctx.cancelled:
            time.sleep(0.02)

    kinds: list[OutcomeKind] = []
    registry.on_job_finished(lambda ctx, outcome: kinds.append(outcome.kind))
    enqueue_jobs(engine, "hold", 3)
    runner = WorkerThread(engine, registry, concurrency=1, batch=3, shutdown_timeout=0.2)
    with runner:
        assert started.wait(60)
        wait_for(lambda: count_where(engine, "status = 'running'") == 3)
        stats = runner.stop()
    assert stats.released == 3
    assert kinds == [OutcomeKind.released] * 3  # two never started, one abandoned
