"""Reads and actions of the web dashboard (`sqla_queue.dashboard`) not covered elsewhere."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    Text,
    bindparam,
    func,
    literal_column,
    select,
    union_all,
)

from sqla_queue.job.states import FINISHED_SQL

from .bulk import Filter, conditions
from .common import archive, job_ids_param, jobs, seconds_since

_FINISHED = literal_column(FINISHED_SQL, Text)
"""The predicate of ix_jobs_finished, as a literal so the partial index is usable."""

_IDS = job_ids_param()


def throughput() -> Select[Any]:
    """(queue, minutes ago 0-59, status, count) of jobs finished in the last hour, from
    the jobs table (retention `keep`, and failed or cancelled ones) and the archive."""
    since = func.now() - literal_column("interval '1 hour'")
    live = select(jobs.c.queue, jobs.c.status, jobs.c.finished_at.label("finished_at")).where(
        _FINISHED, jobs.c.finished_at > since
    )
    archived = select(archive.c.queue, archive.c.status, archive.c.finished_at).where(
        archive.c.finished_at > since
    )
    finished = union_all(live, archived).subquery("finished")
    ago = func.floor(seconds_since(finished.c.finished_at) / 60)
    return (
        select(finished.c.queue, ago.cast(Integer), finished.c.status, func.count())
        .group_by(finished.c.queue, ago, finished.c.status)
        .order_by(finished.c.queue)
    )


LISTED = (
    "id",
    "queue",
    "task",
    "status",
    "priority",
    "attempts",
    "max_attempts",
    "run_at",
    "created_at",
    "finished_at",
    "tags",
    "workflow_id",
    "about",
)


def _newest(before: bool) -> Any:
    """The newest `:window` jobs (older than `:before_id` if `before`), newest first."""
    columns = [jobs.c[name] for name in (*LISTED, "last_error", "args")]
    statement = select(*columns).order_by(jobs.c.id.desc()).limit(bindparam("window"))
    if before:
        statement = statement.where(jobs.c.id < bindparam("before_id", type_=BigInteger))
    return statement.subquery("window")


def job_page(where: Filter, before: bool) -> Select[Any]:
    """One page of jobs, newest first: `:limit` rows matching the filter `where` (see
    `queries.bulk.conditions`) among the `:window` newest jobs (older than `:before_id`
    if `before`).

    The window bounds the rows one page reads whatever the filters' selectivity (a filter
    that matches nothing would otherwise read the whole table): the primary key is walked
    backwards and stops at `:limit` matches or `:window` rows, whichever comes first.
    Only the filters given become conditions (no `:x IS NULL OR ...`, which spoils plans).
    """
    window = _newest(before)
    return (
        select(
            *(window.c[name] for name in LISTED),
            func.right(func.rtrim(window.c.last_error), 300).label("error_tail"),
        )
        .where(*conditions(where, window))
        .order_by(window.c.id.desc())
        .limit(bindparam("limit"))
    )


def window_end(before: bool) -> Select[Any]:
    """(oldest id, rows) of the window `job_page` searched: where the next page starts."""
    ids = select(jobs.c.id).order_by(jobs.c.id.desc()).limit(bindparam("window"))
    if before:
        ids = ids.where(jobs.c.id < bindparam("before_id", type_=BigInteger))
    searched = ids.subquery("searched")
    # A cast: SQLAlchemy 2.0 and 2.1 type a two-column Select differently.
    return cast("Select[Any]", select(func.min(searched.c.id), func.count()))
