"""The job lifecycle after the claim: finish, retry, heartbeat, reap, cancel. The claim is in
`claim`, enqueue's inserts in `inserts`, the NOTIFY channels in `channels`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    Boolean,
    CompoundSelect,
    Delete,
    Float,
    Insert,
    Integer,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import TableValuedAlias

from sqla_queue.db.models import (
    DEFAULT_MAX_ATTEMPTS,
    NOTIFY_CHANNEL,
    JobStatus,
    Retention,
)
from sqla_queue.db.queries.channels import RESULTS_CHANNEL, wake_sequence_successor
from sqla_queue.db.queries.claim import bounded_seconds, effective_max_attempts, limited_queue
from sqla_queue.db.queries.common import (
    ONE,
    ONE_SECOND,
    cancelled_held,
    claimed_batch,
    fenced_rows,
    history,
    job_ids_param,
    jobs,
    jobs_alias,
    literal_text,
    queues,
    seconds_interval,
    status_is,
    workers,
)
from sqla_queue.db.queries.history import (
    ERROR_ENTRY_ARRAYS,
    appended_errors,
    batch_errors,
    ended_attempt_entry,
)
from sqla_queue.db.queries.workers import not_the_reaper, session_seen
from sqla_queue.job.encoding import PENDING_RESULT as PENDING_RESULT
from sqla_queue.job.history import LOST_CLASS
from sqla_queue.job.states import UNIQUE_BITS, statuses
from sqla_queue.job.validation import INT4_MAX

# -- finish ----------------------------------------------------------------------------------

_ENDED = {
    "locked_by": null(),
    "heartbeat_at": null(),
    "lease_expires_at": null(),
    "started_at": null(),
}
"""Values that clear a claim: nothing holds the job any more."""


def _started(table: Any = jobs) -> Any:
    """A finished job's `started_at`: the one its heartbeats recorded, else its claim's time
    (a job that ran without a heartbeat has no other)."""
    return func.coalesce(table.c.started_at, table.c.locked_at)


def _update_fenced(batch: TableValuedAlias) -> Update:
    """An UPDATE of the jobs `batch` names, fenced (`fenced_rows`: only while their claims
    still hold them): every statement that ends a claim with new values starts here."""
    return update(jobs).where(*fenced_rows(batch))


def complete_keep() -> Update:
    """Mark claimed jobs done in `jobs` (what `complete_jobs` does to a `keep` queue's job
    whose unique key blocks while done). Parameters: `job_ids`, `job_attempts`."""
    batch = claimed_batch()
    return _update_fenced(batch).values(
        status=JobStatus.done.value, finished_at=func.now(), started_at=_started()
    )


def complete_delete() -> Delete:
    """Delete a batch of claimed jobs that succeeded (retention `delete`)."""
    batch = claimed_batch()
    return delete(jobs).where(*fenced_rows(batch))


def _history_values(source: CTE) -> tuple[list[str], list[Any]]:
    """The history's column names, and what each takes from `source` (deleted job rows
    whose `started_at` is already the finished job's)."""
    names = [c.name for c in history.c]
    values = [
        literal_text(JobStatus.done.value).label("status")
        if name == "status"
        else func.now().label("finished_at")
        if name == "finished_at"
        else source.c[name]
        for name in names
    ]
    return names, values


def _results_batch() -> TableValuedAlias:
    """The claimed batch with `:job_results`, each a JSON text to keep or NULL (optional)."""
    return claimed_batch(("job_results", "result", Text), optional=True)


def _limited_queue(queue: Any) -> ColumnElement[bool]:
    """Whether `queue` (a column) names a limited queue: its finishes wake other workers."""
    named: ColumnElement[bool] = queue.in_(select(queues.c.name).where(limited_queue()))
    return named


def _wake_limited(queue: Any) -> Any:
    """`pg_notify` on the queue's channel when `queue` is a limited queue (else NULL): a
    finished job frees a slot, and workers that found the queue full wait for this."""
    return case((_limited_queue(queue), func.pg_notify(NOTIFY_CHANNEL, queue)))


