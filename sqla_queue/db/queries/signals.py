"""Signals and the jobs that wait for them: sending (through the SQL function
`sqla_queue.signal`, migration sqlaq_0019_signals), a waiting job's reads and its park, the
keeper's wake at a deadline, the mailbox's upkeep, and what doctor and `jobs show` read.

The race a signal and a park could lose (a sender that commits between a waiter's look at
the mailbox and its park) is closed by an advisory lock of the key: the sender takes it
shared (senders never wait for each other), the waiter takes it exclusive to look again
and park, so one of the two always sees the other. No foreign key, no row lock on a job
but the park's own fenced UPDATE: no MultiXact.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    Delete,
    Integer,
    Select,
    Table,
    Text,
    TextClause,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.db.models import (
    DEFAULT_MAX_ATTEMPTS,
    JobStatus,
    Signal,
    SignalWait,
)
from sqla_queue.db.queries.common import ONE, jobs, literal_text, seconds_param, status_is

signals = cast(Table, Signal.__table__)
signal_waits = cast(Table, SignalWait.__table__)

SIGNAL_LOCK_SPACE = 1936813171
"""The advisory lock namespace of signal keys ('sqls' as an int4), keyed by `hashtext(key)`:
the SQL function takes the key's lock shared, a parking waiter exclusive."""
PARK_LOCK_TIMEOUT = "1s"
"""How long a parking waiter waits for a sender's open transaction on its key before it
gives up and is put back to run again a moment later (it never blocks longer)."""
WAKE_BATCH = 1000
"""Jobs the keeper wakes, and signals or waits it deletes, per statement at most."""


def _key() -> Any:
    # not `key`, `job_id`, `seq` or `attempt`: a bound parameter named after a column of
    # the table an UPDATE or INSERT writes is taken for that column's new value
    return bindparam("wait_key", type_=Text)


def _waits_for_signal(table: Any = jobs) -> ColumnElement[bool]:
    """A job parked by `ctx.wait_for_signal`: the predicate of the partial indexes
    `ix_jobs_signal_key` and `ix_jobs_signal_deadline`, spelled as they are."""
    return and_(status_is(JobStatus.waiting, table), table.c.signal_key.is_not(None))


# -- sending ---------------------------------------------------------------------------------


def send_signal() -> Select[Any]:
    """`SELECT sqla_queue.signal(:key, :payload, :wake, :expires_in seconds)`: the number of
    jobs it woke. Parameters: `key`, `payload` (JSON, or None), `wake` ('one' or 'all'),
    `expires_in` (seconds)."""
    return select(
        func.sqla_queue.signal(
            bindparam("key", type_=Text),
            bindparam("payload", type_=JSONB(none_as_null=True)),
            bindparam("wake", type_=Text),
            seconds_param("expires_in"),
            type_=Integer,
        )
    )


# -- a waiting job's side --------------------------------------------------------------------


def _this_wait() -> tuple[ColumnElement[bool], ...]:
    return (
        signal_waits.c.job_id == bindparam("waiter_id"),
        signal_waits.c.key == _key(),
        signal_waits.c.seq == bindparam("wait_seq", type_=Integer),
    )


def wait_state() -> Select[Any]:
    """One wait of a job (`waiter_id`, `wait_key`, `wait_seq`): its state, payload, deadline, and
    whether the deadline has passed (by the database's clock)."""
    return select(
        signal_waits.c.state,
        signal_waits.c.payload,
        signal_waits.c.deadline,
        (signal_waits.c.deadline <= func.now()).label("due"),
    ).where(*_this_wait())


def begin_wait() -> Insert:
    """Record a wait that begins now, its deadline `timeout` seconds away (`waiter_id`,
    `wait_key`, `wait_seq`, `waiter_attempt`, `timeout`); nothing if the job began it in
    an earlier run (the deadline stays the first run's)."""
    return (
        pg_insert(signal_waits)
        .values(
            job_id=bindparam("waiter_id"),
            key=_key(),
            seq=bindparam("wait_seq", type_=Integer),
            state=literal_text("waiting"),
            deadline=func.now() + seconds_param("timeout"),
            attempt=bindparam("waiter_attempt", type_=Integer),
        )
        .on_conflict_do_nothing()
    )


def _fence() -> Any:
    """The job is still this attempt's: running, at `:attempt`."""
    return exists(
        select(ONE).where(
            jobs.c.id == bindparam("waiter_id"),
            jobs.c.attempts == bindparam("waiter_attempt", type_=Integer),
            status_is(JobStatus.running),
        )
    )


