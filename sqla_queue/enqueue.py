"""Writing jobs in the caller's own transaction: `enqueue`, `enqueue_many`, and the NOTIFY hook.

Every path passes `sqla_queue.hooks.prepare_job` (task defaults, insert hooks, the unknown
task check) before the job is validated; a `Job` added directly passes it at flush. Nothing
here commits. The job becomes visible to workers when the caller's transaction
commits, and is gone if it rolls back. Workers are woken by `pg_notify` (never a per-row
trigger), which PostgreSQL delivers only on commit: a job of `enqueue` carries it in its
own INSERT statement (written at flush, or at once with a Core `Connection`); `enqueue_many`
and a `Job` added to the session send it once per queue per transaction.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, overload

import psycopg
from sqlalchemy import Connection, event, func
from sqlalchemy.engine import Engine, ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import (
    Session,
    SessionTransaction,
    UOWTransaction,
    make_transient_to_detached,
)
from sqlalchemy.sql import ClauseElement

from . import queries
from .bounds import check_duration, invalid_job
from .errors import InvalidJobError, SchemaMissingError, SqlaQueueError, UnknownQueueError
from .hooks import NewJob, default_registry, prepare_job
from .models import (
    DEFAULT_QUEUE,
    HOOKS_DUE,
    PRIORITY_MAX,
    SCHEMA,
    SCHEMA_MAX_ARGS_BYTES,
    SCHEMA_MAX_NAME_LENGTH,
    UNIQUE_DUE,
    Job,
    Queue,
    validate_job,
    validate_tags_and_meta,
)
from .queries import brokers as broker_queries
from .unique import UniqueOption, resolve_unique

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from typing_extensions import Unpack

    from .registry import Registry

_NOTIFIED_KEY = "sqla_queue.notified"
_QUEUE_FK = "fk_jobs_queue_queues"
_MISSING_KEY = re.compile(r"Key \(queue\)=\((?P<queue>.*)\) is not present")
_NO_DELAY = dt.timedelta(0)
# Built once: constructing a Core statement costs more than sending it (profiled per enqueue).
_INSERT_JOBS = queries.insert_jobs()
_INSERT_AND_NOTIFY = queries.insert_job_and_notify()
_INSERT_QUEUE = queries.insert_queue()
_RESERVE_JOB_IDS = queries.reserve_job_ids()
_RESERVE_JOB_ID_ARRAY = queries.reserve_job_id_array()
_NOTIFY_QUEUES = queries.notify_queues()
_MAY_RESERVE_IDS = queries.may_reserve_job_ids()
_MAY_STAGE = queries.may_stage_jobs()
_BIND = {"mapper": Job}
"""Route our statements to the Job mapper's bind, for sessions set up with `binds=`."""
COPY_MIN_ROWS = 100
"""Rows from which enqueue_many uses COPY: below, one INSERT round trip beats COPY's two."""


def _delay_interval(task: object, delay: object) -> dt.timedelta:
    """`delay` (seconds or a timedelta) as an interval, from 0 to 100 years (`MAX_DURATION`):
    every path refuses the same delays, before anything reaches the database."""
    seconds = check_duration("delay", delay, error=invalid_job(task))
    return delay if isinstance(delay, dt.timedelta) else dt.timedelta(seconds=seconds)


def _schedule(job: NewJob) -> dt.timedelta | None:
    """The job's delay as an interval (None without one); refuses run_at with delay."""
    if job.run_at is not None and job.delay is not None:
        raise InvalidJobError(task=job.task, detail="pass run_at or delay, not both")
    return None if job.delay is None else _delay_interval(job.task, job.delay)


class EnqueueOptions(TypedDict, total=False):
    """`enqueue`'s keyword arguments, for its typed overloads (documented there)."""

    queue: str | None
    priority: int | None
    run_at: dt.datetime | None
    delay: float | dt.timedelta | None
    max_attempts: int | None
    tags: Iterable[str] | None
    meta: Mapping[str, Any] | None
    unique: UniqueOption
    flush: bool
    registry: Registry | None


