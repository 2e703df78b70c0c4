"""Statements of the observability plugins: queue depth and heartbeat lag
(`sqla_queue.contrib.metrics`), a job's trace context (`sqla_queue.contrib.tracing`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, and_, bindparam, func, or_, select

from sqla_queue.db.models import JobStatus
from sqla_queue.db.queries.common import jobs, seconds_since, status_is, workers
from sqla_queue.job.states import CLAIMED


def queue_depth() -> Select[Any]:
    """Per queue with unfinished jobs: (queue, queued, due, running (handlers started),
    claimed (running rows whose handler has not started), waiting, oldest_due_seconds).

    Reads only queued, running and waiting rows (the partial indexes' rows), never finished
    ones, so its cost follows the backlog, not the table's history.
    """
    queued, running = status_is(JobStatus.queued), status_is(JobStatus.running)
    waiting = status_is(JobStatus.waiting)
    due = and_(queued, jobs.c.run_at <= func.now())
    return (
        select(
            jobs.c.queue,
            func.count().filter(queued).label("queued"),
            func.count().filter(due).label("due"),
            func.count().filter(running, jobs.c.started_at.is_not(None)).label("running"),
            func.count().filter(running, jobs.c.started_at.is_(None)).label(CLAIMED),
            func.count().filter(waiting).label("waiting"),
            seconds_since(func.min(jobs.c.run_at).filter(due)).label("oldest_due_seconds"),
        )
        .where(or_(queued, running, waiting))
        .group_by(jobs.c.queue)
    )


def heartbeat_lag() -> Select[Any]:
    """Seconds since worker `:worker_id` last beat its registration (no row: not registered)."""
    return select(seconds_since(workers.c.heartbeat_at)).where(
        workers.c.id == bindparam("worker_id")
    )


def worker_overruns() -> Select[Any]:
    """Worker `:worker_id`'s handlers past their timeout or cancel that have not returned,
    as of its last heartbeat (jsonb list or NULL; no row: not registered)."""
    return select(workers.c.overruns).where(workers.c.id == bindparam("worker_id"))