def _wake_after(table: Any) -> Any:
    """The notifications a job of `table` (the jobs, an alias or a CTE of their columns)
    sends when it ends or lets go of what it held: its limited queue's (`_wake_limited`) and
    the queue of the next job of its sequence (`wake_sequence_successor`). `num_nulls`
    evaluates both; its value is of no use."""
    return func.num_nulls(
        _wake_limited(table.c.queue), wake_sequence_successor(table.c.sequence, table.c.id)
    )


def _blocks_while_done(table: Any) -> ColumnElement[bool]:
    """Whether a job of `table` blocks its duplicates once `done` (a unique key, and the
    done bit among its `unique_states`): the unique index is on `jobs` only, so such a job
    of a `keep` queue stays there, where it goes on blocking them."""
    done_bit = literal_column(str(UNIQUE_BITS[JobStatus.done.value]), Integer)
    blocks: ColumnElement[bool] = and_(
        table.c.unique_key.is_not(None),
        func.coalesce(table.c.unique_states, 0).op("&", return_type=Integer)(done_bit)
        != literal_column("0", Integer),
    )
    return blocks


def move_kept_done() -> Insert:
    """Move at most `:batch` succeeded jobs that an earlier release left `done` in `jobs`
    (before sqlaq_0030, or before a `keep` queue's jobs moved too) into the history, the
    oldest first, each with its own finish time: what `complete_jobs` would have done. A
    `keep` queue's job whose unique key blocks while done stays (`_blocks_while_done`), as
    does one whose result its handler's session has not stored yet (`PENDING_RESULT`).
    Jobs another transaction holds are skipped. Returns nothing; the rowcount is the count."""
    f, d = jobs_alias("f"), jobs_alias("d")
    keep: ColumnElement[str] = literal_column(f"'{Retention.keep.value}'")
    kept_by = [keep, literal_column(f"'{Retention.archive.value}'")]
    picked = (
        select(f.c.id)
        .join(queues, queues.c.name == f.c.queue)
        .where(
            status_is(JobStatus.done, f),
            queues.c.retention.in_(kept_by),
            ~and_(queues.c.retention == keep, _blocks_while_done(f)),
            f.c.result.is_distinct_from(cast(literal_text(PENDING_RESULT), JSONB)),
        )
        .order_by(f.c.finished_at)
        .limit(bindparam("batch", type_=Integer))
        .with_for_update(of=f, skip_locked=True)
    )
    moved = (
        delete(d)
        .where(d.c.id.in_(picked.scalar_subquery()))
        .returning(*(d.c[column.name] for column in history.c))
        .cte("moved")
    )
    names = [column.name for column in history.c]
    values = [
        func.coalesce(moved.c.finished_at, func.now())
        if name == "finished_at"
        else _started(moved)
        if name == "started_at"
        else moved.c[name]
        for name in names
    ]
    return insert(history).from_select(names, select(*values))


def _completion_ctes() -> tuple[CTE, ...]:
    """Finish a batch of succeeded jobs as each one's queue's retention says, read now.

    The retention is read in the same statement (a queue without a row deletes), so a queue
    whose retention just changed is honoured at once. A job of a `keep` or `archive` queue
    moves to the history (`jobs_history`, the partition of now), deleted from `jobs` and
    inserted there by this one statement; but a `keep` queue's job whose unique key blocks
    its duplicates while `done` (`_blocks_while_done`) stays `done` in `jobs`, under the
    unique index. A job with a result to keep (`:job_results`) of a queue that deletes is
    kept as `done` in `jobs` instead, until its queue's `result_ttl` passes
    (`expire_results`). Each part joins the id arrays to the jobs' primary key, as the
    other finishing statements do (no CTE in between, whose size the planner could not
    know).
    """

    def retention(table: Any) -> Any:
        return func.coalesce(
            select(queues.c.retention).where(queues.c.name == table.c.queue).scalar_subquery(),
            literal_column(f"'{Retention.delete.value}'"),
        )

    def kept_here(table: Any, batch: TableValuedAlias) -> ColumnElement[bool]:
        keep: ColumnElement[str] = literal_column(f"'{Retention.keep.value}'")
        delete_: ColumnElement[str] = literal_column(f"'{Retention.delete.value}'")
        return or_(
            and_(retention(table) == keep, _blocks_while_done(table)),
            and_(retention(table) == delete_, batch.c.result.is_not(None)),
        )

    d, k = jobs_alias("d"), jobs_alias("k")  # short names keep the text short (see claim_jobs)
    gone, stays = _results_batch(), _results_batch()
    returned = [
        gone.c.result.cast(JSONB).label("result")
        if column.name == "result"
        else _started(d).label("started_at")
        if column.name == "started_at"
        else d.c[column.name]
        for column in history.c
    ]
    removed = (
        delete(d)
        .where(*fenced_rows(gone, d), ~kept_here(d, gone))
        .returning(
            *returned,
            retention(d).label("retention"),
            gone.c.result.is_not(None).label("told"),
        )
        .cte("removed")
    )
    names, values = _history_values(removed)
    archived = (
        insert(history)
        .from_select(
            names,
            select(*values).where(
                removed.c.retention.in_(
                    [
                        literal_column(f"'{Retention.keep.value}'"),
                        literal_column(f"'{Retention.archive.value}'"),
                    ]
                )
            ),
        )
        .cte("archived")
    )
    kept = (
        update(k)
        .where(*fenced_rows(stays, k), kept_here(k, stays))
        .values(
            status=literal_text(JobStatus.done.value),
            finished_at=func.now(),
            result=stays.c.result.cast(JSONB),
            **{**_ENDED, "started_at": _started(k)},
        )
        .returning(k.c.id, k.c.queue, k.c.sequence, stays.c.result.is_not(None).label("told"))
        .cte("kept")
    )
    return removed, archived, kept


