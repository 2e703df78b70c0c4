"""The task registry of the workflow tests with real workers
(tests/workflows/test_workflow_workers.py).

Every handler that matters records its attempt in `public.wf_ledger`, a table of the test's
own, over the one psycopg connection per worker process of tests/helpers/apps/fault_app.py: the
start when the handler begins and the end just before it returns, both by the database's
clock (`clock_timestamp()`), so starts and ends of handlers in different processes compare.

Run as `sqla-queue worker --app helpers.apps.workflow_app:registry` with tests/ on PYTHONPATH and
FAULT_APP_DSN set to a libpq URL of the test database (the `workers` fixture does both).
"""

from __future__ import annotations

import os
import time

import psycopg

from helpers.apps.fault_app import execute
from sqla_queue import JobContext, Registry, RetryPolicy

registry = Registry()

LEDGER = """
CREATE UNLOGGED TABLE IF NOT EXISTS public.wf_ledger (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    started timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended timestamptz,
    PRIMARY KEY (job_id, attempt)
)
"""

NO_RETRY_WAIT = RetryPolicy(base=0.0, jitter=0.0)


def create_ledger(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER)


def _start(ctx: JobContext) -> None:
    execute(
        "INSERT INTO public.wf_ledger (job_id, attempt, pid) VALUES (%s, %s, %s)",
        (ctx.job_id, ctx.attempt, os.getpid()),
    )


def _end(ctx: JobContext) -> None:
    execute(
        "UPDATE public.wf_ledger SET ended = clock_timestamp() WHERE job_id = %s AND attempt = %s",
        (ctx.job_id, ctx.attempt),
    )


@registry.task(name="node", pass_context=True, max_attempts=100, retry=NO_RETRY_WAIT)
def node(ctx: JobContext, n: int, sleep: float = 0.0) -> None:
    """Record the start, sleep `sleep` seconds, record the end."""
    _start(ctx)
    if sleep:
        time.sleep(sleep)
    _end(ctx)


@registry.task(name="boom", pass_context=True, max_attempts=1)
def boom(ctx: JobContext, n: int) -> None:
    """Record the start, then fail (one attempt: the job ends failed)."""
    _start(ctx)
    raise RuntimeError(f"node {n} fails as asked")


@registry.task(name="flaky", pass_context=True, max_attempts=1)
def flaky(ctx: JobContext, n: int, fail_until: int = 1) -> None:
    """Fail on the first attempt (the job ends failed, max_attempts 1); after an admin
    retry, whose attempt is a later one, succeed."""
    _start(ctx)
    if ctx.attempt <= fail_until:
        raise RuntimeError(f"node {n} fails on attempt {ctx.attempt}")
    _end(ctx)


@registry.task(name="noop")
def noop(n: int = 0) -> None:
    """Nothing: the parents of the hot fan-in (their count is the job table's)."""
