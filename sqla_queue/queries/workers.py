"""The workers table: each live worker's registration and its fast heartbeat."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Delete,
    Insert,
    Integer,
    Select,
    Text,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_queue.models import JobStatus

from .common import _is, _seconds, jobs, queue_names_param, queues, seconds_since, workers


def beat_worker() -> Insert:
    """Register worker `:worker_id`, or extend its registration: it expires `:stale_after`
    seconds from now unless beaten again. Parameters also `hostname`, `pid`, `queues`,
    `concurrency`. An upsert, so a worker whose row was removed (it was thought dead)
    registers again. `loop_blocked_for`: seconds the worker's event loop has not run, or
    None while it runs (`loop_blocked_since`); `overruns`: the handlers past their timeout
    or cancel that have not returned (a list as jsonb, or None). Returns `limits`: whether
    any queue has a concurrency or rate limit (the worker's claim then takes the statement
    that honours them, `claim_jobs`)."""
    expires = func.now() + _seconds("stale_after")
    statement = pg_insert(workers).values(
        id=bindparam("worker_id", type_=Text),
        hostname=bindparam("hostname", type_=Text),
        pid=bindparam("pid", type_=Integer),
        queues=queue_names_param(),
        concurrency=bindparam("concurrency", type_=Integer),
        expires_at=expires,
        loop_blocked_since=func.now() - _seconds("loop_blocked_for", optional=True),
        overruns=bindparam("overruns", None, type_=JSONB(none_as_null=True)),
    )
    limited = exists().where(
        or_(queues.c.concurrency.is_not(None), queues.c.rate_limit.is_not(None))
    )
    return statement.on_conflict_do_update(
        index_elements=[workers.c.id],
        set_={
            "heartbeat_at": func.now(),
            "expires_at": statement.excluded.expires_at,
            "loop_blocked_since": statement.excluded.loop_blocked_since,
            "overruns": statement.excluded.overruns,
        },
    ).returning(limited.label("limits"))


def deregister_worker() -> Delete:
    """Remove worker `:worker_id`'s registration (it stopped cleanly)."""
    return delete(workers).where(workers.c.id == bindparam("worker_id", type_=Text))


def delete_expired_workers() -> Delete:
    """Remove expired registrations that hold no running job any more (after the reap)."""
    holds = exists().where(jobs.c.locked_by == workers.c.id, _is(JobStatus.running))
    return delete(workers).where(workers.c.expires_at < func.now(), ~holds)


def live_workers() -> Select[Any]:
    """(id, hostname, pid, queues, concurrency, started_at, seconds since its heartbeat,
    running jobs, seconds its event loop has been blocked or NULL, its overrunning handlers
    or NULL) of every registered worker that has not expired."""
    running = (
        select(func.count())
        .where(jobs.c.locked_by == workers.c.id, _is(JobStatus.running))
        .scalar_subquery()
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
            running.label("running"),
            seconds_since(workers.c.loop_blocked_since).label("loop_blocked_seconds"),
            workers.c.overruns,
        )
        .where(workers.c.expires_at >= func.now())
        .order_by(workers.c.started_at)
    )