def complete_jobs() -> Select[Any]:
    """Finish succeeded jobs by their queue's retention (delete, keep or archive), in one
    statement. Parameters: `job_ids`, `job_attempts`, optionally `job_results` (JSON texts
    to keep, or NULLs). Returns how many were still ours.

    On commit it NOTIFYs `RESULTS_CHANNEL` with the id of each job whose result it kept,
    and the queue's channel for limited queues (a slot is free).
    """
    removed, archived, kept = _completion_ctes()
    finished = (
        select(func.count()).select_from(removed).scalar_subquery()
        + select(func.count()).select_from(kept).scalar_subquery()
    )
    ended = union_all(
        select(removed.c.id, removed.c.queue, removed.c.sequence, removed.c.told),
        select(kept.c.id, kept.c.queue, kept.c.sequence, kept.c.told),
    ).subquery("e")
    notified = select(
        func.count(case((ended.c.told, func.pg_notify(RESULTS_CHANNEL, ended.c.id.cast(Text)))))
        + func.count(_wake_after(ended))
    ).scalar_subquery()
    # the WHERE only makes the notifications run (a CTE nobody reads would not)
    return select(finished).where(notified >= 0).add_cte(archived)


def store_results() -> Select[Any]:
    """Store the results of jobs their handler's session finished with `PENDING_RESULT`,
    in the jobs table or the history; or fail them with `:job_errors` (no result to keep:
    the handler raised after its commit, or returned what cannot be kept). Parameters:
    `job_ids`, `job_attempts`, `job_results` (JSON texts or NULLs), `job_errors` (or
    NULLs). Fenced on id, attempt, `done` and the pending marker. NOTIFYs each on
    `RESULTS_CHANNEL` on commit; returns how many it stored."""

    def stored(table: Any, name: str) -> CTE:
        batch = claimed_batch(
            ("job_results", "result", Text),
            ("job_errors", "error", Text),
            *ERROR_ENTRY_ARRAYS,
            optional=True,
        )
        failed = batch.c.error.is_not(None)
        return (
            update(table)
            .where(
                table.c.id == batch.c.id,
                table.c.attempts == batch.c.attempt,
                status_is(JobStatus.done, table),
                table.c.result == cast(literal_text(PENDING_RESULT), JSONB),
            )
            .values(
                result=batch.c.result.cast(JSONB),
                status=case((failed, literal_text(JobStatus.failed.value)), else_=table.c.status),
                last_error=func.coalesce(batch.c.error, table.c.last_error),
                errors=batch_errors(batch, table),
            )
            .returning(table.c.id)
            .cte(name)
        )

    live, archived = stored(jobs, "live"), stored(history, "archived")
    ended = union_all(select(live.c.id), select(archived.c.id)).subquery("e")
    return select(func.count(func.pg_notify(RESULTS_CHANNEL, ended.c.id.cast(Text))))


