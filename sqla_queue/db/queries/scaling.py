"""The autoscaling signal's statements (`sqla_queue.db.scaling`): each reads a partial
index's backlog rows (bounded), the live workers, the running jobs (bounded by the workers'
slots) or the rollup, never the finished jobs, whatever the table's history."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, TextClause, func, select, text

from sqla_queue.db.queries.common import workers
from sqla_queue.db.queries.workers import session_alive

READY_AND_OLDEST: TextClause = text(
    """
    SELECT q.name, q.paused, q.retention,
      (SELECT count(*) FROM (SELECT 1 FROM sqla_queue.jobs j WHERE j.queue = q.name
         AND j.status = 'queued' AND j.run_at <= now() LIMIT :cap) s) AS ready,
      (SELECT extract(epoch FROM now() - min(first.run_at)) FROM (
         WITH RECURSIVE levels(priority) AS (
           (SELECT j.priority FROM sqla_queue.jobs j
             WHERE j.queue = q.name AND j.status = 'queued' ORDER BY j.priority LIMIT 1)
           UNION ALL
           SELECT (SELECT j.priority FROM sqla_queue.jobs j
                    WHERE j.queue = q.name AND j.status = 'queued' AND j.priority > l.priority
                    ORDER BY j.priority LIMIT 1)
           FROM levels l WHERE l.priority IS NOT NULL)
         SELECT (SELECT j.run_at FROM sqla_queue.jobs j
                  WHERE j.queue = q.name AND j.status = 'queued' AND j.priority = l.priority
                  ORDER BY j.run_at LIMIT 1) AS run_at
         FROM levels l WHERE l.priority IS NOT NULL) first
       WHERE first.run_at <= now()) AS oldest_ready_age
    FROM sqla_queue.queues q
    WHERE CAST(:queue AS text) IS NULL OR q.name = CAST(:queue AS text)
    ORDER BY q.name
    """
)
"""Per queue of the queues table (only `:queue`'s if not NULL): (name, paused, retention,
ready jobs up to `:cap`, seconds since the oldest ready job was due). Both from the claim index
(`queue, priority, run_at`): the count stops at the cap, and the oldest is found by one
probe per distinct priority (a loose index scan), not by reading the backlog."""

ESTIMATED_READY: TextClause = text(
    "EXPLAIN (FORMAT JSON) SELECT 1 FROM sqla_queue.jobs "
    "WHERE queue = :queue AND status = 'queued' AND run_at <= now()"
)
"""The planner's estimate of `:queue`'s ready jobs: a capped count's stand-in."""

RUNNING_BY_WORKER: TextClause = text(
    """
    SELECT j.queue, j.locked_by, count(*) AS held,
      count(*) FILTER (WHERE j.started_at IS NOT NULL) AS started
    FROM sqla_queue.jobs j WHERE j.status = 'running'
    GROUP BY j.queue, j.locked_by
    """
)
"""(queue, worker id, running rows, of them those whose handler started): the running rows
only (the lease index), a number bounded by the live workers' slots."""

_registered = workers.alias("w")
LIVE_WORKERS: Select[Any] = select(
    _registered.c.id, _registered.c.queues, _registered.c.concurrency
).where(_registered.c.expires_at > func.now(), session_alive(_registered))
"""The live workers: registered, the registration not expired, and the session still there
(`sqla_queue.db.queries.workers.session_alive`). (id, queues or NULL for every queue,
concurrency)."""

RECENT_ENDED: TextClause = text(
    """
    SELECT c.queue, sum(c.succeeded + c.failed) AS ended, sum(c.succeeded) AS succeeded
    FROM sqla_queue.job_counts c
    WHERE c.minute >= date_trunc('minute', now()) - make_interval(secs => :seconds)
      AND c.minute < date_trunc('minute', now())
    GROUP BY c.queue
    """
)
"""Per queue: jobs ended (and of them succeeded) over the `:seconds` of whole minutes before
the current one, from the rollup (`job_counts`): a few rows per queue."""

RECENT_CREATED: TextClause = text(
    """
    SELECT w.queue, count(*) FILTER (
             WHERE w.created_at >= date_trunc('minute', now()) - make_interval(secs => :seconds)
               AND w.created_at < date_trunc('minute', now())) AS created,
           count(*) AS searched,
           min(w.created_at) AS oldest
    FROM (SELECT j.queue, j.created_at FROM sqla_queue.jobs j ORDER BY j.id DESC
          LIMIT :window) w
    GROUP BY GROUPING SETS ((w.queue), ())
    """
)
"""Of the newest `:window` jobs (the primary key walked backwards), per queue: those created
in the `:seconds` of whole minutes before the current one; and one row with a NULL queue:
how many were searched and the oldest one's creation time (whether the window reached back
that far)."""

RATE_SPAN: TextClause = text(
    "SELECT date_trunc('minute', now()) - make_interval(secs => :seconds), "
    "date_trunc('minute', now())"
)
"""Where the rates' minutes start and end."""
