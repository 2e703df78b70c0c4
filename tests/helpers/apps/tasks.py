"""A task registry for worker subprocesses: `sqla-queue worker --app helpers.apps.tasks:registry`.

Handlers write each attempt they run into `public.task_log` of the database named by
SQLA_QUEUE_DATABASE_URL, so a test can check what ran, where, and how many times.
"""

from __future__ import annotations

import os
import signal
import time

from sqlalchemy import text

from helpers.support import record_attempt
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


RECEIPT = text("INSERT INTO public.receipts (job_id, attempt) VALUES (:j, :a)")


@registry.task(name="commit_then_die", pass_context=True)
def commit_then_die(ctx: JobContext) -> None:
    """Write a receipt and finish the job in one commit (ctx.session()), then SIGKILL the
    worker before it can write any outcome of its own."""
    with ctx.session() as session:
        session.execute(RECEIPT, {"j": ctx.job_id, "a": ctx.attempt})
        session.commit()
    os.kill(os.getpid(), signal.SIGKILL)


@registry.task(name="commit_after_pause", pass_context=True)
def commit_after_pause(ctx: JobContext, pause: float) -> None:
    """Write a receipt in ctx.session(), log the attempt, wait `pause` s on the first attempt
    (the test pauses the worker meanwhile), then commit: a stale attempt's commit fails."""
    with ctx.session() as session:
        session.execute(RECEIPT, {"j": ctx.job_id, "a": ctx.attempt})
        record_attempt(_url(), ctx.job_id, ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(pause)
        session.commit()