def complete_archive() -> Insert:
    """Move a batch of succeeded jobs to the history in one statement (retention `keep` or
    `archive`)."""
    batch = claimed_batch()
    moved = (
        delete(jobs)
        .where(*fenced_rows(batch))
        .returning(
            *(c if c.name != "started_at" else _started().label("started_at") for c in jobs.c)
        )
        .cte("moved")
    )
    names, values = _history_values(moved)
    return insert(history).from_select(names, select(*values)).add_cte(moved)


def retry_jobs() -> Update:
    """Put failed attempts back to `queued`, due after their own delay.

    Parameters: `job_ids`, `job_attempts`, `job_delays` (seconds), `job_errors` (tracebacks);
    optionally the history entries' `ERROR_ENTRY_ARRAYS`, appended to `errors`.
    """
    batch = claimed_batch(
        ("job_delays", "delay", Float), ("job_errors", "error", Text), defaulted=ERROR_ENTRY_ARRAYS
    )
    return (
        _update_fenced(batch)
        .values(
            status=JobStatus.queued.value,
            run_at=func.now() + seconds_interval(batch.c.delay),
            last_error=batch.c.error,
            errors=batch_errors(batch),
            locked_at=None,
            **_ENDED,
        )
        .returning(_wake_after(jobs))
    )


def _refunded(batch: TableValuedAlias) -> Any:
    """A snoozed or parked job's budget with its attempt given back: its max_attempts (else
    its task's, `task_max` of the batch, else the default) plus one."""
    budget = func.coalesce(
        jobs.c.max_attempts, batch.c.task_max, literal_column(str(DEFAULT_MAX_ATTEMPTS), Integer)
    )
    return budget + ONE


def snooze_jobs() -> Update:
    """Put snoozed jobs back to `queued`, due after their delay, without spending an attempt.

    Parameters: `job_ids`, `job_attempts`, `job_delays` (seconds), `job_errors` (why),
    `job_task_max_attempts` (the task's own max_attempts, or NULL). As the reaper's refund
    does, max_attempts grows by one and the attempt number (the fencing token) keeps counting.
    """
    batch = claimed_batch(
        ("job_delays", "delay", Float),
        ("job_errors", "error", Text),
        ("job_task_max_attempts", "task_max", Integer),
    )
    return (
        _update_fenced(batch)
        .values(
            status=JobStatus.queued.value,
            max_attempts=_refunded(batch),
            run_at=func.now() + seconds_interval(batch.c.delay),
            last_error=batch.c.error,
            locked_at=None,
            **_ENDED,
        )
        .returning(_wake_after(jobs))
    )


def park_sleeping_jobs() -> Update:
    """Park jobs whose handler sleeps (`ctx.sleep`): `waiting` for neither a signal nor a
    job (`models.SLEEPS`: out of the claim's indexes, in `ix_jobs_sleep_end`), `run_at` the
    sleep's end, until a keeper queues them (`queries.steps.wake_sleeping_jobs`); no
    attempt spent, as `snooze_jobs` refunds it.

    Parameters: `job_ids`, `job_attempts`, `job_delays` (seconds to the sleep's end, by the
    database clock when the handler read it), `job_task_max_attempts`.
    """
    batch = claimed_batch(
        ("job_delays", "delay", Float),
        ("job_task_max_attempts", "task_max", Integer),
    )
    return (
        _update_fenced(batch)
        .values(
            status=JobStatus.waiting.value,
            signal_key=None,
            deps_left=None,
            max_attempts=_refunded(batch),
            run_at=func.now() + seconds_interval(batch.c.delay),
            last_error=None,
            locked_at=None,
            **_ENDED,
        )
        .returning(_wake_after(jobs))
    )


UNKNOWN_TASK_FIRST_DELAY = 1.0
"""Seconds a job of a task its worker has no handler for waits before it is claimed again,
the first time; each deferral doubles it, up to `UNKNOWN_TASK_MAX_DELAY`."""
UNKNOWN_TASK_MAX_DELAY = 300.0
"""Seconds between the claims of a job no worker knows at most: it never spins hot."""
DEFERRED_PREFIX = "deferred "
"""How the last_error of a job deferred for want of a handler begins ("deferred 3 time(s):
worker ... has no handler for task ..."): `defer_jobs` counts its deferrals from it, and
`doctor` finds such jobs by it."""
_DEFERRALS = f"^{DEFERRED_PREFIX}([0-9]{{1,6}}) time"


