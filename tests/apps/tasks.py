"""A task registry for worker subprocesses: `sqla-queue worker --app apps.tasks:registry`.

Handlers write each attempt they run into `public.task_log` of the database named by
SQLA_QUEUE_DATABASE_URL, so a test can check what ran, where, and how many times.
"""

from __future__ import annotations

import os
import time

from apps.support import record_attempt
from sqla_queue import JobContext, Registry

registry = Registry()


def _url() -> str:
    return os.environ["SQLA_QUEUE_DATABASE_URL"]


@registry.task(name="record", pass_context=True)
def record(ctx: JobContext) -> None:
    """Log (job id, attempt, pid) and return."""
    record_attempt(_url(), ctx.job_id, ctx.attempt)


@registry.task(name="linger", pass_context=True)
def linger(ctx: JobContext, seconds: float) -> None:
    """Log the start, then run for `seconds` unless the worker gives the job up first."""
    record_attempt(_url(), ctx.job_id, ctx.attempt)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.05)


@registry.task(name="stamp", pass_context=True)
def stamp(ctx: JobContext, seconds: float = 0.0) -> None:
    """Log the handler's own start time (taken before any I/O), then sleep `seconds`."""
    started = time.time()
    record_attempt(_url(), ctx.job_id, ctx.attempt, at=started)
    time.sleep(seconds)
