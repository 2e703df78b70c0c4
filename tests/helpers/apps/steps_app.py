"""A registry of durable steps that the SIGKILL test runs in real `sqla-queue worker`
processes (tests/worker/test_steps_kills.py).

`steps.five` runs five steps: the even ones have an outside effect, counted in
`public.steps_ledger` over a connection of the process's own (at least once), with the
process's pid (the test kills only a process that has run a job's last step); the odd ones
write `public.steps_rows` through their step's session (exactly once). `steps.trip` adds a
durable sleep and a wait for a signal between its steps (tests/db/test_signal_multixacts.py).
Every worker process of this app logs each savepoint statement it sends (`SAVEPOINT_SEEN`).

Run as `sqla-queue worker --app helpers.apps.steps_app:registry` with tests/ on PYTHONPATH
and FAULT_APP_DSN set to a libpq URL of the test database.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.orm import Session

from helpers.apps.fault_app import NO_RETRY_WAIT, execute
from sqla_queue import JobContext, Registry

registry = Registry()

STEPS_TABLES = """
CREATE TABLE IF NOT EXISTS public.steps_ledger (job_id bigint, step text, attempt int, pid int);
CREATE TABLE IF NOT EXISTS public.steps_rows (job_id bigint, step text, attempt int);
"""
STEPS = 5


def outside(job_id: int, step: str, attempt: int) -> int:
    execute(
        "INSERT INTO public.steps_ledger VALUES (%s, %s, %s, %s)",
        (job_id, step, attempt, os.getpid()),
    )
    time.sleep(0.01)  # the effect is done, the record not yet: a kill here runs it again
    return attempt


def database_only(session: Session, job_id: int, step: str, attempt: int) -> int:
    session.execute(
        text("INSERT INTO public.steps_rows VALUES (:j, :s, :a)"),
        {"j": job_id, "s": step, "a": attempt},
    )
    return attempt


@registry.task(name="steps.five", pass_context=True, retry=NO_RETRY_WAIT, max_attempts=100)
def five(ctx: JobContext, n: int) -> None:
    for k in range(STEPS):
        name = f"s{k}"
        if k % 2 == 0:
            ctx.step(name, outside, ctx.job_id, name, ctx.attempt)
        else:
            ctx.step(name, database_only, ctx.job_id, name, ctx.attempt, session=True)


TRIP_SLEEP = timedelta(seconds=1)
TRIP_WAIT = timedelta(hours=1)


def trip_key(n: int) -> str:
    """The signal a `steps.trip` job of number `n` waits for."""
    return f"trip:{n}"


@registry.task(name="steps.trip", pass_context=True, retry=NO_RETRY_WAIT, max_attempts=100)
def trip(ctx: JobContext, n: int) -> None:
    """An outside step, a database-only step, a durable sleep, a wait for `trip_key(n)`,
    and a database-only step named after the payload it got (`s2:<payload>`)."""
    ctx.step("s0", outside, ctx.job_id, "s0", ctx.attempt)
    ctx.step("s1", database_only, ctx.job_id, "s1", ctx.attempt, session=True)
    ctx.sleep(TRIP_SLEEP)
    payload = ctx.wait_for_signal(trip_key(n), TRIP_WAIT)
    ctx.step("s2", database_only, ctx.job_id, f"s2:{payload}", ctx.attempt, session=True)


SAVEPOINT_SEEN = "steps_app: a savepoint statement: "
"""What a worker process of this app logs for each savepoint statement it sends."""


def _watch_savepoints(
    conn: Connection, cursor: object, statement: str, *args: object, **kwargs: object
) -> None:
    if statement.lstrip()[:9].upper() == "SAVEPOINT":
        print(f"{SAVEPOINT_SEEN}{statement[:200]!r}", file=sys.stderr, flush=True)


event.listen(Engine, "before_cursor_execute", _watch_savepoints)  # every engine of the process