def deferred_error(table: Any = jobs) -> ColumnElement[bool]:
    """Whether a job's last_error says it was deferred for want of a handler."""
    condition: ColumnElement[bool] = table.c.last_error.like(f"{DEFERRED_PREFIX}% time(s): %")
    return condition


def defer_jobs() -> Update:
    """Put back jobs whose task the worker has no handler for, for a worker that has one:
    `queued`, their attempt refunded, due after a delay that doubles with each deferral
    (`UNKNOWN_TASK_FIRST_DELAY` up to `UNKNOWN_TASK_MAX_DELAY`; counted in last_error).

    Parameters: `job_ids`, `job_attempts`, `job_errors` (why, after "deferred N time(s): ").
    The refund takes the attempt number back (as `release_jobs` does for a job that never
    started), so the task's own max_attempts still holds when the job's is NULL: safe as a
    fencing token because the deferring worker never ran the job and writes nothing else
    for that attempt; the next claim takes the same number again.
    """
    batch = claimed_batch(("job_errors", "error", Text))
    times = func.coalesce(cast(func.substring(jobs.c.last_error, _DEFERRALS), Integer), 0) + ONE
    delay = func.least(
        literal_column(repr(UNKNOWN_TASK_MAX_DELAY), Float),
        literal_column(repr(UNKNOWN_TASK_FIRST_DELAY), Float)
        * func.power(literal_column("2.0", Float), func.least(times - ONE, 20)),
    )
    return (
        _update_fenced(batch)
        .values(
            status=JobStatus.queued.value,
            attempts=jobs.c.attempts - ONE,
            run_at=func.now() + seconds_interval(delay),
            last_error=func.concat(
                literal_text(DEFERRED_PREFIX), times, literal_text(" time(s): "), batch.c.error
            ),
            locked_at=None,
            **_ENDED,
        )
        .returning(_wake_after(jobs))
    )


def fail_jobs() -> Update:
    """Mark jobs `failed` for good. Parameters: `job_ids`, `job_attempts`, `job_errors`;
    optionally the history entries' `ERROR_ENTRY_ARRAYS`, appended to `errors`.

    On commit it NOTIFYs `RESULTS_CHANNEL` with each job's id (a waiter raises its error),
    and the queue's channel for limited queues."""
    batch = claimed_batch(("job_errors", "error", Text), defaulted=ERROR_ENTRY_ARRAYS)
    return (
        _update_fenced(batch)
        .values(
            status=JobStatus.failed.value,
            finished_at=func.now(),
            started_at=_started(),
            last_error=batch.c.error,
            errors=batch_errors(batch),
            heartbeat_at=None,
            lease_expires_at=None,
        )
        .returning(func.pg_notify(RESULTS_CHANNEL, jobs.c.id.cast(Text)), _wake_after(jobs))
    )


def cancel_running_jobs() -> Update:
    """Mark running jobs `cancelled` for good, `job_errors` their reason, before their
    handler ran (a row argument gone or changed, by its task's policy: `sqla_queue.orm.
    row_args`). Parameters and fence as `fail_jobs`; notifies as it does."""
    batch = claimed_batch(("job_errors", "error", Text), defaulted=ERROR_ENTRY_ARRAYS)
    return (
        _update_fenced(batch)
        .values(
            status=JobStatus.cancelled.value,
            finished_at=func.now(),
            last_error=batch.c.error,
            errors=batch_errors(batch),
            heartbeat_at=None,
            lease_expires_at=None,
        )
        .returning(func.pg_notify(RESULTS_CHANNEL, jobs.c.id.cast(Text)), _wake_after(jobs))
    )


def release_jobs() -> Update:
    """Return claimed jobs to `queued` now (shutdown).

    Parameters: `job_ids`, `job_attempts`, `job_refunds`.

    A job that never started gets its attempt back (`refund` 1); one interrupted mid-run
    keeps it (`refund` 0), so a job that always kills its worker still reaches max_attempts.
    """
    batch = claimed_batch(("job_refunds", "refund", Integer))
    return _update_fenced(batch).values(
        status=JobStatus.queued.value,
        attempts=jobs.c.attempts - batch.c.refund,
        run_at=func.now(),
        locked_at=None,
        **_ENDED,
    )