def take_signal() -> Select[Any]:
    """Consume the oldest signal for `wait_key` this job may have, fenced on its attempt
    (`waiter_attempt`), and record it as the answer of wait (`waiter_id`, `wait_key`,
    `wait_seq`), in one statement: a `one`
    signal is deleted (the first of its readers to lock it wins, the others skip it), an
    `all` signal is read if this job has not read it yet. Returns (`taken`, `recorded`,
    `payload`): a caller seeing taken without recorded rolls back (the wait was answered
    already, by a stale run), so no signal is lost."""
    s = signals.alias("s")
    live = and_(s.c.key == _key(), s.c.expires_at > func.now(), _fence())
    one = (
        select(s.c.id)
        .where(live, s.c.wake == literal_text("one"))
        .order_by(s.c.id)
        .limit(ONE)
        .with_for_update(skip_locked=True)
        .cte("one")
    )
    read = signal_waits.alias("r")
    unread = ~exists(
        select(ONE).where(read.c.job_id == bindparam("waiter_id"), read.c.signal_id == s.c.id)
    )
    broadcast = (
        select(s.c.id)
        .where(live, s.c.wake == literal_text("all"), unread)
        .order_by(s.c.id)
        .limit(ONE)
        .cte("broadcast")
    )
    candidates = union_all(select(one.c.id), select(broadcast.c.id)).subquery("c")
    pick = select(candidates.c.id).order_by(candidates.c.id).limit(ONE).cte("pick")
    taken = (
        delete(signals)
        .where(signals.c.id == select(pick.c.id).scalar_subquery())
        .where(signals.c.wake == literal_text("one"))
        .returning(signals.c.id, signals.c.payload)
        .cte("taken")
    )
    shared = (
        select(signals.c.id, signals.c.payload)
        .where(signals.c.id == select(pick.c.id).scalar_subquery())
        .where(signals.c.wake == literal_text("all"))
    )
    got = union_all(select(taken.c.id, taken.c.payload), shared).cte("got")
    recorded = (
        update(signal_waits)
        .where(*_this_wait(), signal_waits.c.state == literal_text("waiting"))
        .values(
            state=literal_text("received"),
            signal_id=select(got.c.id).scalar_subquery(),
            payload=select(got.c.payload).scalar_subquery(),
            attempt=bindparam("waiter_attempt", type_=Integer),
            resolved_at=func.now(),
        )
        .where(exists(select(ONE).select_from(got)))
        .returning(signal_waits.c.payload)
        .cte("recorded")
    )
    return select(
        select(func.count()).select_from(got).scalar_subquery().label("taken"),
        select(func.count()).select_from(recorded).scalar_subquery().label("recorded"),
        select(recorded.c.payload).scalar_subquery().label("payload"),
    )


def lock_key_exclusive() -> Select[Any]:
    """The key's advisory transaction lock, exclusive: a parking waiter's (it waits for the
    open transactions of the key's senders, up to the lock timeout set before)."""
    return select(func.pg_advisory_xact_lock(SIGNAL_LOCK_SPACE, func.hashtext(_key())))


def park_lock_timeout() -> TextClause:
    """`SET LOCAL lock_timeout` for the park's transaction (`PARK_LOCK_TIMEOUT`)."""
    return text(f"SET LOCAL lock_timeout = '{PARK_LOCK_TIMEOUT}'")


def time_out_wait() -> Update:
    """Answer wait (`waiter_id`, `wait_key`, `wait_seq`) with its timeout, if its deadline
    has passed and the job is still this attempt's; returns its deadline when it did."""
    return (
        update(signal_waits)
        .where(
            *_this_wait(),
            signal_waits.c.state == literal_text("waiting"),
            signal_waits.c.deadline <= func.now(),
            _fence(),
        )
        .values(
            state=literal_text("timed_out"),
            attempt=bindparam("waiter_attempt", type_=Integer),
            resolved_at=func.now(),
        )
        .returning(signal_waits.c.deadline)
    )


def park_job() -> Update:
    """Park a running job (`waiter_id` at `waiter_attempt`) in `waiting` for signal
    `wait_key` until the deadline of its wait (`wait_seq`): no slot held, its attempt
    refunded as a snooze refunds it (max_attempts grows by one, the attempt number keeps
    counting: still a fencing token).
    `task_max_attempts` is its task's own budget, or NULL. Returns the job's id, or nothing
    when the job is no longer this attempt's or the wait has been answered meanwhile."""
    deadline = select(signal_waits.c.deadline).where(*_this_wait()).scalar_subquery()
    budget = func.coalesce(
        jobs.c.max_attempts,
        bindparam("task_max_attempts", type_=Integer),
        literal_column(str(DEFAULT_MAX_ATTEMPTS), Integer),
    )
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("waiter_id"),
            jobs.c.attempts == bindparam("waiter_attempt", type_=Integer),
            status_is(JobStatus.running),
            exists(
                select(ONE).where(*_this_wait(), signal_waits.c.state == literal_text("waiting"))
            ),
        )
        .values(
            status=literal_text(JobStatus.waiting.value),
            signal_key=_key(),
            run_at=deadline,
            max_attempts=budget + ONE,
            last_error=None,
            locked_by=None,
            locked_at=None,
            heartbeat_at=None,
            lease_expires_at=None,
            started_at=None,
        )
        .returning(jobs.c.id)
    )


# -- the keeper's wake and upkeep ------------------------------------------------------------


