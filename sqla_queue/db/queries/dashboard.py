"""Reads and actions of the web dashboard (`sqla_queue.dashboard`) not covered elsewhere."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Select,
    Text,
    bindparam,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.sql.elements import TextClause

from sqla_queue.db.queries.bulk import Filter, conditions, error_headline
from sqla_queue.db.queries.common import job_ids_param, jobs
from sqla_queue.job.states import FINISHED_SQL

_FINISHED = literal_column(FINISHED_SQL, Text)
"""The predicate of ix_jobs_finished, as a literal so the partial index is usable."""

_IDS = job_ids_param()


BOUNDED_COUNTS: TextClause = text(
    """
    SELECT q.name, q.paused,
      (SELECT count(*) FROM (SELECT 1 FROM sqla_queue.jobs j WHERE j.queue = q.name
         AND j.status = 'queued' LIMIT :cap) s) AS queued,
      (SELECT count(*) FROM (SELECT 1 FROM sqla_queue.jobs j WHERE j.queue = q.name
         AND j.status = 'running' LIMIT :cap) s) AS running,
      (SELECT count(*) FROM (SELECT 1 FROM sqla_queue.jobs j WHERE j.queue = q.name
         AND j.status = 'waiting' LIMIT :cap) s) AS waiting,
      extract(epoch FROM now() - (SELECT min(j.run_at) FROM sqla_queue.jobs j
         WHERE j.queue = q.name AND j.status = 'queued' AND j.run_at <= now()))
         AS oldest_due_age
    FROM sqla_queue.queues q ORDER BY q.name
    """
)
"""Per queue of the queues table: (name, paused, queued, running, waiting, oldest due age
in seconds), each count stopping at `:cap`. Each reads a partial index's rows only (claim,
lease, waiting): the backlog, never the finished jobs, whatever the table's history."""

NO_JIT: TextClause = text("SET LOCAL jit = off")
"""For the transaction of a read whose estimated cost (a subquery per queue of a queues
table never analyzed) would start JIT compilation: 300 ms of compiling for 50 ms of work."""

ESTIMATED_ROWS: TextClause = text("EXPLAIN (FORMAT JSON) SELECT 1 FROM sqla_queue.jobs")
"""The planner's estimate of the jobs table's rows (its statistics scaled to its size)."""

ESTIMATED_COUNT: TextClause = text(
    "EXPLAIN (FORMAT JSON) SELECT 1 FROM sqla_queue.jobs WHERE queue = :queue AND status = :status"
)
"""The planner's estimate of `:queue`'s jobs in `:status`, from the column statistics: no
row read (the finished statuses' counts on a big table)."""


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
    columns = [jobs.c[name] for name in (*LISTED, "last_error", "errors", "args")]
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
            func.left(error_headline(window), 300).label("error_head"),
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
