"""The workers table: each live worker's registration and its fast heartbeat; and
`stopped_workers`, the workers that stopped in the last day and how."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    Insert,
    Integer,
    Select,
    Table,
    Text,
    any_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_queue.db.models import JobStatus, StoppedWorker
from sqla_queue.db.queries.claim import limited_queue
from sqla_queue.db.queries.common import (
    jobs,
    queue_names_param,
    queues,
    seconds_param,
    seconds_since,
    status_is,
    workers,
)

stopped = cast(Table, StoppedWorker.__table__)


def beat_worker() -> Insert:
    """Register worker `:worker_id`, or extend its registration: it expires `:stale_after`
    seconds from now unless beaten again. Parameters also `hostname`, `pid`, `queues`,
    `concurrency`. An upsert, so a worker whose row was removed (it was thought dead)
    registers again. `loop_blocked_for`: seconds the worker's event loop has not run, or
    None while it runs (`loop_blocked_since`); `overruns`: the handlers past their timeout
    or cancel that have not returned (a list as jsonb, or None). Returns `limits`: whether
    any queue has a concurrency or rate limit, or takes turns (the worker's claim then takes
    the statement that honours them, `claim_jobs`)."""
    expires = func.now() + seconds_param("stale_after")
    statement = pg_insert(workers).values(
        id=bindparam("worker_id", type_=Text),
        hostname=bindparam("hostname", type_=Text),
        pid=bindparam("pid", type_=Integer),
        queues=queue_names_param(),
        concurrency=bindparam("concurrency", type_=Integer),
        expires_at=expires,
        loop_blocked_since=func.now() - seconds_param("loop_blocked_for", optional=True),
        overruns=bindparam("overruns", None, type_=JSONB(none_as_null=True)),
    )
    limited = exists().where(limited_queue(queues))
    return statement.on_conflict_do_update(
        index_elements=[workers.c.id],
        set_={
            "heartbeat_at": func.now(),
            "expires_at": statement.excluded.expires_at,
            "loop_blocked_since": statement.excluded.loop_blocked_since,
            "overruns": statement.excluded.overruns,
        },
    ).returning(limited.label("limits"))


STOPPED_KEPT = "1 day"
"""How long a stopped worker stays in `stopped_workers` (an SQL interval)."""

STOPPED_COLUMNS = ("id", "hostname", "pid", "queues", "concurrency", "started_at", "heartbeat_at")
"""The columns a registration hands on to `stopped_workers` when it is removed."""


def _record_stopped(gone: Any, how: str) -> Insert:
    """`INSERT INTO stopped_workers ... SELECT ... FROM gone` (the registrations a CTE just
    deleted), `how` = graceful or lost; an id already there (a worker that was thought
    lost, came back and stopped again) is updated. Returns the recorded rows."""
    how_value = literal_column(f"'{how}'", Text)  # one of two constants, never input
    statement = pg_insert(stopped).from_select(
        [*STOPPED_COLUMNS, "how"],
        select(*(gone.c[name] for name in STOPPED_COLUMNS), how_value),
    )
    return statement.on_conflict_do_update(
        index_elements=[stopped.c.id],
        set_={
            **{name: statement.excluded[name] for name in STOPPED_COLUMNS[1:]},
            "stopped_at": func.now(),
            "how": statement.excluded.how,
        },
    ).returning(stopped.c.id, stopped.c.hostname, stopped.c.pid)


def _removed(*where: Any) -> Any:
    """`DELETE FROM workers WHERE ... RETURNING` the columns `stopped_workers` keeps, as a CTE."""
    return (
        delete(workers)
        .where(*where)
        .returning(*(workers.c[name] for name in STOPPED_COLUMNS))
        .cte("gone")
    )


def deregister_worker() -> Insert:
    """Remove worker `:worker_id`'s registration (it stopped cleanly) and record it in
    `stopped_workers` as `graceful`, in one statement."""
    gone = _removed(workers.c.id == bindparam("worker_id", type_=Text))
    return _record_stopped(gone, "graceful").add_cte(gone)


def delete_expired_workers() -> Insert:
    """Remove expired registrations that hold no running job any more (after the reap),
    recording each in `stopped_workers` as `lost`; the same statement prunes the workers
    that stopped more than `STOPPED_KEPT` ago (an index range of a small table). Returns
    (id, hostname, pid) of each worker found lost."""
    holds = exists().where(jobs.c.locked_by == workers.c.id, status_is(JobStatus.running))
    gone = _removed(workers.c.expires_at < func.now(), ~holds)
    pruned = (
        delete(stopped)
        .where(
            stopped.c.stopped_at < func.now() - literal_column(f"interval '{STOPPED_KEPT}'"),
            stopped.c.id.not_in(select(gone.c.id)),  # never one row twice in a statement
        )
        .cte("pruned")
    )
    return _record_stopped(gone, "lost").add_cte(gone).add_cte(pruned)


def stopped_workers() -> Select[Any]:
    """The workers that stopped in the last `STOPPED_KEPT`, the latest first, at most
    `:limit`: (id, hostname, pid, queues, concurrency, started_at, heartbeat_at,
    stopped_at, how)."""
    return (
        select(stopped)
        .where(stopped.c.stopped_at >= func.now() - literal_column(f"interval '{STOPPED_KEPT}'"))
        .order_by(stopped.c.stopped_at.desc(), stopped.c.id)
        .limit(bindparam("limit", type_=Integer))
    )


def running_jobs_of_workers() -> Select[Any]:
    """The running jobs of the workers `:worker_ids`, the first `:per_worker` (by id) of
    each: (worker_id, id, task, queue, attempts, seconds since its handler started, or NULL
    until its worker reported the start)."""
    ranked = (
        select(
            jobs.c.locked_by.label("worker_id"),
            jobs.c.id,
            jobs.c.task,
            jobs.c.queue,
            jobs.c.attempts,
            seconds_since(jobs.c.started_at).label("running_seconds"),
            func.row_number().over(partition_by=jobs.c.locked_by, order_by=jobs.c.id).label("rank"),
        )
        .where(
            status_is(JobStatus.running),
            jobs.c.locked_by == any_(bindparam("worker_ids", type_=ARRAY(Text))),
        )
        .subquery("ranked")
    )
    return (
        select(*(c for c in ranked.c if c.name != "rank"))
        .where(ranked.c.rank <= bindparam("per_worker", type_=Integer))
        .order_by(ranked.c.worker_id, ranked.c.id)
    )


def live_workers() -> Select[Any]:
    """(id, hostname, pid, queues, concurrency, started_at, seconds since its heartbeat,
    running jobs (their handlers started), claimed jobs (held, waiting for a handler
    thread, or started since its last beat), seconds its event loop has been blocked or
    NULL, its overrunning handlers or NULL) of every registered worker that has not
    expired."""
    held = (
        select(
            func.count().filter(jobs.c.started_at.is_not(None)).label("running"),
            func.count().filter(jobs.c.started_at.is_(None)).label("claimed"),
        )
        .where(jobs.c.locked_by == workers.c.id, status_is(JobStatus.running))
        .lateral("held")
    )
    return (
        select(
            workers.c.id,
            workers.c.hostname,
            workers.c.pid,
            workers.c.queues,
            workers.c.concurrency,
            workers.c.started_at,
            seconds_since(workers.c.heartbeat_at).label("silent_seconds"),
            held.c.running,
            held.c.claimed,
            seconds_since(workers.c.loop_blocked_since).label("loop_blocked_seconds"),
            workers.c.overruns,
        )
        .select_from(workers.join(held, true()))
        .where(workers.c.expires_at >= func.now())
        .order_by(workers.c.started_at)
    )
