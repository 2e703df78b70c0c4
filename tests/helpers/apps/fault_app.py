"""Task registries that the fault-injection tests run in real `sqla-queue worker` processes.

Every handler records what it did in `fault_runs`, a table of the test's own in the public
schema (created by `create_fault_tables`), over a psycopg connection of its own: the
worker's connections carry the application name "sqla-queue worker", these do not, so a
test can terminate the worker's connections without touching the record.

Run as `sqla-queue worker --app helpers.apps.fault_app:registry` with tests/ on PYTHONPATH and
FAULT_APP_DSN set to a libpq URL of the test database.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import psycopg

from helpers.support import until_told
from sqla_queue import JobContext, Registry, RetryPolicy, Snooze

registry = Registry()

_lock = threading.Lock()
_shared: list[psycopg.Connection[tuple[object, ...]]] = []
NO_RETRY_WAIT = RetryPolicy(base=0.0, jitter=0.0)

FAULT_TABLES = """
CREATE TABLE IF NOT EXISTS public.fault_runs (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    event text NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_at timestamptz
);
CREATE TABLE IF NOT EXISTS public.fault_ledger (
    key text PRIMARY KEY,
    value text NOT NULL,
    fence integer NOT NULL
);
"""


def create_fault_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FAULT_TABLES)


def execute(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
    """Run one autocommit statement on the process's one recording connection.

    One connection per worker process, not per handler thread: 64 handlers in flight must
    not exhaust the server's max_connections (shared with other tests).
    """
    with _lock:
        if not _shared or _shared[0].closed or _shared[0].broken:
            _shared[:] = [psycopg.connect(os.environ["FAULT_APP_DSN"], autocommit=True)]
        cursor = _shared[0].execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def note(ctx: JobContext, event: str) -> None:
    """Record one event of this attempt of this job, with the time its claim took it (the
    row's `locked_at`, the claim's own clock: what the claim decided, whatever the load)."""
    execute(
        "INSERT INTO public.fault_runs (job_id, attempt, event, pid, claimed_at)"
        " SELECT %s, %s, %s, %s,"
        " (SELECT locked_at FROM sqla_queue.jobs WHERE id = %s AND attempts = %s)",
        (ctx.job_id, ctx.attempt, event, os.getpid(), ctx.job_id, ctx.attempt),
    )


@registry.task(name="record", pass_context=True, max_attempts=100, retry=NO_RETRY_WAIT)
def record(ctx: JobContext, n: int, work: float = 0.0) -> None:
    """Count one execution; `work` seconds of sleep widen the window a kill can land in."""
    if work:
        time.sleep(work)
    note(ctx, "ran")


@registry.task(name="sleep", pass_context=True, max_attempts=100, retry=NO_RETRY_WAIT)
def sleep(ctx: JobContext, seconds: float) -> None:
    note(ctx, "started")
    time.sleep(seconds)
    note(ctx, "finished")


@registry.task(name="keyed", pass_context=True, max_attempts=100, retry=NO_RETRY_WAIT)
def keyed(ctx: JobContext, key: str, n: int, seconds: float = 0.0) -> None:
    """One job of a key (a sequence, a unique key): notes its start and end with the `n` it
    was given, e.g. "started 3" and "finished 3"."""
    note(ctx, f"started {n}")
    if seconds:
        time.sleep(seconds)
    note(ctx, f"finished {n}")


@registry.task(name="fenced_write", pass_context=True, max_attempts=100, retry=NO_RETRY_WAIT)
def fenced_write(ctx: JobContext, key: str, first_attempt_sleeps: float) -> None:
    """Write to an outside system with the attempt as fencing token; the write of a stale
    attempt (one whose lease was lost while it slept) matches no row and is rejected."""
    note(ctx, "started")
    if ctx.attempt == 1:
        time.sleep(first_attempt_sleeps)
    written = execute(
        "INSERT INTO public.fault_ledger AS l (key, value, fence) VALUES (%s, %s, %s) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence "
        "WHERE l.fence < excluded.fence RETURNING key",
        (key, f"written by attempt {ctx.attempt}", ctx.attempt),
    )
    note(ctx, "write accepted" if written else "write rejected")


@registry.task(
    name="sync_overrun",
    pass_context=True,
    timeout=0.5,
    max_attempts=2,
    retry=NO_RETRY_WAIT,
)
def sync_overrun(ctx: JobContext, seconds: float, succeed_on_attempt: int = 0) -> None:
    """Overruns its timeout unless this is `succeed_on_attempt`: holds until the worker tells
    it (`ctx.cancelled`: the worker's decision, however late a loaded producer makes it),
    `seconds` at most; says when it returns."""
    note(ctx, "started")
    if ctx.attempt != succeed_on_attempt:
        note(ctx, f"returned late, cancelled={until_told(ctx, seconds)}")
    else:
        note(ctx, "returned in time")


@registry.task(
    name="async_overrun",
    pass_context=True,
    timeout=0.5,
    max_attempts=2,
    retry=NO_RETRY_WAIT,
)
async def async_overrun(ctx: JobContext, seconds: float, succeed_on_attempt: int = 0) -> None:
    await asyncio.to_thread(note, ctx, "started")
    if ctx.attempt == succeed_on_attempt:
        await asyncio.to_thread(note, ctx, "returned in time")
        return
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note(ctx, "cancelled")
        raise
    await asyncio.to_thread(note, ctx, "returned late")


@registry.task(name="cooperative", pass_context=True, max_attempts=100, retry=NO_RETRY_WAIT)
def cooperative(ctx: JobContext, seconds: float) -> None:
    """A long loop that checks `ctx.cancelled` and stops when it is set."""
    note(ctx, "started")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled:
            note(ctx, "saw cancelled")
            return
        time.sleep(0.05)
    note(ctx, "finished")


STRESS_TIMEOUT = 1.0


@registry.task(
    name="stress",
    pass_context=True,
    max_attempts=3,
    retry=NO_RETRY_WAIT,
    timeout=STRESS_TIMEOUT,
    keep_result=True,
)
async def stress(ctx: JobContext, n: int, mode: str = "ok", seconds: float = 0.05) -> object:
    """The stress run's task (tests/system/test_model_stress.py): notes "start" and, as its run
    ends however it ends (a timeout cancels it), "end"; so the test rebuilds every run's
    interval. `mode`: ok (returns {"n": n}, kept), fail, snooze (once, then ok), slow
    (sleeps `seconds`, past its timeout)."""
    note(ctx, "start")
    try:
        if mode == "fail":
            raise RuntimeError(f"stress job {n} failed as asked")
        if mode == "snooze":
            snoozed = execute(
                "SELECT 1 FROM public.fault_runs WHERE job_id = %s AND event = 'snoozed'",
                (ctx.job_id,),
            )
            if not snoozed:
                note(ctx, "snoozed")
                raise Snooze(0.2, "once")
        await asyncio.sleep(seconds)
        return {"n": n}
    finally:
        note(ctx, "end")  # synchronously: before the worker learns how the run ended


not_a_registry = {"record": record}
"""For the bad-input tests: importable, but not a Registry."""


@registry.task(name="hold_connection", pass_context=True, max_attempts=100, retry=NO_RETRY_WAIT)
def hold_connection(ctx: JobContext, n: int, seconds: float = 0.05) -> None:
    """Holds a connection of its own while it works, as a handler on an application pool
    sized to `-c` does (tests/worker/test_startup_storm.py); when the server has no room
    for it, the job waits a little (a snooze: no attempt spent), as such an application would."""
    try:
        conn = psycopg.connect(os.environ["FAULT_APP_DSN"], autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1][:200]
        raise Snooze(0.2, f"no connection for the handler: {reason}") from None
    with conn:
        time.sleep(seconds)
        conn.execute(
            "INSERT INTO public.fault_runs (job_id, attempt, event, pid) VALUES (%s, %s, %s, %s)",
            (ctx.job_id, ctx.attempt, "ran", os.getpid()),
        )
