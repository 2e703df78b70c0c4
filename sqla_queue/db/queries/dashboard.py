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
    null,
    select,
    text,
    union_all,
)
from sqlalchemy.sql.elements import TextClause

from sqla_queue.db.queries.bulk import Filter, conditions, error_headline
from sqla_queue.db.queries.common import history, job_ids_param, jobs
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
         AND j.status = 'running' AND j.started_at IS NOT NULL LIMIT :cap) s) AS running,
      (SELECT count(*) FROM (SELECT 1 FROM sqla_queue.jobs j WHERE j.queue = q.name
         AND j.status = 'running' AND j.started_at IS NULL LIMIT :cap) s) AS claimed,
      (SELECT count(*) FROM (SELECT 1 FROM sqla_queue.jobs j WHERE j.queue = q.name
         AND j.status = 'waiting' LIMIT :cap) s) AS waiting,
      extract(epoch FROM now() - (SELECT min(j.run_at) FROM sqla_queue.jobs j
         WHERE j.queue = q.name AND j.status = 'queued' AND j.run_at <= now()))
         AS oldest_due_age
    FROM sqla_queue.queues q ORDER BY q.name
    """
)
"""Per queue of the queues table: (name, paused, queued, running (handlers started),
claimed (running rows whose handler has not started), waiting, oldest due age in seconds),
each count stopping at `:cap`. Each reads a partial index's rows only (claim,
lease, waiting): the backlog, never the finished jobs, whatever the table's history."""

NO_JIT: TextClause = text("SET LOCAL jit = off")
"""For the transaction of a read whose estimated cost (a subquery per queue of a queues
table never analyzed) would start JIT compilation: 300 ms of compiling for 50 ms of work."""

ESTIMATED_ROWS: TextClause = text(
    "EXPLAIN (FORMAT JSON) SELECT 1 FROM sqla_queue.jobs"
    " UNION ALL SELECT 1 FROM sqla_queue.jobs_history"
)
"""The planner's estimate of the jobs' rows, in the jobs table and the history (their
statistics scaled to their sizes): a big history makes the counts bounded too."""

ESTIMATED_COUNT: TextClause = text(
    "EXPLAIN (FORMAT JSON) SELECT 1 FROM sqla_queue.jobs WHERE queue = :queue AND status = :status"
    " UNION ALL SELECT 1 FROM sqla_queue.jobs_history WHERE queue = :queue AND status = :status"
)
"""The planner's estimate of `:queue`'s jobs in `:status`, in the jobs table and the history,
from the column statistics: no row read (the finished statuses' counts on a big table)."""


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


def _newest_of(table: Any, columns: list[Any], before: bool) -> Select[Any]:
    """The newest `:window` rows of `table` (by its id index: the history's partitions'
    primary keys, merged), older than `:before_id` if `before`."""
    statement = select(*columns).order_by(table.c.id.desc()).limit(bindparam("window"))
    if before:
        statement = statement.where(table.c.id < bindparam("before_id", type_=BigInteger))
    return statement


def _newest(before: bool) -> Any:
    """The newest `:window` jobs of the jobs table and the history (older than `:before_id`
    if `before`), newest first."""
    names = (*LISTED, "last_error", "errors", "args")
    live = _newest_of(jobs, [*(jobs.c[n] for n in names), jobs.c.signal_key], before)
    kept = _newest_of(
        history, [*(history.c[n] for n in names), null().cast(Text).label("signal_key")], before
    )
    both = union_all(live.subquery().select(), kept.subquery().select()).subquery("both")
    return select(both).order_by(both.c.id.desc()).limit(bindparam("window")).subquery("window")


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
    both = union_all(
        _newest_of(jobs, [jobs.c.id], before).subquery().select(),
        _newest_of(history, [history.c.id], before).subquery().select(),
    ).subquery("both")
    ids = select(both.c.id).order_by(both.c.id.desc()).limit(bindparam("window"))
    searched = ids.subquery("searched")
    # A cast: SQLAlchemy 2.0 and 2.1 type a two-column Select differently.
    return cast("Select[Any]", select(func.min(searched.c.id), func.count()))
