"""The worker's handler threads: a timed-out sync handler does not take a slot with it."""

from __future__ import annotations

import threading

from apps.support import WorkerThread, enqueue_jobs, jobs_by_id, wait_for
from sqlalchemy import Engine

from sqla_queue import Registry, RetryPolicy


def test_jobs_keep_running_while_a_timed_out_sync_handler_is_still_stuck(engine: Engine) -> None:
    registry = Registry()
    release = threading.Event()
    ran: list[bool] = []

    @registry.task(name="stuck", timeout=0.2, retry=RetryPolicy(base=60, jitter=0))
    def stuck() -> None:
        release.wait(10)  # bounded: the test sets it once the others have run

    @registry.task(name="quick")
    def quick() -> None:
        ran.append(release.is_set())

    (stuck_id,) = enqueue_jobs(engine, "stuck", 1, priority=0)
    enqueue_jobs(engine, "quick", 5, priority=1)
    runner = WorkerThread(engine, registry, concurrency=1, batch=1)
    try:
        with runner:
            # One slot: the quick jobs can only run on a thread other than the stuck one.
            wait_for(lambda: len(ran) == 5, timeout=5)
    finally:
        release.set()

    assert ran == [False] * 5  # all of them while the stuck handler still blocked
    assert runner.stats is not None
    assert (runner.stats.succeeded, runner.stats.retried) == (5, 1)
    (job,) = jobs_by_id(engine).values()  # the quick jobs are deleted on success
    assert (job.id, job.status, job.attempts) == (stuck_id, "queued", 1)
    assert "ran longer than its timeout of 0.2 s" in (job.last_error or "")


def test_blocking_handlers_each_get_a_thread_up_to_the_concurrency(engine: Engine) -> None:
    """A claimed batch wakes a few handler threads at once (quick jobs run back to back);
    jobs left waiting behind blocking handlers get the other idle threads: all 12 jobs
    below must run at the same time, or none passes the barrier."""
    registry = Registry()
    together = threading.Barrier(12)
    passed: list[int] = []

    @registry.task(name="meet", max_attempts=1)
    def meet() -> None:
        together.wait(10)  # raises BrokenBarrierError unless all 12 are running
        passed.append(threading.get_ident())

    enqueue_jobs(engine, "meet", 12)
    runner = WorkerThread(engine, registry, concurrency=12, batch=12)
    with runner:
        wait_for(lambda: len(passed) == 12 or together.broken, timeout=15)

    assert not together.broken
    assert len(passed) == len(set(passed)) == 12  # twelve threads at once
    assert runner.stats is not None
    assert runner.stats.succeeded == 12
