"""The worker's handler threads: a timed-out sync handler does not take a slot with it."""

from __future__ import annotations

import threading

from apps.support import enqueue_jobs, jobs_by_id
from sqlalchemy import Engine

from sqla_queue import Registry, RetryPolicy
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig


def test_jobs_keep_running_while_a_timed_out_sync_handler_is_still_stuck(engine: Engine) -> None:
    registry = Registry()
    release = threading.Event()
    ran: list[bool] = []

    @registry.task(name="stuck", timeout=0.2, retry=RetryPolicy(base=60, jitter=0))
    def stuck() -> None:
        release.wait(20)  # bounded: the test sets it once the others have run

    @registry.task(name="quick")
    def quick() -> None:
        ran.append(release.is_set())

    (stuck_id,) = enqueue_jobs(engine, "stuck", 1, priority=0)
    quick_ids = enqueue_jobs(engine, "quick", 5, priority=1)
    try:
        config = WorkerConfig(concurrency=1, batch=1, poll_only=True)
        stats = run_until_empty(engine, registry, config)
    finally:
        release.set()

    # With one slot, the quick jobs ran after the timeout while the stuck handler still blocked.
    assert ran == [False] * 5
    assert (stats.succeeded, stats.retried) == (5, 1)
    jobs = jobs_by_id(engine)
    assert set(jobs) == {stuck_id}, f"quick jobs {quick_ids} are deleted on success"
    assert (jobs[stuck_id].status, jobs[stuck_id].attempts) == ("queued", 1)
    assert "ran longer than its timeout of 0.2 s" in (jobs[stuck_id].last_error or "")
