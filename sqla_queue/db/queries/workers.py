"""The workers table: each live worker's registration and its fast heartbeat; and
`stopped_workers`, the workers that stopped in the last day and how."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Insert,
    Integer,
    Select,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    or_,
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
    `concurrency`, `version` and `schema_revision` (the package version it runs and the
    schema revision it was built for), and `session_pid` (the backend of the connection it
    holds open while it runs, or None: the autoscaling signal's sign of life). An upsert,
    so a worker whose row was removed (it was thought dead) registers again.
    `loop_blocked_for`: seconds the worker's event loop has not run, or None while it runs
    (`loop_blocked_since`); `overruns`: the handlers
    past their timeout or cancel that have not returned (a list as jsonb, or None).
    Returns `limits`: whether any queue has a concurrency or rate limit, or takes turns
    (the worker's claim then takes the statement that honours them, `claim_jobs`)."""
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
        version=bindparam("version", None, type_=Text),
        schema_revision=bindparam("schema_revision", None, type_=Text),
        session_pid=bindparam("session_pid", None, type_=Integer),
    )
    limited = exists().where(limited_queue(queues))
    return statement.on_conflict_do_update(
        index_elements=[workers.c.id],
        set_={
            "heartbeat_at": func.now(),
            "expires_at": statement.excluded.expires_at,
            "loop_blocked_since": statement.excluded.loop_blocked_since,
            "overruns": statement.excluded.overruns,
            "session_pid": statement.excluded.session_pid,
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
    """Remove expired registrations that hold no running job any more (after the reap) and
    whose session is gone (`session_seen`: a worker still connected is late, not lost),
    never the reaper's own (`not_the_reaper`), recording each in `stopped_workers` as
    `lost`; the same statement prunes the workers that stopped more than `STOPPED_KEPT` ago
    (an index range of a small table). Returns (id, hostname, pid) of each worker found
    lost."""
    holds = exists().where(jobs.c.locked_by == workers.c.id, status_is(JobStatus.running))
    gone = _removed(workers.c.expires_at < func.now(), ~holds, ~session_seen(), not_the_reaper())
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


def session_alive(registered: Any = workers) -> ColumnElement[bool]:
    """Whether a registered worker's session is still there: the backend of the connection it
    holds open while it runs (`session_pid`, its LISTEN's) still in the server's activity. A
    SIGKILLed worker's connections close and the server ends their backends, so it drops out
    at the next read, not when its registration expires. A worker that records no session
    (`poll_only`, as behind PgBouncer's transaction pooling; a release before sqlaq_0029; its
    listener reconnecting) and every worker read from a standby (which does not see the
    primary's backends) are judged by expiry alone. `registered`: the workers table or an
    alias of it."""
    return or_(
        registered.c.session_pid.is_(None), func.pg_is_in_recovery(), session_seen(registered)
    )


def not_the_reaper() -> ColumnElement[bool]:
    """A registration other than the reaping worker's own (`:reaper_id`, NULL: every one):
    a worker that reaps is alive, even when a starved thread let its registration lapse."""
    return workers.c.id.is_distinct_from(bindparam("reaper_id", None, type_=Text))


def session_seen(registered: Any = workers) -> ColumnElement[bool]:
    """Whether a registered worker recorded its session and its backend is in the server's
    activity (read on the primary: a standby does not see the primary's backends)."""
    pid = registered.c.session_pid
    return and_(
        pid.is_not(None),
        exists(select(literal_column("1")).select_from(func.pg_stat_get_activity(pid))),
    )


def live_workers() -> Select[Any]:
    """(id, hostname, pid, queues, concurrency, started_at, seconds since its heartbeat,
    running jobs (their handlers started), claimed jobs (held, waiting for a handler
    thread, or started since its last beat), seconds its event loop has been blocked or
    NULL, its overrunning handlers or NULL, its package version and the schema revision it
    was built for (NULL from a release before sqlaq_0022)) of every registered worker that
    has not expired and whose session is still there (`session_alive`)."""
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
            workers.c.version,
            workers.c.schema_revision,
        )
        .select_from(workers.join(held, true()))
        .where(workers.c.expires_at >= func.now(), session_alive())
        .order_by(workers.c.started_at)
    )


READ_COMMITTED_SESSION = (
    "SELECT set_config('default_transaction_isolation', 'read committed', false) "
    "WHERE current_setting('default_transaction_isolation') <> 'read committed'"
)
"""Not expressible in Core: the session's statements at READ COMMITTED from now on, when the
server's (or the database's, or the role's) default is stricter; a row when it changed one.
The queue's statements are fenced and short: at REPEATABLE READ or SERIALIZABLE two workers'
claims, or a finish and a heartbeat of the same row, fail each other with a serialization
failure instead of one waiting for the other."""

RESET_ISOLATION = "RESET default_transaction_isolation"
"""What undoes `READ_COMMITTED_SESSION` before a pooled connection goes back to the pool."""

TRANSACTION_READ_ONLY = "SELECT current_setting('transaction_read_only') = 'on'"
"""Whether the server accepts no writes in this session's transactions: a standby (in
recovery), or `default_transaction_read_only = on` (a demoted primary); the worker's
readiness check asks it."""