# -- liveness --------------------------------------------------------------------------------


def _holding(batch: Any) -> ColumnElement[bool]:
    """The rows `batch` names at their attempt that the worker still holds: running, or
    cancelled while its handler runs (`cancel_jobs` keeps its lease until the worker says
    the handler returned, `free_cancelled_jobs`)."""
    return and_(
        jobs.c.id == batch.c.id,
        jobs.c.attempts == batch.c.attempt,
        or_(status_is(JobStatus.running), cancelled_held()),
    )


def heartbeat_jobs() -> Update:
    """Extend the leases of the jobs a worker holds; returns (id, status) of those extended.

    Parameters: `job_ids`, `job_attempts`, `job_leases` (seconds from now), `job_started`
    (whether the handler has started: the reaper refunds the attempt of a job that had not).
    A job cancelled while its handler runs is extended too (status `cancelled`: the worker
    tells its handler): its slot stays taken until the handler returns.
    Rows locked by someone else (a cancel in an open transaction) are skipped, not waited
    for: `held_jobs` tells a skipped job, still ours, from a lost one.
    """
    batch = claimed_batch(("job_leases", "lease", Float), ("job_started", "started", Boolean))
    mine = (
        select(jobs.c.id, batch.c.lease, batch.c.started)
        .select_from(jobs.join(batch, _holding(batch)))
        .with_for_update(of=jobs, skip_locked=True)
        .cte("mine")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs)
        .where(jobs.c.id == mine.c.id)
        .values(
            heartbeat_at=func.now(),
            lease_expires_at=func.now() + mine.c.lease * ONE_SECOND,
            started_at=func.coalesce(jobs.c.started_at, case((mine.c.started, func.now()))),
        )
        .returning(jobs.c.id, jobs.c.status)
    )


def held_jobs() -> Select[Any]:
    """(id, status) of `:job_ids`/`:job_attempts` still held under that attempt: running, or
    cancelled while its handler runs (no lock)."""
    batch = claimed_batch()
    return select(jobs.c.id, jobs.c.status).select_from(jobs.join(batch, _holding(batch)))


def free_cancelled_jobs() -> Update:
    """The handlers of jobs cancelled while they ran have returned: clear their leases, so
    their slots of a limited queue are free. Parameters: `job_ids`, `job_attempts`.

    NOTIFYs the queue's channel for limited queues on commit."""
    batch = claimed_batch()
    return (
        update(jobs)
        .where(jobs.c.id == batch.c.id, jobs.c.attempts == batch.c.attempt, cancelled_held())
        .values(heartbeat_at=None, lease_expires_at=None)
        .returning(_wake_after(jobs))
    )


UNHELD_AFTER = 10
"""Seconds after its claim a job cannot be on its way to the worker's board any more."""


def free_unheld_cancelled_jobs() -> Update:
    """Clear the leases of cancelled jobs whose handlers no longer run (the reaper's
    round): those whose lease expired, and those of worker `:worker_id` that it no longer
    holds (`:job_ids` are the ones it holds; a job claimed in the last `UNHELD_AFTER`
    seconds may not be on its board yet). A handler that returned before its worker heard
    of the cancel finished with an outcome the fence refused, and left its lease.

    NOTIFYs the queue's channel for limited queues on commit."""
    held = job_ids_param()
    unheld = and_(
        jobs.c.locked_by == bindparam("worker_id", type_=Text),
        jobs.c.locked_at < func.now() - text(f"interval '{UNHELD_AFTER} seconds'"),
        ~(jobs.c.id == any_(held)),
    )
    return (
        update(jobs)
        .where(cancelled_held(), or_(jobs.c.lease_expires_at < func.now(), unheld))
        .values(heartbeat_at=None, lease_expires_at=None)
        .returning(_wake_after(jobs))
    )


LEGACY_LEASE_SECONDS = 60
"""The lease of a running job that has no deadline of its own (the old worker default)."""