def wake_waiting_jobs() -> Update:
    """Queue the parked jobs that must run again: past their wait's deadline (they time out
    when they run), or with a signal in the mailbox they have not read (a sender whose
    snapshot predates the park, REPEATABLE READ or SERIALIZABLE; a woken job cancelled
    before it consumed its signal). Returns each woken job's queue (to NOTIFY)."""
    j, s, read = jobs.alias("j"), signals.alias("s"), signal_waits.alias("r")
    unread = ~exists(
        select(ONE).where(read.c.job_id == j.c.id, read.c.signal_id == s.c.id).correlate(j, s)
    )
    unread_signal = exists(
        select(ONE)
        .where(
            s.c.key == j.c.signal_key,
            s.c.expires_at > func.now(),
            or_(s.c.wake == literal_text("one"), unread),
        )
        .correlate(j)
    )
    due = (
        select(j.c.id)
        .where(_waits_for_signal(j), or_(j.c.run_at <= func.now(), unread_signal))
        .limit(WAKE_BATCH)
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    return (
        update(jobs)
        .where(jobs.c.id == due.c.id, _waits_for_signal())
        .values(status=literal_text(JobStatus.queued.value), run_at=func.now())
        .returning(jobs.c.queue)
    )


def delete_expired_signals() -> Delete:
    """Delete up to `WAKE_BATCH` expired signals, consumed or not (the workers' upkeep)."""
    expired = (
        select(signals.c.id)
        .where(signals.c.expires_at <= func.now())
        .limit(WAKE_BATCH)
        .scalar_subquery()
    )
    return delete(signals).where(signals.c.id.in_(expired))


def delete_orphan_waits() -> Delete:
    """Delete up to `WAKE_BATCH` waits of jobs that no longer exist (deleted, pruned or
    archived): no foreign key does it, so the workers' upkeep does."""
    w = signal_waits.alias("w")
    gone = (
        select(w.c.job_id)
        .where(~exists(select(ONE).where(jobs.c.id == w.c.job_id)))
        .limit(WAKE_BATCH)
        .scalar_subquery()
    )
    return delete(signal_waits).where(signal_waits.c.job_id.in_(gone))


# -- what is shown ---------------------------------------------------------------------------


def job_waits() -> Select[Any]:
    """The signal waits of job `job_id`, in the order they began: key, seq, state, deadline,
    payload, started_at, resolved_at (`jobs show`, the dashboard's job page)."""
    return (
        select(
            signal_waits.c.key,
            signal_waits.c.seq,
            signal_waits.c.state,
            signal_waits.c.deadline,
            signal_waits.c.payload,
            signal_waits.c.started_at,
            signal_waits.c.resolved_at,
        )
        .where(signal_waits.c.job_id == bindparam("job_id"))
        .order_by(signal_waits.c.started_at, signal_waits.c.key, signal_waits.c.seq)
    )


def waiting_for_signals() -> Select[Any]:
    """Jobs parked for a signal, per queue: (queue, count) (the metrics)."""
    return (
        select(jobs.c.queue, func.count())
        .where(_waits_for_signal())
        .group_by(jobs.c.queue)
        .order_by(jobs.c.queue)
    )


def overdue_waits() -> Select[Any]:
    """Parked jobs still waiting more than `grace` seconds past their deadline (nothing woke
    them: no worker runs the keeper): (count, oldest deadline, their keys, oldest first)."""
    overdue = and_(_waits_for_signal(), jobs.c.run_at < func.now() - seconds_param("grace"))
    statement: Select[Any] = select(  # type: ignore[assignment]
        func.count(),
        func.min(jobs.c.run_at),
        func.array_agg(aggregate_order_by(jobs.c.signal_key, jobs.c.run_at)).label("keys"),
    ).where(overdue)
    return statement


def unread_mailboxes() -> Select[Any]:
    """Keys with at least `min_count` unexpired signals and no job waiting for them:
    (key, count, oldest), biggest first, 5 at most (doctor: a mailbox nobody reads)."""
    nobody_waits = ~exists(
        select(ONE).where(_waits_for_signal(), jobs.c.signal_key == signals.c.key)
    )
    return (
        select(signals.c.key, func.count().label("n"), func.min(signals.c.created_at))
        .where(signals.c.expires_at > func.now(), nobody_waits)
        .group_by(signals.c.key)
        .having(func.count() >= bindparam("min_count", type_=Integer))
        .order_by(func.count().desc(), signals.c.key)
        .limit(5)
    )


__all__ = [
    "PARK_LOCK_TIMEOUT",
    "SIGNAL_LOCK_SPACE",
    "WAKE_BATCH",
    "begin_wait",
    "delete_expired_signals",
    "delete_orphan_waits",
    "job_waits",
    "lock_key_exclusive",
    "overdue_waits",
    "park_job",
    "park_lock_timeout",
    "send_signal",
    "signal_waits",
    "signals",
    "take_signal",
    "time_out_wait",
    "unread_mailboxes",
    "wait_state",
    "wake_waiting_jobs",
]
