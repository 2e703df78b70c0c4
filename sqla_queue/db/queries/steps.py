"""Durable steps' statements (`ctx.step`, `ctx.sleep`): read a job's recorded step, record
one fenced on the job's attempt, and list a job's steps for `jobs show` and the dashboard.

The fence is a read of the job's row (`attempts` and `status = 'running'`), never a lock:
no foreign key and no `FOR KEY SHARE` on a row the worker keeps updating, so recording a
step mints no MultiXact. Exactly once is the primary key's: two attempts that race to
record the same step (a stale one and its successor) meet on `(job_id, name)`, the second
waits for the first and then records nothing.
"""

from __future__ import annotations

from typing import Any
from typing import cast as type_cast

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    Integer,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    exists,
    extract,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningInsert

from sqla_queue.db.models import JobStatus, JobStep
from sqla_queue.db.queries.common import jobs, literal_text, seconds_interval, status_is

job_steps = type_cast(Table, JobStep.__table__)

__all__ = [
    "job_steps",
    "list_job_steps",
    "read_step",
    "read_steps",
    "record_step",
    "sleeping",
    "wake_sleeping_jobs",
]

WAKE_BATCH = 1000
"""Sleeping jobs a keeper queues per statement at most."""


def sleeping(table: Any = jobs) -> Any:
    """A job parked by a durable sleep (`models.SLEEPS`, spelled as `ix_jobs_sleep_end`'s
    predicate is): waiting for neither a signal nor a job, `run_at` the sleep's end."""
    return and_(
        status_is(JobStatus.waiting, table),
        table.c.signal_key.is_(None),
        table.c.deps_left.is_(None),
    )


def wake_sleeping_jobs() -> Update:
    """Queue the sleeping jobs whose end comes within `ahead` seconds, `run_at` kept at
    the end (so the claim takes each at its end, not at the keeper's next look), up to
    `WAKE_BATCH`, soonest first; skips rows another transaction holds (a cancel). Reads
    `ix_jobs_sleep_end` only: the cost is the due jobs', however many sleep. Returns each
    woken job's queue (to NOTIFY)."""
    j = jobs.alias("j")
    due = (
        select(j.c.id)
        .where(
            sleeping(j),
            j.c.run_at <= func.now() + seconds_interval(bindparam("ahead", type_=Float)),
        )
        .order_by(j.c.run_at)
        .limit(WAKE_BATCH)
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    return (
        update(jobs)
        .where(jobs.c.id == due.c.id, sleeping())
        .values(status=literal_text(JobStatus.queued.value))
        .returning(jobs.c.queue)
    )


def _sleep_left() -> Any:
    """Seconds until a sleep's recorded end (by the database clock); NULL for a step."""
    until = job_steps.c.result["until"].astext.cast(DateTime(timezone=True))
    return extract("epoch", until - func.now()).cast(Float)


def read_step() -> Select[Any]:
    """One recorded step of a job. Parameters: `job_id`, `name`. Columns: name, kind,
    status, result (decoded JSON), attempt, left (a sleep's seconds to go, by the database
    clock)."""
    return read_steps().where(job_steps.c.name == bindparam("name"))


def read_steps() -> Select[Any]:
    """Every recorded step of a job (one read for a run's replays). Parameter: `job_id`."""
    return select(
        job_steps.c.name,
        job_steps.c.kind,
        job_steps.c.status,
        job_steps.c.result,
        job_steps.c.attempt,
        _sleep_left().label("left"),
    ).where(job_steps.c.job_id == bindparam("job_id"))


def _result_value() -> Any:
    """The result to record: `result` as given, or a sleep's end computed by the server
    from `sleep_seconds` (`{"until": ...}`), so every clock read is the database's."""
    seconds = cast(bindparam("sleep_seconds"), Float)
    until = func.jsonb_build_object("until", func.now() + seconds_interval(seconds))
    given = cast(bindparam("result", type_=Text), JSONB)
    return case((seconds.is_(None), given), else_=until)


def record_step() -> ReturningInsert[Any]:
    """Record a step's outcome, fenced: only while the job is `running` under `attempt`,
    and never over a step recorded `done` (by this or another attempt).

    Parameters: `job_id`, `name`, `kind` ('step' or 'sleep'), `status` ('done' or
    'failed'), `attempt`, `tries`, `result` (JSON text or None), `error`, `started_at`,
    `sleep_seconds` (a sleep's length from now, by the database clock; None for a step or a
    sleep with a fixed end in `result`). Returns the row written (kind, status, result,
    left), or nothing: the fence failed (a stale attempt) or the step was already done.
    """
    fenced = exists().where(
        jobs.c.id == bindparam("job_id"),
        jobs.c.attempts == bindparam("attempt"),
        jobs.c.status == JobStatus.running.value,
    )
    values = select(
        cast(bindparam("job_id"), BigInteger),
        cast(bindparam("name"), Text),
        cast(bindparam("kind"), Text),
        cast(bindparam("status"), Text),
        cast(bindparam("attempt"), Integer),
        cast(bindparam("tries"), Integer),
        _result_value(),
        cast(bindparam("error"), Text),
        cast(bindparam("started_at", type_=DateTime(timezone=True)), DateTime(timezone=True)),
    ).where(fenced)
    insert = pg_insert(job_steps).from_select(
        ["job_id", "name", "kind", "status", "attempt", "tries", "result", "error", "started_at"],
        values,
    )
    excluded = insert.excluded
    return insert.on_conflict_do_update(
        index_elements=[job_steps.c.job_id, job_steps.c.name],
        set_={
            "kind": excluded.kind,
            "status": excluded.status,
            "attempt": excluded.attempt,
            "tries": excluded.tries,
            "result": excluded.result,
            "error": excluded.error,
            "started_at": excluded.started_at,
            "finished_at": func.now(),
        },
        where=job_steps.c.status != "done",
    ).returning(
        job_steps.c.kind, job_steps.c.status, job_steps.c.result, _sleep_left().label("left")
    )


def list_job_steps() -> Select[Any]:
    """A job's recorded steps, in the order they started. Parameter: `job_id`."""
    return (
        select(
            job_steps.c.name,
            job_steps.c.kind,
            job_steps.c.status,
            job_steps.c.attempt,
            job_steps.c.tries,
            job_steps.c.result,
            job_steps.c.error,
            job_steps.c.started_at,
            job_steps.c.finished_at,
            extract("epoch", job_steps.c.finished_at - job_steps.c.started_at)
            .cast(Float)
            .label("seconds"),
        )
        .where(job_steps.c.job_id == bindparam("job_id"))
        .order_by(job_steps.c.started_at, job_steps.c.name)
    )
