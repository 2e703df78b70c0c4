"""Tasks that report progress and log through `logging` (issue 38):
`sqla-queue worker --app helpers.apps.journaled:registry`."""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import Engine

from sqla_queue import JobContext, Registry, RetryPolicy, Snooze
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig

registry = Registry()
log = logging.getLogger("journaled.app")
log.setLevel(logging.INFO)  # whatever the root logger's level: these records are emitted

LINES = 300
"""Lines `chatty` logs: more than a job keeps (`MAX_LOG_LINES`)."""


@registry.task(name="journal.resize", pass_context=True)
def resize(ctx: JobContext, images: int = 10) -> None:
    for done in range(1, images + 1):
        log.info("resized image %d", done)
        ctx.progress(done / images, f"resized {done} of {images}")


@registry.task(name="journal.tight", pass_context=True, keep_result=True)
def tight(ctx: JobContext, calls: int = 20_000) -> dict[str, float]:
    """Reports progress `calls` times in a tight loop; returns how many writes went out
    and how long the loop took (the journal's own count, not a clock on the database)."""
    started = time.monotonic()
    for call in range(1, calls + 1):
        ctx.progress(call / calls, f"call {call}")
    journal = ctx.journal
    assert journal is not None
    return {"writes": journal.progress_writes, "seconds": time.monotonic() - started}


@registry.task(
    name="journal.chatty", pass_context=True, max_attempts=2, retry=RetryPolicy(base=0, jitter=0)
)
def chatty(ctx: JobContext) -> None:
    log.warning("attempt %d starts", ctx.attempt)
    log.info("%s", "y" * 10_000)
    try:
        raise KeyError("order")
    except KeyError:
        log.exception("lookup failed")
    for line in range(LINES):
        log.info("line %d", line)
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


@registry.task(name="journal.async_steps", pass_context=True)
async def async_steps(ctx: JobContext) -> None:
    log.info("async step one")
    await asyncio.sleep(0)
    ctx.progress(0.5, "half way")
    log.info("async step two")


@registry.task(name="journal.bad_progress", pass_context=True, max_attempts=1)
def bad_progress(ctx: JobContext, fraction: float) -> None:
    ctx.progress(fraction)


@registry.task(name="journal.overrun", pass_context=True, timeout=1, max_attempts=1)
def overrun(ctx: JobContext) -> None:
    """Reports 0.5, runs past its 1 s timeout, then reports 0.9 (fenced off by then)."""
    report_around_the_end(ctx, "before the timeout", "after the timeout")


@registry.task(name="journal.until_cancelled", pass_context=True)
def until_cancelled(ctx: JobContext) -> None:
    report_around_the_end(ctx, "waiting to be cancelled", "after the cancel")


def report_around_the_end(ctx: JobContext, before: str, after: str) -> None:
    """Report 0.5 and log `before`, wait (30 s at most) until the attempt is given up, then
    report 0.9 and log `after`."""
    ctx.progress(0.5, before)
    log.info(before)
    deadline = time.monotonic() + 30
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    ctx.progress(0.9, after)
    log.info(after)


_snoozed: set[int] = set()


@registry.task(name="journal.snoozes_once", pass_context=True)
def snoozes_once(ctx: JobContext) -> None:
    first = ctx.job_id not in _snoozed
    log.info("run %s of attempt %d", "1" if first else "2", ctx.attempt)
    if first:
        _snoozed.add(ctx.job_id)
        ctx.progress(0.5, "snoozing")
        raise Snooze(0, "waits for nothing")
    ctx.progress(1.0, "done after the snooze")


@registry.task(name="journal.in_session", pass_context=True)
def in_session(ctx: JobContext) -> None:
    ctx.progress(0.5, "before the commit")
    with ctx.session() as session:
        session.commit()
    log.info("after the commit")
    ctx.progress(1.0, "after the commit")


def run_journaled(engine: Engine, concurrency: int = 1) -> None:
    """A burst worker over this app's registry until no job is due."""
    run_until_empty(engine, registry, WorkerConfig(concurrency=concurrency, poll_only=True))
