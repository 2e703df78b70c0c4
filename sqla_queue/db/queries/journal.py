"""Statements of a job's journal: its progress (`job_progress`) and its handler's log lines
(`job_logs`), written by the worker and read by `jobs show` and the dashboard. Each write is
fenced on the attempt: it lands only while the job row says this attempt holds it (or this
attempt finished it), read without a lock on the job row."""

from __future__ import annotations

from typing import cast

from sqlalchemy import ColumnElement, Select, Table, bindparam, case, exists, func, or_, select
from sqlalchemy.dialects.postgresql import Insert, insert

from sqla_queue.db.models import JobLogLines, JobProgress
from sqla_queue.db.queries.common import history, jobs

job_progress = cast(Table, JobProgress.__table__)
job_logs = cast(Table, JobLogLines.__table__)

__all__ = [
    "job_logs",
    "job_progress",
    "read_logs",
    "read_progress",
    "write_logs",
    "write_progress",
]


def _attempt_holds_job() -> ColumnElement[bool]:
    """The job `:job_id` is at attempt `:attempt` and running or done, in the jobs table, or
    done by that attempt in the history (a `ctx.session()` commit moved it there while its
    handler goes on); a later attempt, a reap that requeued or failed it, a cancel: the
    write is dropped."""
    return or_(
        exists().where(
            jobs.c.id == bindparam("job_id"),
            jobs.c.attempts == bindparam("attempt"),
            jobs.c.status.in_(("running", "done")),
        ),
        exists().where(
            history.c.id == bindparam("job_id"),
            history.c.attempts == bindparam("attempt"),
            history.c.status == "done",
        ),
    )


def _job_reached_attempt() -> ColumnElement[bool]:
    """The job `:job_id` still exists, in the jobs table or the history, and has had attempt
    `:attempt` (a job deleted meanwhile gets no lines: nothing would delete them)."""
    return or_(
        exists().where(jobs.c.id == bindparam("job_id"), jobs.c.attempts >= bindparam("attempt")),
        exists().where(
            history.c.id == bindparam("job_id"), history.c.attempts >= bindparam("attempt")
        ),
    )


def _insert_where(table: Table, fence: ColumnElement[bool], *names: str) -> Insert:
    """Insert one row of `table`, its columns `names` from the parameters of those names,
    only while `fence` holds."""
    values = select(*(bindparam(name, type_=table.c[name].type) for name in names))
    return insert(table).from_select(list(names), values.where(fence))


def write_progress() -> Insert:
    """Set job `:job_id`'s progress to `:fraction`, `:message` for attempt `:attempt`,
    fenced: only while the attempt holds the job (or finished it), and an older attempt
    never overwrites a newer one's."""
    columns = ("job_id", "attempt", "fraction", "message")
    statement = _insert_where(job_progress, _attempt_holds_job(), *columns)
    return statement.on_conflict_do_update(
        index_elements=[job_progress.c.job_id],
        set_={
            "attempt": statement.excluded.attempt,
            "fraction": statement.excluded.fraction,
            "message": statement.excluded.message,
            "updated_at": statement.excluded.updated_at,
        },
        where=job_progress.c.attempt <= statement.excluded.attempt,
    )


def write_logs() -> Insert:
    """Keep attempt `:attempt`'s log lines `:lines` (a JSON array) of job `:job_id`, with
    `:dropped` lines past the cap, while the job exists. A run of the same attempt again (a
    snooze spends no attempt) adds its lines after the first run's, up to `:cap` lines
    in all; past it, they are counted as dropped."""
    columns = ("job_id", "attempt", "lines", "dropped")
    statement = _insert_where(job_logs, _job_reached_attempt(), *columns)
    kept, added = job_logs.c.lines, statement.excluded.lines
    fits = func.jsonb_array_length(kept) + func.jsonb_array_length(added) <= bindparam("cap")
    return statement.on_conflict_do_update(
        index_elements=[job_logs.c.job_id, job_logs.c.attempt],
        set_={
            "lines": case((fits, kept.op("||")(added)), else_=kept),
            "dropped": job_logs.c.dropped
            + statement.excluded.dropped
            + case((fits, 0), else_=func.jsonb_array_length(added)),
        },
    )


def read_progress() -> Select[tuple[int, float | None, str | None, object]]:
    """Job `:job_id`'s progress: attempt, fraction, message, updated_at (no row: none)."""
    return select(
        job_progress.c.attempt,
        job_progress.c.fraction,
        job_progress.c.message,
        job_progress.c.updated_at,
    ).where(job_progress.c.job_id == bindparam("job_id"))


def read_logs() -> Select[tuple[int, list[dict[str, object]], int]]:
    """Job `:job_id`'s kept log lines, per attempt in order: attempt, lines, dropped."""
    return (
        select(job_logs.c.attempt, job_logs.c.lines, job_logs.c.dropped)
        .where(job_logs.c.job_id == bindparam("job_id"))
        .order_by(job_logs.c.attempt)
    )
