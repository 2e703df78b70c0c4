"""Tasks for the broker tests' worker processes (`--app helpers.apps.broker_app:registry`).

Each run of a handler inserts (job_id, attempt, pid) into `public.broker_effects` of the
database in BROKER_APP_DSN, so a test counts side effects per job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psycopg

from sqla_queue import JobContext, Registry, RetryPolicy

_connection: psycopg.Connection[tuple[object, ...]] | None = None

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS public.broker_effects (
    job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL, at timestamptz DEFAULT now()
)
"""


def _record(job_id: int, attempt: int) -> None:
    global _connection
    if _connection is None or _connection.closed:
        _connection = psycopg.connect(os.environ["BROKER_APP_DSN"], autocommit=True)
    _connection.execute(
        "INSERT INTO public.broker_effects (job_id, attempt, pid) VALUES (%s, %s, %s)",
        (job_id, attempt, os.getpid()),
    )


def _record_middleware(job_id: int, task: str) -> None:
    global _connection
    if _connection is None or _connection.closed:
        _connection = psycopg.connect(os.environ["BROKER_APP_DSN"], autocommit=True)
    _connection.execute(
        "CREATE TABLE IF NOT EXISTS public.broker_middleware (job_id bigint, task text)"
    )
    _connection.execute(
        "INSERT INTO public.broker_middleware (job_id, task) VALUES (%s, %s)", (job_id, task)
    )


def seen_by_middleware(ctx: JobContext, call_next: Callable[[], object]) -> object:
    """The registry's middleware: broker workers run it around every job, as table workers do."""
    _record_middleware(ctx.job_id, ctx.task)
    return call_next()


registry = Registry(middleware=[seen_by_middleware])


@registry.task(name="effect", pass_context=True)
def effect(ctx: JobContext, n: int) -> None:
    """Record one side effect."""
    _record(ctx.job_id, ctx.attempt)


@registry.task(name="slow_effect", pass_context=True)
def slow_effect(ctx: JobContext, seconds: float) -> None:
    """Record the start, then take `seconds` (a worker can be killed in between)."""
    _record(ctx.job_id, ctx.attempt)
    time.sleep(seconds)


@registry.task(
    name="always_fails",
    pass_context=True,
    max_attempts=3,
    retry=RetryPolicy(base=0.2, factor=1.0, jitter=0.0),
)
def always_fails(ctx: JobContext) -> None:
    """Record the attempt, then fail."""
    _record(ctx.job_id, ctx.attempt)
    raise RuntimeError(f"always fails (attempt {ctx.attempt})")


@registry.task(name="hang_first", pass_context=True)
def hang_first(ctx: JobContext) -> None:
    """Record the attempt; the first attempt then hangs (its worker is killed meanwhile)."""
    _record(ctx.job_id, ctx.attempt)
    if ctx.attempt == 1:
        time.sleep(120)