def stuck_condition() -> ColumnElement[bool]:
    """A running job the reaper requeues: past its own lease deadline, or held by a worker
    whose registration expired and whose session is gone (`session_seen`: a SIGKILLed
    worker's backend ends with it, so its jobs come back after `dead_after`; a worker that
    still holds its connection but missed its heartbeats, starved of CPU or paused, is
    alive, and keeps its jobs until their leases end, instead of their handlers running a
    second time beside it). A worker that records no session (`poll_only`) is judged by its
    registration alone. `doctor` counts stuck jobs by the same condition. A reaper passes
    its own worker's id as `:reaper_id`: a worker that is reaping is alive, however late
    its own registration's beat (its jobs' leases still bound them)."""
    dead = select(workers.c.id).where(
        workers.c.expires_at < func.now(), ~session_seen(), not_the_reaper()
    )
    # A row claimed without a deadline (by a worker older than per-job leases, during a
    # rolling upgrade) keeps the old rule: its heartbeat plus the old default lease.
    legacy = and_(
        jobs.c.lease_expires_at.is_(None),
        func.coalesce(jobs.c.heartbeat_at, jobs.c.locked_at, jobs.c.created_at)
        < func.now() - text(f"interval '{LEGACY_LEASE_SECONDS} seconds'"),
    )
    return and_(
        status_is(JobStatus.running),
        or_(
            jobs.c.lease_expires_at < func.now(),
            jobs.c.locked_by.in_(dead.scalar_subquery()),
            legacy,
        ),
    )


def reap_stale_jobs() -> Update:
    """Requeue stuck `running` jobs (`stuck_condition`); returns (id, queue, status, task).

    A job whose handler never started (as its worker's heartbeats reported) gets its
    attempt back once: its max_attempts grows by one, while the attempt number, the fencing
    token, keeps counting (a second time in a row it counts, so a job that kills its worker
    at once still reaches max_attempts). A job
    that has used all its attempts is marked failed. Safe when several workers reap at
    once: SKIP LOCKED splits the rows between them and the status condition is re-checked
    on the locked row. Parameter: `task_max_attempts` (optional, as for `claim_jobs`).
    The same statement deletes results kept past their queue's ttl (`expire_results`).
    """
    stale = (
        select(jobs.c.id)
        .where(stuck_condition())
        .with_for_update(skip_locked=True)
        .cte("stale")
        .prefix_with("MATERIALIZED")
    )
    unstarted = "lease expired before its handler started: worker "
    refund = and_(
        jobs.c.started_at.is_(None),
        func.coalesce(jobs.c.last_error, "").not_like(f"{unstarted}%"),
    )
    exhausted = and_(~refund, jobs.c.attempts >= effective_max_attempts())
    worker = func.coalesce(jobs.c.locked_by, "?")
    why = case(
        (refund, func.concat(unstarted, worker, " stopped heartbeating")),
        (
            exhausted,
            func.concat(
                "lease expired: worker ",
                worker,
                " stopped heartbeating during attempt ",
                jobs.c.attempts,
                ", the last of ",
                effective_max_attempts(),
            ),
        ),
        else_=func.concat("lease expired: worker ", worker, " stopped heartbeating"),
    )
    return (
        update(jobs)
        .where(jobs.c.id == stale.c.id, status_is(JobStatus.running))
        .values(
            status=case(
                (exhausted, literal_column(f"'{JobStatus.failed.value}'")),
                else_=literal_column(f"'{JobStatus.queued.value}'"),
            ),
            # The attempt number stays (it is the fencing token); the budget grows instead.
            max_attempts=case(
                (refund, func.least(effective_max_attempts(), INT4_MAX - 1) + 1),
                else_=jobs.c.max_attempts,
            ),
            run_at=func.now(),
            finished_at=case((exhausted, func.now())),
            last_error=why,
            # a lost attempt is an error of its own (even a refunded one: its worker died)
            errors=appended_errors(
                ended_attempt_entry(jobs, literal_text(LOST_CLASS), why, null())
            ),
            locked_at=None,
            **_ENDED,
        )
        .returning(jobs.c.id, jobs.c.queue, jobs.c.status, jobs.c.task)
        # the reaper runs on every worker: it also deletes kept results past their ttl
        .add_cte(expire_results().cte("expired"))
    )


# -- notify ----------------------------------------------------------------------------------


