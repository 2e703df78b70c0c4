"""The job lifecycle: insert, claim, finish, heartbeat, reap, cancel, notify."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    DateTime,
    Delete,
    Float,
    Insert,
    Integer,
    Interval,
    Select,
    SmallInteger,
    Text,
    Update,
    any_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from sqla_queue.models import NOTIFY_CHANNEL, JobStatus

from .common import (
    CLAIMED_COLUMNS,
    _claimed_batch,
    _fenced,
    _is,
    _seconds,
    archive,
    jobs,
    queues,
)

# -- enqueue ---------------------------------------------------------------------------------


def insert_jobs() -> Insert:
    """Insert jobs, for executemany; returns ids in parameter order.

    Parameters per row: `job_task`, `job_args`, `job_queue`, `job_priority`, `job_run_at`
    (or NULL), `job_delay` (an interval, or NULL), `job_max_attempts`. A NULL `job_run_at`
    means now plus the delay, by the database clock.
    """
    run_at = func.coalesce(
        bindparam("job_run_at", type_=DateTime(timezone=True)),
        func.now() + func.coalesce(bindparam("job_delay", type_=Interval), text("'0'::interval")),
    )
    return (
        insert(jobs)
        .values(
            task=bindparam("job_task", type_=Text),
            args=bindparam("job_args", type_=JSONB),
            queue=bindparam("job_queue", type_=Text),
            priority=bindparam("job_priority", type_=SmallInteger),
            run_at=run_at,
            max_attempts=bindparam("job_max_attempts", type_=Integer),
        )
        .returning(jobs.c.id, sort_by_parameter_order=True)
    )


# -- claim -----------------------------------------------------------------------------------


def claim_jobs(queue_names: Sequence[str] | None) -> Update:
    """Claim up to `:limit` due jobs, lowest priority first, and mark them running.

    Parameters: `limit`, `worker_id`, and `queues` (a list) when `queue_names` is given;
    `None` claims from every queue. Paused queues are skipped. The candidates CTE is
    MATERIALIZED so the planner cannot re-run the locking subquery and lock more than
    `limit` rows.
    """
    paused = exists().where(queues.c.name == jobs.c.queue, queues.c.paused)
    conditions = [
        _is(JobStatus.queued),
        jobs.c.run_at <= func.now(),
        ~paused,
    ]
    if queue_names is not None:
        conditions.append(jobs.c.queue == any_(bindparam("queues", type_=ARRAY(Text))))
    candidates = (
        select(jobs.c.id)
        .where(*conditions)
        .order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs)
        .where(jobs.c.id == candidates.c.id)
        .values(
            status=JobStatus.running.value,
            attempts=jobs.c.attempts + 1,
            locked_at=func.now(),
            heartbeat_at=func.now(),
            locked_by=bindparam("worker_id", type_=Text),
        )
        .returning(*CLAIMED_COLUMNS)
    )


# -- finish ----------------------------------------------------------------------------------


def complete_keep() -> Update:
    """Mark claimed jobs done (retention `keep`). Parameters: `job_ids`, `job_attempts`."""
    batch = _claimed_batch()
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(status=JobStatus.done.value, finished_at=func.now())
    )


def complete_delete() -> Delete:
    """Delete a batch of claimed jobs that succeeded (retention `delete`)."""
    batch = _claimed_batch()
    return delete(jobs).where(*_fenced(batch))


def complete_delete_and_claim(queue_names: Sequence[str] | None) -> Update:
    """`complete_delete` then `claim_jobs` in one statement: one commit per cycle, not two.

    Parameters: those of both (`job_ids`, `job_attempts`, `limit`, `worker_id`, `queues`).
    The deleted rows were `running`, so they are never among the candidates.
    """
    batch = _claimed_batch()
    finished = delete(jobs).where(*_fenced(batch)).returning(jobs.c.id).cte("finished")
    return claim_jobs(queue_names).add_cte(finished)


def complete_archive() -> Insert:
    """Move a batch of succeeded jobs to the archive table in one statement."""
    batch = _claimed_batch()
    moved = delete(jobs).where(*_fenced(batch)).returning(*jobs.c).cte("moved")
    names = [c.name for c in archive.c]
    values = [
        literal(JobStatus.done.value).label("status")
        if name == "status"
        else func.now().label("finished_at")
        if name == "finished_at"
        else moved.c[name]
        for name in names
    ]
    return insert(archive).from_select(names, select(*values)).add_cte(moved)


def retry_jobs() -> Update:
    """Put failed attempts back to `queued`, due after their own delay.

    Parameters: `job_ids`, `job_attempts`, `job_delays` (seconds), `job_errors` (tracebacks).
    """
    batch = _claimed_batch(("job_delays", "delay", Float), ("job_errors", "error", Text))
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(
            status=JobStatus.queued.value,
            run_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, batch.c.delay),
            last_error=batch.c.error,
            locked_by=None,
            locked_at=None,
            heartbeat_at=None,
        )
    )


def fail_jobs() -> Update:
    """Mark jobs `failed` for good. Parameters: `job_ids`, `job_attempts`, `job_errors`."""
    batch = _claimed_batch(("job_errors", "error", Text))
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(
            status=JobStatus.failed.value,
            finished_at=func.now(),
            last_error=batch.c.error,
            heartbeat_at=None,
        )
    )


def release_jobs() -> Update:
    """Return claimed jobs to `queued` now (shutdown).

    Parameters: `job_ids`, `job_attempts`, `job_refunds`.

    A job that never started gets its attempt back (`refund` 1); one interrupted mid-run
    keeps it (`refund` 0), so a job that always kills its worker still reaches max_attempts.
    """
    batch = _claimed_batch(("job_refunds", "refund", Integer))
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(
            status=JobStatus.queued.value,
            attempts=jobs.c.attempts - batch.c.refund,
            run_at=func.now(),
            locked_by=None,
            locked_at=None,
            heartbeat_at=None,
        )
    )


# -- liveness --------------------------------------------------------------------------------


def heartbeat_jobs() -> Update:
    """Refresh the heartbeat of the jobs a worker holds; returns the ids it still owns.

    A held job missing from the result was reaped or cancelled: its handler is told.
    """
    batch = _claimed_batch()
    return update(jobs).where(*_fenced(batch)).values(heartbeat_at=func.now()).returning(jobs.c.id)


def reap_stale_jobs() -> Update:
    """Requeue `running` jobs whose heartbeat is older than `:lease` seconds.

    Safe when several workers reap at once: SKIP LOCKED splits the rows between them and
    the status condition is re-checked on the locked row. Returns (id, queue).
    """
    stale = (
        select(jobs.c.id)
        .where(
            _is(JobStatus.running),
            jobs.c.heartbeat_at < func.now() - _seconds("lease"),
        )
        .with_for_update(skip_locked=True)
        .cte("stale")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs)
        .where(jobs.c.id == stale.c.id, _is(JobStatus.running))
        .values(
            status=JobStatus.queued.value,
            run_at=func.now(),
            last_error=func.concat(
                "lease expired: worker ",
                func.coalesce(jobs.c.locked_by, "?"),
                " stopped heartbeating",
            ),
            locked_by=None,
            locked_at=None,
            heartbeat_at=None,
        )
        .returning(jobs.c.id, jobs.c.queue)
    )


# -- notify ----------------------------------------------------------------------------------


def notify_queues() -> Select[Any]:
    """`pg_notify` once per queue in `:queues`; delivered by PostgreSQL only on commit."""
    names = func.unnest(bindparam("queues", type_=ARRAY(Text))).table_valued("name")
    return select(func.pg_notify(NOTIFY_CHANNEL, names.c.name)).select_from(names)


def cancel_jobs() -> Update:
    """Cancel jobs `:job_ids` that are queued or running; returns (id, previous status).

    A running job's handler sees the cancellation at its worker's next heartbeat, and its
    late finish is fenced off by the status condition.
    """
    before = (
        select(jobs.c.id, jobs.c.status)
        .where(
            jobs.c.id == any_(bindparam("job_ids", type_=ARRAY(BigInteger))),
            or_(
                _is(JobStatus.queued),
                _is(JobStatus.running),
            ),
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
        )
        .returning(jobs.c.id, before.c.status)
    )


def job_by_id() -> Select[Any]:
    """One job's row by `:job_id`."""
    return select(jobs).where(jobs.c.id == bindparam("job_id", type_=BigInteger))


def may_reserve_job_ids() -> Select[Any]:
    """Whether this role may draw ids from the jobs id sequence (COPY needs it; INSERT not)."""
    sequence = func.pg_get_serial_sequence(jobs.fullname, jobs.c.id.name)
    return select(func.has_sequence_privilege(sequence, "USAGE"))


def reserve_job_ids() -> Select[Any]:
    """`:count` fresh job ids, in order, each with the transaction's `now()` (for COPY)."""
    sequence = func.pg_get_serial_sequence(jobs.fullname, jobs.c.id.name)
    series = func.generate_series(1, bindparam("count", type_=Integer))
    return select(func.nextval(sequence), func.now()).select_from(series)


COPY_JOB_COLUMNS = ("id", "task", "args", "queue", "priority", "run_at", "max_attempts")
COPY_JOBS = f"COPY {jobs.fullname} ({', '.join(COPY_JOB_COLUMNS)}) FROM STDIN"
"""Not expressible in Core: bulk enqueue's COPY, rows in COPY_JOB_COLUMNS order."""

LISTEN = f'LISTEN "{NOTIFY_CHANNEL}"'
"""Not expressible in Core: the one plain-text statement, sent by the listener connection."""