@overload
def enqueue(
    session: Connection,
    task: str,
    args: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> int: ...


@overload
def enqueue(
    session: Session | AsyncSession,
    task: str,
    args: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job: ...


def enqueue(
    session: Session | AsyncSession | Connection,
    task: str,
    args: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    tags: Iterable[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    unique: UniqueOption = None,
    flush: bool = False,
    registry: Registry | None = None,
) -> Job | int:
    """Add a job to `session` and return it; it commits (or not) with the session.

    `args` are the handler's keyword arguments, as one JSON-serialisable dict. `run_at`
    (an aware datetime) or `delay` (seconds, measured by the database clock) schedule it;
    `priority` 0 (the default) runs first. `tags` (names to find it by: `sqla-queue jobs list
    --tag`) and `meta` (a dict of context that is not an argument, e.g. a trace id) reach the
    handler as `ctx.tags` and `ctx.meta`. Works with a sync `Session` and an `AsyncSession`.

    The returned job's `id` is None until the session flushes: pass `flush=True` to flush
    at once (a sync `Session` only; with an `AsyncSession`, `await session.flush()`), which
    sends the session's other pending changes too, as any flush does. Still not committed.

    With a registry (`registry=`, or the default from `sqla_queue.set_default_registry`),
    an unknown task name is refused here (`UnknownTaskError`), `queue`, `priority` and
    `max_attempts` not given take the task's own, and its insert hooks run. Without one,
    the job is written as given (queue "default", priority 0).

    `unique` (True, a `sqla_queue.Unique`, or None for the task's default; see
    `sqla_queue.unique`) writes the job at once, with a sync `Session` (for an
    `AsyncSession`, `await enqueue_async(...)`): the returned job has its id, and if a job
    with the same key was there already, nothing is written and the returned job is that
    one, with `job.duplicate` True. A duplicate never raises, so the transaction goes on.

    With a Core `Connection` instead of a session (code that has no ORM session), the job
    is written at once in the connection's transaction, by one statement that also sends
    the NOTIFY, and its id is returned (a unique job's duplicate: the blocking job's id).
    Nothing is committed: the caller's `connection.commit()` (or `engine.begin()` block)
    does it. `flush` makes no difference there.
    """
    if flush and not isinstance(session, (Session, Connection)):
        raise TypeError("enqueue(flush=True) needs a sync Session; `await session.flush()`")
    new = prepare_job(
        task,
        args,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        run_at=run_at,
        delay=delay,
        tags=tags,
        meta=meta,
        unique=unique,
        registry=registry,
    )
    if isinstance(session, Connection):
        return _enqueue_core(session, new)
    if new.unique is not None:
        if not isinstance(session, Session):
            raise TypeError(
                "enqueue(unique=...) writes at once, which needs a sync Session; with an "
                "AsyncSession, `await enqueue_async(session, ...)`"
            )
        return _enqueue_unique(session, new)
    interval = _schedule(new)
    fields: dict[str, Any] = {
        "task": new.task,
        "args": new.args,
        "queue": new.queue,
        "priority": new.priority,
        "max_attempts": new.max_attempts,
        "tags": new.tags,
        "meta": new.meta,
    }
    later = None
    if interval is not None:
        fields["run_at"] = later = func.now() + interval
    elif new.run_at is not None:
        fields["run_at"] = new.run_at
    job = Job(**fields)
    job.__dict__[HOOKS_DUE] = None  # through the hooks above: none due at flush
    job.__dict__[_ENQUEUED] = (later, interval)
    session.add(job)
    if flush:
        session.flush()
    return job


def _enqueue_core(connection: Connection, new: NewJob) -> int:
    """`enqueue(connection, ...)`: the INSERT and its NOTIFY in one round trip; the id."""
    params = _row_params(new)
    if new.unique is None:
        return int(connection.execute(_INSERT_AND_NOTIFY, params).scalar_one())
    ((job_id, duplicate),) = _insert_unique(connection, [params])
    if not duplicate:
        connection.execute(_NOTIFY_QUEUES, {"queues": [new.queue]})
    return job_id


def _run_due_hooks(job: Job) -> NewJob | None:
    """Task defaults and insert hooks for a `Job` constructed by the caller, at flush.

    A pending Job that never passed `Job.__init__` (the copy `session.merge` makes) has no
    record of what was given: its hooks run with every field taken as given. Returns the
    job as prepared if it is unique (it must then be written by `_write_unique`, not by the
    flush), else None.
    """
    not_given = job.__dict__.get(HOOKS_DUE, frozenset())
    if not_given is None:  # made by enqueue, or already through the hooks
        return None
    raw_unique = job.__dict__.pop(UNIQUE_DUE, None)
    job.__dict__[HOOKS_DUE] = None  # once: a flush that fails later does not run them again
    given_run_at = job.run_at if isinstance(job.run_at, dt.datetime) else None
    if default_registry() is None:
        unique = resolve_unique(raw_unique)
        if unique is None:
            return None
        return NewJob(
            job.task,
            job.args,
            job.queue,
            job.priority,
            job.max_attempts,
            run_at=given_run_at,
            tags=job.tags,
            meta=job.meta,
            unique=unique,
        )
    new = prepare_job(
        job.task,
        job.args,
        queue=None if "queue" in not_given else job.queue,
        priority=None if "priority" in not_given else job.priority,
        max_attempts=None if "max_attempts" in not_given else job.max_attempts,
        run_at=given_run_at,
        tags=job.tags,
        meta=job.meta,
        unique=raw_unique,
    )
    interval = _schedule(new)
    validate_job(new.task, new.args, new.queue, new.priority, new.max_attempts, new.run_at)
    new.tags, _ = validate_tags_and_meta(new.task, new.tags, new.meta)
    for field in ("task", "args", "queue", "priority", "max_attempts", "tags", "meta"):
        if getattr(job, field) != getattr(new, field):
            setattr(job, field, getattr(new, field))
    if new.unique is not None:
        return new
    if interval is not None:
        job.run_at = func.now() + interval
    elif new.run_at is not given_run_at:
        job.run_at = new.run_at  # type: ignore[assignment]
    return None


@event.listens_for(Session, "before_flush")
def _hooks_before_flush(session: Session, flush_context: UOWTransaction, instances: object) -> None:
    added = list(session.new)
    jobs = [obj for obj in added if isinstance(obj, Job)]
    if jobs:
        _write_added_queues(session, [obj for obj in added if isinstance(obj, Queue)])
    enqueued: list[Job] = []
    for job in jobs:
        if _ENQUEUED in job.__dict__:
            enqueued.append(job)
            continue
        try:
            unique = _run_due_hooks(job)
        except Exception:
            # Refused (or a hook broke) before anything is sent: the transaction goes on
            # without this job, which must not be written later with its hooks skipped.
            session.expunge(job)
            raise
        if unique is not None:
            _write_unique(session, job, unique)
    for job in enqueued:
        if not _write_enqueued(session, job):  # the unit of work writes it, as an added Job
            del job.__dict__[_ENQUEUED]


def _write_added_queues(session: Session, added: list[Queue]) -> None:
    """Write the queues added to `session` before the jobs of the same flush: the unit of
    work knows no order between the two (the jobs' foreign key is not a relationship it
    follows), and `enqueue(session, ...)` writes its jobs before the unit of work runs, so
    `session.add(Queue(name="emails"))` and a job for "emails" in one transaction would
    otherwise fail with UnknownQueueError. Each becomes persistent, as after a flush."""
    if not added:
        return
    connection = session.connection(bind_arguments={"mapper": Queue})
    columns = [attr.key for attr in Queue.__mapper__.column_attrs]
    defaulted = {c.key for c in Queue.__table__.columns if c.server_default is not None}
    for queue in added:
        given = {
            key: queue.__dict__[key]
            for key in columns
            if key in queue.__dict__ and not (queue.__dict__[key] is None and key in defaulted)
        }
        session.expunge(queue)
        try:
            connection.execute(_INSERT_QUEUE, given)
        except BaseException:
            session.add(queue)  # still pending, as a failed flush leaves it
            raise
        make_transient_to_detached(queue)
        session.add(queue)
        session.expire(queue, [key for key in columns if key not in given])


_ENQUEUED = "_sqla_queue_enqueued"
"""Instance key of a Job made by `enqueue(session, ...)`: (the run_at expression it was given
for a delay, or None; that delay). The flush writes it with `_write_enqueued`."""


def _write_enqueued(session: Session, job: Job) -> bool:
    """Write a job made by `enqueue(session, ...)` at flush, by one statement that also sends
    the NOTIFY (the unit of work would send an INSERT and then the NOTIFY: one round trip
    and about a third of the job's CPU more, profiled); it becomes persistent, its
    server-set columns loaded on first use, as after the unit of work's INSERT.

    False (the unit of work writes it) when its run_at was since set to another SQL
    expression. Fields changed since `enqueue` are validated again, as `Job` validates them.
    """
    later, interval = job.__dict__[_ENQUEUED]
    run_at: object = job.run_at
    if run_at is later is not None:
        run_at = None
    elif isinstance(run_at, ClauseElement):
        return False
    else:
        interval = None
    params = _plain_params(
        job.task, job.args, job.queue, job.priority, job.max_attempts, run_at, interval
    )
    if job.tags or job.meta:
        params["job_tags"], params["job_meta_json"] = validate_tags_and_meta(
            job.task, job.tags, job.meta
        )
    session.expunge(job)
    del job.__dict__[_ENQUEUED]
    connection = session.connection(bind_arguments=_BIND)
    try:
        job.id = int(connection.execute(_INSERT_AND_NOTIFY, params).scalar_one())
    except BaseException:
        session.add(job)  # still pending, as a failed flush leaves the unit of work's jobs
        raise
    make_transient_to_detached(job)
    session.add(job)
    session.expire(job, _SERVER_SET)
    session.info.setdefault(_NOTIFIED_KEY, set()).add(job.queue)
    return True


UNIQUE_ROUNDS = 10
"""Attempts to settle a unique row whose blocking job finished between insert and lookup."""
_INSERT_UNIQUE_ONE = queries.insert_unique_jobs(with_ids=False)
_INSERT_UNIQUE_MANY = queries.insert_unique_jobs(with_ids=True)
_UNIQUE_HOLDERS = queries.unique_holders()
_ROUTED_AMONG = broker_queries.routed_among()
_MAY_READ_QUEUES = broker_queries.may_read_queues()
_WRITTEN_BY_US = frozenset(
    {"id", "task", "args", "queue", "priority", "max_attempts", "tags", "meta"}
)
_SERVER_SET = [a.key for a in Job.__mapper__.column_attrs if a.key not in _WRITTEN_BY_US]
"""Columns of a job we wrote ourselves that the server set: expired, loaded on first use."""


def unique_on_routed(queue: str, route: str, held: int = 0) -> str:
    """Why unique jobs and a route do not go together on queue `queue` (with `held` unique
    jobs queued or running: why it cannot be routed now)."""
    fix = (
        f"it has {held} unique job(s) queued or running: let them finish (or cancel them) "
        "before routing it, and enqueue its jobs without unique"
        if held
        else "enqueue it without unique (unique=False if the task is unique by default) or "
        "into a queue that is not routed"
    )
    return (
        f"queue {queue!r} is routed to a broker ({route}), where a unique key cannot be held: "
        "the relay deletes a job's row, and its key with it, when it publishes, so the same "
        f"unique job would be accepted again while the first waits in the broker; {fix}"
    )


def _refuse_routed(connection: Connection, params: list[dict[str, Any]]) -> None:
    """Refuse unique rows for routed queues, before anything is written (so the transaction
    goes on): their key would be freed once relayed (see `unique_on_routed`). A role that
    may not read the queues (an enqueue-only role) is not checked: a failed read would
    abort its transaction."""
    if not connection.execute(_MAY_READ_QUEUES).scalar():
        return
    names = sorted({p["job_queue"] for p in params})
    routed = connection.execute(_ROUTED_AMONG, {"queues": names}).first()
    if routed is not None:
        task = next(p["job_task"] for p in params if p["job_queue"] == routed.name)
        raise InvalidJobError(task=task, detail=unique_on_routed(routed.name, routed.route))


def _insert_unique(
    connection: Connection,
    params: list[dict[str, Any]],
    driver: psycopg.Connection[Any] | None = None,
    reserve: bool = True,
) -> list[tuple[int, bool]]:
    """Write unique rows by `INSERT ... ON CONFLICT DO NOTHING`; per row (id, duplicate).

    With `driver`, the first round COPYs them into a staging table and inserts from there
    (2.9 times faster than multi-row INSERTs at 10,000 rows, measured). Without `reserve`
    (a role that may not draw ids from the sequence) each row is its own statement.

    A skipped row's id is the job that blocks it (looked up by key; our own transaction's
    rows included). If that job finished in between (no longer blocking), the row is tried
    again: no read decides whether to write, the unique index does.
    """
    _refuse_routed(connection, params)
    results: dict[int, tuple[int, bool]] = {}
    pending = list(range(len(params)))
    for round_number in range(UNIQUE_ROUNDS):
        if round_number == 0 and driver is not None:
            written = _copy_unique(connection, driver, params)
        elif len(pending) == 1 or not reserve:
            written = {}
            for i in pending:
                inserted = connection.execute(_INSERT_UNIQUE_ONE, params[i]).scalar()
                if inserted is not None:
                    written[i] = int(inserted)
        else:
            reserved = [
                int(r[0]) for r in connection.execute(_RESERVE_JOB_IDS, {"count": len(pending)})
            ]
            batch = [
                {**params[i], "job_id": job_id} for i, job_id in zip(pending, reserved, strict=True)
            ]
            got = set(connection.execute(_INSERT_UNIQUE_MANY, batch).scalars())
            written = {
                i: job_id for i, job_id in zip(pending, reserved, strict=True) if job_id in got
            }
        results.update({i: (job_id, False) for i, job_id in written.items()})
        skipped = [i for i in pending if i not in written]
        if not skipped:
            break
        keys = [params[i]["job_unique_key"] for i in skipped]
        holders = {
            bytes(key): int(job_id)
            for key, job_id in connection.execute(_UNIQUE_HOLDERS, {"keys": keys})
        }
        pending = []
        for i in skipped:
            holder = holders.get(params[i]["job_unique_key"])
            if holder is None:
                pending.append(i)
            else:
                results[i] = (holder, True)
        if not pending:
            break
    else:
        raise SqlaQueueError(
            f"a unique job of task {params[pending[0]]['job_task']!r} kept meeting a blocking "
            f"job that finished before it could be read, {UNIQUE_ROUNDS} times; enqueue again"
        )
    return [results[i] for i in range(len(params))]


def _write_unique(session: Session, job: Job, new: NewJob) -> Job:
    """Write `job` (transient, as prepared in `new`) as a unique job, now; returns it.

    Written: it becomes persistent with its id, its server-set columns loaded on first
    use. A duplicate: nothing is written and it leaves the session; its id is the blocking
    job's and `job.duplicate` is True.
    """
    params = _row_params(new)
    if job in session:
        session.expunge(job)
    connection = session.connection(bind_arguments=_BIND)
    ((job_id, duplicate),) = _insert_unique(connection, [params])
    job.id = job_id
    job.duplicate = duplicate
    if duplicate:
        return job
    make_transient_to_detached(job)
    session.add(job)
    session.expire(job, _SERVER_SET)
    _notify(session, {new.queue})
    return job


def _enqueue_unique(session: Session, new: NewJob) -> Job:
    """`enqueue`'s path for a unique job: written at once, or found to be a duplicate."""
    params = _row_params(new)  # validates before anything is sent
    job = Job(
        task=new.task,
        args=new.args,
        queue=new.queue,
        priority=new.priority,
        max_attempts=new.max_attempts,
        tags=params["job_tags"],
        meta=new.meta,
    )
    job.__dict__[HOOKS_DUE] = None  # through the hooks above: none due at flush
    job.__dict__.pop(UNIQUE_DUE)
    if session.autoflush:  # as a flush would: pending queues must exist first
        session.flush()
    return _write_unique(session, job, new)


_ROW_KEYS = frozenset(
    {
        "task",
        "args",
        "queue",
        "priority",
        "run_at",
        "delay",
        "max_attempts",
        "tags",
        "meta",
        "unique",
    }
)


_PLAIN_ROW_KEYS = frozenset(
    {"task", "args", "queue", "priority", "run_at", "delay", "max_attempts"}
)
"""A row with only these keys, and no registry in force, has nothing for `prepare_job` to do."""


def _bulk_params(
    rows: Iterable[Mapping[str, Any]], registry: Registry | None
) -> list[dict[str, Any]]:
    """Each row prepared (`prepare_job`) and validated, as `_row_params`.

    With no registry in force, a row without tags, meta or `unique` skips `prepare_job`
    (no defaults, hooks or copies to make): half the Python per row of a bulk enqueue.
    """
    if registry is not None or default_registry() is not None:
        return [_bulk_row(row, registry) for row in rows]
    params = []
    checked: set[tuple[str, str]] = set()  # (task, queue) names that passed validate_name
    for row in rows:
        if isinstance(row, dict) and row.keys() <= _PLAIN_ROW_KEYS:
            args = row.get("args")
            if args is None:
                args = {}
            elif type(args) is not dict and isinstance(args, Mapping):
                args = dict(args)
            task, queue, priority = row.get("task"), row.get("queue"), row.get("priority")
            if queue is None:
                queue = DEFAULT_QUEUE
            names = (task, queue) if type(task) is str and type(queue) is str else None
            params.append(
                _plain_params(
                    task,
                    args,
                    queue,
                    0 if priority is None else priority,
                    row.get("max_attempts"),
                    row.get("run_at"),
                    row.get("delay"),
                    names_checked=names in checked,
                )
            )
            if names is not None:
                checked.add(names)
        else:
            params.append(_bulk_row(row, None))
    return params


def _bulk_row(row: Mapping[str, Any], registry: Registry | None) -> dict[str, Any]:
    unknown = set(row) - _ROW_KEYS
    if unknown:
        raise InvalidJobError(
            task=row.get("task"),
            detail=f"unknown keys {sorted(unknown)}; allowed: {sorted(_ROW_KEYS)}",
        )
    new = prepare_job(
        row.get("task"),
        row.get("args"),
        queue=row.get("queue"),
        priority=row.get("priority"),
        max_attempts=row.get("max_attempts"),
        run_at=row.get("run_at"),
        delay=row.get("delay"),
        tags=row.get("tags"),
        meta=row.get("meta"),
        unique=row.get("unique"),
        registry=registry,
    )
    return _row_params(new)


def _row_params(new: NewJob) -> dict[str, Any]:
    """A prepared job, validated, as the `job_*` parameters of the insert statements."""
    params = _plain_params(
        new.task, new.args, new.queue, new.priority, new.max_attempts, new.run_at, new.delay
    )
    if new.tags or new.meta or type(new.tags) is not list or type(new.meta) is not dict:
        params["job_tags"], params["job_meta_json"] = validate_tags_and_meta(
            new.task, new.tags, new.meta
        )
    unique = new.unique
    if unique is not None:
        params["job_unique_key"] = unique.key_for(new.task, new.queue, new.args)
        params["job_unique_states"] = unique.state_bits
    return params


def _plain_params(
    task: object,
    args: object,
    queue: object,
    priority: object,
    max_attempts: object,
    run_at: object,
    delay: object,
    names_checked: bool = False,
) -> dict[str, Any]:
    """A job without tags, meta or `unique`, validated, as `job_*` parameters."""
    if delay is None:
        interval = None
    elif run_at is not None:
        raise InvalidJobError(task=task, detail="pass run_at or delay, not both")
    else:
        interval = _delay_interval(task, delay)
    return {
        "job_task": task,
        "job_args_json": validate_job(
            task, args, queue, priority, max_attempts, run_at, names_checked
        ),
        "job_queue": queue,
        "job_priority": priority,
        "job_run_at": run_at,
        "job_delay": interval,
        "job_max_attempts": max_attempts,
        "job_tags": [],
        "job_meta_json": "{}",
        "job_unique_key": None,
        "job_unique_states": None,
    }


class EnqueuedIds(list[int]):
    """`enqueue_many`'s result: the ids in input order, and `duplicates`, one flag per row.

    A row that was a unique job's duplicate was not written: its id is the job that blocks
    it (an earlier row of the same call included), and its flag is True.
    """

    duplicates: list[bool]

    def __init__(self, ids: Iterable[int] = (), duplicates: Iterable[bool] | None = None):
        super().__init__(ids)
        self.duplicates = [False] * len(self) if duplicates is None else list(duplicates)


def enqueue_many(
    session: Session | Connection,
    rows: Iterable[Mapping[str, Any]],
    *,
    registry: Registry | None = None,
) -> EnqueuedIds:
    """Insert many jobs in the session's transaction; returns their ids in input order.

    Each row is a dict of `Job` fields (`task`, `args`, `queue`, `priority`, `run_at` or
    `delay`, `max_attempts`, `tags`, `meta`, `unique`), checked as `enqueue` checks them
    (task defaults and insert hooks of `registry` or the default registry included); `args`
    is a dict or None. From COPY_MIN_ROWS rows on (with psycopg) they are sent with COPY on
    the session's own connection, else as multi-row INSERTs (about 1,000 rows a round
    trip); never one statement per job, and nothing is committed.

    Unique rows go by `INSERT ... ON CONFLICT DO NOTHING` (COPY cannot skip a duplicate),
    with ids reserved first so each row's fate is known: multi-row INSERTs, or from
    COPY_MIN_ROWS rows on a COPY into a temporary staging table and one INSERT from it
    (10,000 unique rows: 0.8 s staged, 2.3 s by INSERTs, 0.45-0.64 s for plain COPY;
    measured on a shared 2-core machine). The result's `duplicates` says which rows were
    duplicates.

    `session` may also be a Core `Connection` (code without an ORM session): the same
    statements run in its transaction, which the caller commits.
    """
    params = _bulk_params(rows, registry)
    if not params:
        return EnqueuedIds()
    if isinstance(session, Connection):
        connection = session
    else:
        if session.autoflush:  # as the INSERT path would: pending queues must exist first
            session.flush()
        connection = session.connection(bind_arguments=_BIND)
    plain = [i for i, p in enumerate(params) if p["job_unique_key"] is None]
    unique = [i for i, p in enumerate(params) if p["job_unique_key"] is not None]
    ids = [0] * len(params)
    duplicates = [False] * len(params)
    if plain:
        written_ids = _write_plain(connection, [params[i] for i in plain])
        for i, job_id in zip(plain, written_ids, strict=True):
            ids[i] = job_id
    if unique:
        driver = connection.connection.driver_connection
        reserve = len(unique) > 1 and bool(connection.execute(_MAY_RESERVE_IDS).scalar())
        staged = (
            reserve
            and len(unique) >= COPY_MIN_ROWS
            and isinstance(driver, psycopg.Connection)
            and connection.execute(_MAY_STAGE).scalar()  # a temporary table too
        )
        results = _insert_unique(
            connection, [params[i] for i in unique], driver if staged else None, reserve
        )
        for i, (job_id, duplicate) in zip(unique, results, strict=True):
            ids[i], duplicates[i] = job_id, duplicate
    written = {
        p["job_queue"] for p, duplicate in zip(params, duplicates, strict=True) if not duplicate
    }
    if written:
        if isinstance(session, Connection):
            connection.execute(_NOTIFY_QUEUES, {"queues": sorted(written)})
        else:
            _notify(session, written)
    return EnqueuedIds(ids, duplicates)


def _write_plain(connection: Connection, params: list[dict[str, Any]]) -> list[int]:
    """Rows that are not unique: COPY from COPY_MIN_ROWS on (psycopg), else INSERT."""
    driver = connection.connection.driver_connection
    if (
        len(params) >= COPY_MIN_ROWS
        and isinstance(driver, psycopg.Connection)
        and connection.execute(_MAY_RESERVE_IDS).scalar()  # a role may INSERT without it
    ):
        return _copy_jobs(connection, driver, params)
    return list(connection.execute(_INSERT_JOBS, params).scalars())


_COPY_SPECIAL = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: str) -> str:
    """`value` as a field of COPY's text format (backslash, tab, newline, CR escaped)."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_SPECIAL)
    return value


def _copy_array(values: list[str]) -> str:
    """A text[] literal of `values`, as a field of COPY's text format."""
    quoted = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return _copy_text("{" + ",".join(f'"{v}"' for v in quoted) + "}")


_NULL = "\\N"
_BYTEA_PREFIX = "\\\\x"
"""bytea's hex form (`\\x...`) with its backslash escaped for COPY's text format."""
_COPY_CHUNK = 2000
"""Rows per write to the COPY stream."""


def _run_at_text(p: dict[str, Any], now: dt.datetime, now_text: str) -> str:
    """A row's run_at for COPY: given, or the transaction's now() plus its delay."""
    run_at, delay = p["job_run_at"], p["job_delay"]
    if run_at is not None:
        return str(run_at.isoformat())
    if not delay:
        return now_text
    return str((now + delay).isoformat())  # a delay is at most 100 years: no overflow


def _copy_jobs(
    connection: Connection,
    driver: psycopg.Connection[Any],
    params: list[dict[str, Any]],
    staged: bool = False,
) -> list[int]:
    """COPY the rows in the session's transaction, with ids reserved from the id sequence
    (into the staging table, unique columns included, with `COPY_STAGED_JOBS`).

    Each row is written as one line of COPY's text format, built here from the JSON text
    validation made (serialised once): 3 to 4 times less Python per row than psycopg's
    `write_row` with its per-value dumpers (profiled, 20,000 rows). Into the jobs table,
    run_at, max_attempts and tags with meta are sent only if a row needs them (the columns'
    defaults are the same values): fewer columns for the server to parse, about a fifth
    faster for rows without them (measured, 20,000 rows, no foreign key).
    """
    if staged:
        statement = queries.COPY_STAGED_JOBS
        scheduled = limited = tagged = True
    else:
        scheduled = any(p["job_run_at"] is not None or p["job_delay"] for p in params)
        limited = any(p["job_max_attempts"] is not None for p in params)
        tagged = any(p["job_tags"] or p["job_meta_json"] != "{}" for p in params)
        columns = ["id", "task", "args", "queue", "priority"]
        columns += ["run_at"] * scheduled + ["max_attempts"] * limited + ["tags", "meta"] * tagged
        statement = queries.copy_jobs(columns)
    ids, now = connection.execute(_RESERVE_JOB_ID_ARRAY, {"count": len(params)}).one()
    if len(ids) != len(params):  # pragma: no cover - the server's own guarantee
        raise SqlaQueueError(f"reserved {len(ids)} job ids for {len(params)} rows")
    now_text = now.isoformat()
    lines: list[str] = []
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for job_id, p in zip(ids, params, strict=True):
                fields = [
                    str(job_id),
                    _copy_text(p["job_task"]),
                    _copy_text(p["job_args_json"]),
                    _copy_text(p["job_queue"]),
                    str(p["job_priority"]),
                ]
                if scheduled:  # now() is fixed for the transaction: the INSERT's run_at too
                    fields.append(_run_at_text(p, now, now_text))
                if limited:
                    max_attempts = p["job_max_attempts"]
                    fields.append(_NULL if max_attempts is None else str(max_attempts))
                if tagged:
                    tags = p["job_tags"]
                    fields.append(_copy_array(tags) if tags else "{}")
                    fields.append(_copy_text(p["job_meta_json"]))
                if staged:
                    key, states = p["job_unique_key"], p["job_unique_states"]
                    fields.append(_NULL if key is None else _BYTEA_PREFIX + key.hex())
                    fields.append(_NULL if states is None else str(states))
                line = "\t".join(fields)
                lines.append(line)
                if len(lines) >= _COPY_CHUNK:
                    copy.write("\n".join(lines) + "\n")
                    lines.clear()
            if lines:
                copy.write("\n".join(lines) + "\n")
    except psycopg.Error as exc:
        wrapped = DBAPIError.instance(statement, None, exc, psycopg.Error)
        explained = _explain(exc, None)
        if explained is None:
            raise wrapped from exc
        raise explained from wrapped
    return [int(i) for i in ids]


def _copy_unique(
    connection: Connection, driver: psycopg.Connection[Any], params: list[dict[str, Any]]
) -> dict[int, int]:
    """COPY unique rows to the staging table, insert them from there skipping duplicates;
    returns {row index: id} of the rows written."""
    connection.exec_driver_sql(queries.CREATE_STAGED_JOBS)
    reserved = _copy_jobs(connection, driver, params, staged=True)
    # An unknown queue or a refused row is explained by the engine's handle_error hook.
    got = {int(i) for i in connection.exec_driver_sql(queries.INSERT_STAGED_JOBS).scalars()}
    return {i: job_id for i, job_id in enumerate(reserved) if job_id in got}


async def enqueue_async(session: AsyncSession, task: str, *args: Any, **kwargs: Any) -> Job:
    """`enqueue` for an `AsyncSession`, run in its sync session (for `unique=` and `flush`)."""
    return await session.run_sync(lambda sync_session: enqueue(sync_session, task, *args, **kwargs))


async def enqueue_many_async(
    session: AsyncSession, rows: Iterable[Mapping[str, Any]], *, registry: Registry | None = None
) -> EnqueuedIds:
    """`enqueue_many` for an `AsyncSession`."""
    materialised = list(rows)
    return await session.run_sync(
        lambda sync_session: enqueue_many(sync_session, materialised, registry=registry)
    )


def _notify(session: Session, queue_names: set[str]) -> None:
    notified: set[str] = session.info.setdefault(_NOTIFIED_KEY, set())
    fresh = queue_names - notified
    if fresh:
        session.connection(bind_arguments=_BIND).execute(_NOTIFY_QUEUES, {"queues": sorted(fresh)})
        notified |= fresh


@event.listens_for(Session, "after_flush")
def _notify_after_flush(session: Session, flush_context: UOWTransaction) -> None:
    queue_names = {obj.queue for obj in session.new if isinstance(obj, Job)}
    if queue_names:
        _notify(session, queue_names)


@event.listens_for(Session, "after_transaction_end")
def _forget_notified(session: Session, transaction: SessionTransaction) -> None:
    # Flushes run in their own inner SessionTransaction: only a real (sub)transaction's end
    # counts. PostgreSQL drops notifications of a rolled-back savepoint: notify again then.
    if transaction.parent is None or transaction.nested:
        session.info.pop(_NOTIFIED_KEY, None)


_ABORTED = (
    "; PostgreSQL has aborted this transaction, so nothing in it can commit: roll it back "
    "and write it again without this job"
)
"""Said of every row the database refused: a caller who catches the error and commits
would otherwise lose the whole transaction without a word (COMMIT of it rolls back)."""


def _ours(exc: BaseException) -> str | None:
    """The name of the constraint `exc` reports, if it is on one of the queue's own tables."""
    diag = getattr(exc, "diag", None)
    if diag is None or getattr(diag, "schema_name", None) != SCHEMA:
        return None  # an application's own `jobs` table may use the same constraint names
    return getattr(diag, "constraint_name", None)


def _unknown_queue(exc: BaseException) -> UnknownQueueError | None:
    """The clear error for a job whose queue does not exist (under the queue FK), if it is one."""
    if _ours(exc) != _QUEUE_FK:
        return None
    match = _MISSING_KEY.search(getattr(exc.diag, "message_detail", None) or "")  # type: ignore[attr-defined]
    if match is None:  # the FK also fires when a queue with jobs is deleted
        return None
    message = (UnknownQueueError.__doc__ or "").strip().rstrip(".") + _ABORTED + "."
    return UnknownQueueError(message, queue=match.group("queue"))


_CHECKS = {
    "ck_jobs_task_name": f"a task name is 1 to {SCHEMA_MAX_NAME_LENGTH} characters",
    "ck_jobs_queue_name": f"a queue name is 1 to {SCHEMA_MAX_NAME_LENGTH} characters",
    "ck_queues_name": f"a queue name is 1 to {SCHEMA_MAX_NAME_LENGTH} characters",
    "ck_jobs_args_object": "args are a JSON object (a dict of keyword arguments)",
    "ck_jobs_args_size": f"args are at most {SCHEMA_MAX_ARGS_BYTES} bytes as jsonb text",
    "ck_jobs_priority": f"priority is between 0 and {PRIORITY_MAX}",
    "ck_jobs_max_attempts": "max_attempts is a positive int or NULL",
}
"""Our CHECK constraints on written rows, each with the rule it holds."""


def _refused_by_check(exc: BaseException, parameters: object) -> InvalidJobError | None:
    """The clear error for a row one of our CHECK constraints refused, if it is one."""
    constraint = _ours(exc) or ""
    rule = _CHECKS.get(constraint)
    if rule is None:
        return None
    task = None
    if isinstance(parameters, dict):
        task = parameters.get("task", parameters.get("job_task"))
    return InvalidJobError(
        task=task if isinstance(task, str) else "(not known)",
        detail=f"the database refused the row: {rule} (CHECK constraint {constraint}, "
        f"which holds for every writer, also Core inserts and later attribute changes){_ABORTED}",
    )


_NOT_THERE = re.compile(rf'^(relation "{SCHEMA}\.[^"]+"|schema "{SCHEMA}") does not exist')
_NOT_THERE_STATES = ("42P01", "3F000")
"""undefined_table and invalid_schema_name: how a statement meets an unmigrated database."""


def _schema_missing(exc: BaseException) -> SchemaMissingError | None:
    """The clear error for a statement on our schema in a database that lacks it (never
    migrated, or an older revision without the table), if it is one: translated when it
    happens, so the enqueue path pays no round trip to check first."""
    if getattr(exc, "sqlstate", None) not in _NOT_THERE_STATES:
        return None
    match = _NOT_THERE.match(getattr(getattr(exc, "diag", None), "message_primary", None) or "")
    if match is None:  # another schema's table: the application's own error
        return None
    from .migrate import SCHEMA_REVISION  # alembic, imported only on this path

    message = (SchemaMissingError.__doc__ or "").strip().rstrip(".") + (
        "; the statement failed, so PostgreSQL has aborted this transaction and nothing in "
        "it can commit: roll it back, migrate, and run it again."
    )
    return SchemaMissingError(
        message, found=f"{match.group(1)} does not exist", expected=SCHEMA_REVISION
    )


def _explain(exc: BaseException, parameters: object) -> SqlaQueueError | None:
    """Our clear error for a statement the database refused, if `exc` is one we know."""
    return _unknown_queue(exc) or _refused_by_check(exc, parameters) or _schema_missing(exc)


@event.listens_for(Engine, "handle_error")
def _explain_refusal(context: ExceptionContext) -> BaseException | None:
    error = _explain(context.original_exception, context.parameters)
    if error is not None:
        error.__cause__ = context.sqlalchemy_exception
    return error