def cancel_jobs() -> Update:
    """Cancel jobs `:job_ids` that are queued, waiting or running (the states whose
    `cancel` is true); returns (id, previous status).

    `admin.cancel_jobs` then NOTIFYs `CANCEL_CHANNEL` so the workers holding running ones
    tell their handlers at once; a late finish is fenced off by the status condition.
    """
    before = (
        select(jobs.c.id, jobs.c.status)
        .where(
            jobs.c.id == any_(job_ids_param()),
            or_(*(status_is(JobStatus(status)) for status in statuses(cancel=True))),
        )
        .with_for_update()
        .cte("before")
    )
    return (
        update(jobs)
        .where(jobs.c.id == before.c.id)
        .values(
            status=JobStatus.cancelled.value,
            finished_at=func.now(),
            heartbeat_at=None,
            # a running job's handler goes on until it returns: it keeps its queue's slot
            # (its worker extends the lease, then clears it: `free_cancelled_jobs`)
            lease_expires_at=case((status_is(JobStatus.running), jobs.c.lease_expires_at)),
        )
        .returning(jobs.c.id, before.c.status)
    )


def job_status() -> Select[Any]:
    """(status, attempts) of the job `:job_id`, without its args."""
    return select(jobs.c.status, jobs.c.attempts).where(
        jobs.c.id == bindparam("job_id", type_=BigInteger)
    )


def job_outcome() -> CompoundSelect[Any]:
    """(status, task, result, last_error) of the job `:job_id`, from jobs or else the history
    (no row: no such job, or it succeeded and was deleted)."""
    job_id = bindparam("job_id", type_=BigInteger)
    columns = ("status", "task", "result", "last_error")
    return (
        select(*(jobs.c[name] for name in columns))
        .where(jobs.c.id == job_id)
        .union_all(select(*(history.c[name] for name in columns)).where(history.c.id == job_id))
    )


def expire_results() -> Delete:
    """Delete up to 500 `done` jobs kept only for their result (their queue deletes its jobs)
    whose queue's `result_ttl` has passed since they finished; the reaper runs it."""
    expired = (
        select(jobs.c.id)
        .join(queues, queues.c.name == jobs.c.queue)
        .where(
            status_is(JobStatus.done),
            jobs.c.result.is_not(None),
            queues.c.retention == literal_text(Retention.delete.value),
            jobs.c.finished_at < func.now() - bounded_seconds(queues.c.result_ttl) * ONE_SECOND,
        )
        .limit(literal_column("500"))
        .with_for_update(of=jobs, skip_locked=True)
        .scalar_subquery()
    )
    return delete(jobs).where(jobs.c.id.in_(expired))


def job_by_id() -> Select[Any]:
    """One job's row by `:job_id`."""
    return select(jobs).where(jobs.c.id == bindparam("job_id", type_=BigInteger))


def make_scheduled_due(queue_names: Sequence[str] | None, skip_ids: bool = False) -> Update:
    """Queued jobs due later become due now, in the given queues (None: all); for `drain`.
    With `skip_ids`, not the jobs of parameter `job_ids` (the ones it deferred)."""
    statement = update(jobs).where(status_is(JobStatus.queued), jobs.c.run_at > func.now())
    if skip_ids:
        statement = statement.where(jobs.c.id.not_in(bindparam("job_ids", expanding=True)))
    if queue_names is not None:
        statement = statement.where(jobs.c.queue.in_(queue_names))
    return statement.values(run_at=func.now())


def not_yet_due(queue_names: Sequence[str] | None) -> Select[Any]:
    """(count, earliest run_at, seconds until it) of the queued jobs in the given queues
    (None: all) not due yet: what a `--burst` worker leaves behind when it exits (a retry
    or a snooze not yet due), and what `--burst-wait` waits for. The worker reads it
    *before* its last claim (`Producer`): a job is then either due by that claim's
    snapshot or counted here, with no window between the two for a job to fall due in."""
    columns = [
        func.count().label("count"),
        func.min(jobs.c.run_at).label("earliest"),
        func.extract("epoch", func.min(jobs.c.run_at) - func.now()).label("seconds"),
    ]
    statement = select(*columns).where(status_is(JobStatus.queued), jobs.c.run_at > func.now())
    if queue_names is not None:
        statement = statement.where(jobs.c.queue.in_(queue_names))
    return statement
