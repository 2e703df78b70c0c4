"""Writing jobs in the caller's own transaction: `enqueue`, `enqueue_many`, and the NOTIFY hook.

Every path passes `sqla_queue.enqueue.hooks.prepare_job` (task defaults, insert hooks, the unknown
task check) before the job is validated; a `Job` added directly passes it at flush. Nothing
here commits. The job becomes visible to workers when the caller's transaction
commits, and is gone if it rolls back. Workers are woken by `pg_notify` (never a per-row
trigger), which PostgreSQL delivers only on commit: a job of `enqueue` carries it in its
own INSERT statement (written at flush, or at once with a Core `Connection`); `enqueue_many`
and a `Job` added to the session send it once per queue per transaction.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import Connection, Engine, Select, event, func, inspect
from sqlalchemy.orm import (
    Session,
    UOWTransaction,
    make_transient_to_detached,
    scoped_session,
)
from sqlalchemy.sql import ClauseElement

from sqla_queue.db import queries
from sqla_queue.db.models import (
    DEFAULT_QUEUE,
    DELAY_DUE,
    HOOKS_DUE,
    LINKS_DUE,
    UNIQUE_DUE,
    Job,
    Queue,
    checked_job,
    validate_job,
    validate_tags_and_meta,
)
from sqla_queue.enqueue.hooks import default_registry, prepare_job
from sqla_queue.enqueue.inserts import refusals, wake
from sqla_queue.enqueue.inserts.bulk import EnqueuedIds, enqueue_many, enqueue_many_async
from sqla_queue.enqueue.inserts.copy import COPY_MIN_ROWS
from sqla_queue.enqueue.inserts.links import Link, link_jobs, resolve
from sqla_queue.enqueue.inserts.params import (
    DEPENDS,
    JOB_BIND,
    JOB_FIELDS,
    SERVER_SET,
    ByOptionsUsed,
    plain_params,
    row_params,
)
from sqla_queue.enqueue.inserts.routed import has_row_refs, refuse_routed, routed_refusal
from sqla_queue.enqueue.inserts.unique import (
    UNIQUE_ROUNDS,
    enqueue_unique,
    insert_unique,
    unique_on_routed,
    write_unique,
)
from sqla_queue.enqueue.inserts.wake import NOTIFIED_KEY, NOTIFY_QUEUES
from sqla_queue.errors import InvalidJobError
from sqla_queue.job.about import about_text
from sqla_queue.job.new_job import NewJob
from sqla_queue.job.options import (
    OPTION_NAMES,
    JobOptionFields,
    JobOptions,
    column_values,
    delay_interval,
    options_from,
)
from sqla_queue.job.unique import resolve_unique
from sqla_queue.job.validation import COLUMN_OPTIONS, encodes_as, invalid_job

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from typing_extensions import Unpack

    from sqla_queue.job.tasks import TaskLookup

# Built once: constructing a Core statement costs more than sending it (profiled per enqueue).
_INSERT_AND_NOTIFY = ByOptionsUsed(queries.insert_job_and_notify)
_INSERT_PLAIN_AND_NOTIFY = queries.insert_plain_job_and_notify()


def _insert_and_notify(params: Mapping[str, Any]) -> Select[Any]:
    """The statement that writes one job of `params` and its NOTIFY: the plain one (task,
    args, queue, priority) for a job that uses nothing else."""
    if (
        params["job_run_at"] is None
        and params["job_delay"] is None
        and not params["job_tags"]
        and params["job_meta_json"] == "{}"
        and not [1 for _, key in _COLUMN_PARAMS if params[key] is not None]
    ):
        return _INSERT_PLAIN_AND_NOTIFY
    return _INSERT_AND_NOTIFY([params])


_INSERT_QUEUE = queries.insert_queue()


@overload
def enqueue(
    session: Connection,
    task: str,
    args: Mapping[str, Any] | None = None,
    *,
    options: JobOptions | None = None,
    flush: bool = False,
    registry: TaskLookup | None = None,
    **fields: Unpack[JobOptionFields],
) -> int: ...


@overload
def enqueue(
    session: Session | AsyncSession,
    task: str,
    args: Mapping[str, Any] | None = None,
    *,
    options: JobOptions | None = None,
    flush: bool = False,
    registry: TaskLookup | None = None,
    **fields: Unpack[JobOptionFields],
) -> Job: ...


def enqueue(
    session: Session | AsyncSession | Connection,
    task: str,
    args: Mapping[str, Any] | None = None,
    *,
    options: JobOptions | None = None,
    flush: bool = False,
    registry: TaskLookup | None = None,
    **fields: Unpack[JobOptionFields],
) -> Job | int:
    """Add a job to `session` and return it; it commits (or not) with the session.

    `args` are the handler's keyword arguments, as one JSON-serialisable dict. Its options
    (`sqla_queue.JobOptions`) are keywords or `options=JobOptions(...)`: `run_at` (an aware
    datetime) or `delay` (seconds, measured by the database clock) schedule it;
    `priority` 0 (the default) runs first. `tags` (names to find it by: `sqla-queue jobs list
    --tag`) and `meta` (a dict of context that is not an argument, e.g. a trace id) reach the
    handler as `ctx.tags` and `ctx.meta`. Works with a sync `Session` and an `AsyncSession`.

    The returned job's `id` is None until the session flushes: pass `flush=True` to flush
    at once (a sync `Session` only; with an `AsyncSession`, `await session.flush()`), which
    sends the session's other pending changes too, as any flush does. Still not committed.

    With a registry (`registry=`, or the default from `sqla_queue.set_default_registry`),
    an unknown task name is refused here (`UnknownTaskError`), options not given take the
    task's own (`Task.options`), and its insert hooks run. Without one, the job is written
    as given (queue "default", priority 0).

    `unique` (True, a `sqla_queue.Unique`, or None for the task's default; see
    `sqla_queue.job.unique`) writes the job at once, with a sync `Session` (for an
    `AsyncSession`, `await enqueue_async(...)`): the returned job has its id, and if a job
    with the same key was there already, nothing is written and the returned job is that
    one, with `job.duplicate` True. A duplicate never raises, so the transaction goes on.

    With a Core `Connection` instead of a session (code that has no ORM session), the job
    is written at once in the connection's transaction, by one statement that also sends
    the NOTIFY, and its id is returned (a unique job's duplicate: the blocking job's id).
    Nothing is committed: the caller's `connection.commit()` (or `engine.begin()` block)
    does it. `flush` makes no difference there.
    """
    call = options_from("enqueue()", options, fields, invalid_job(task))
    return enqueue_job(session, task, args, call, flush, registry)


def enqueue_job(
    session: Session | AsyncSession | Connection,
    task: str,
    args: Mapping[str, Any] | None,
    options: JobOptions,
    flush: bool = False,
    registry: TaskLookup | None = None,
    defaults: JobOptions | None = None,
    call: str | None = None,
) -> Job | int:
    """`enqueue` with its options built: the one path of `enqueue`, `Task.enqueue` and
    `Task.defer` (`defaults`: the task's options, for a task outside the registry in
    force; `call`: the caller's name, for a wrong first argument)."""
    _check_session(session, call or ("enqueue()" if defaults is None else "Task.enqueue()"))
    install_listeners()
    if flush and not isinstance(session, (Session, Connection)):
        raise TypeError("enqueue(flush=True) needs a sync Session; `await session.flush()`")
    new = prepare_job(task, args, options, registry=registry, defaults=defaults)
    if isinstance(session, Connection):
        return _enqueue_core(session, new)
    if new.unique is not None:
        if not isinstance(session, Session):
            raise TypeError(
                "enqueue(unique=...) writes at once, which needs a sync Session; with an "
                "AsyncSession, `await enqueue_async(session, ...)`"
            )
        job = enqueue_unique(session, new)
        if new.depends_on is not None and not job.duplicate:
            _link_now(session.connection(bind_arguments=JOB_BIND), job.id, new)
            session.expire(job, _LINKED)
        return job
    interval = delay_interval(new.run_at, new.delay, invalid_job(new.task))
    checked = _checked_params(new, interval)  # the one check of its fields
    fields = {name: getattr(new, name) for name in JOB_FIELDS}
    fields["tags"] = checked["job_tags"]
    if fields["meta"] is None:
        fields["meta"] = {}
    later = None
    if interval is not None:
        fields["run_at"] = later = func.now() + interval
    elif new.run_at is not None:
        fields["run_at"] = new.run_at
    routes_checked = False
    if isinstance(session, Session) and _not_kept_on_routes(new):
        # refused at the call, not at the flush (an AsyncSession's is, at its flush)
        refuse_routed(session.connection(bind_arguments=JOB_BIND), [_routed_params(new)])
        routes_checked = True
    job = checked_job(fields)  # not Job(**fields): that would check every field again
    job.__dict__[_ENQUEUED] = (later, interval, checked, tuple(checked["job_tags"]))
    if routes_checked:
        job.__dict__[_ROUTES_CHECKED] = True
    if new.depends_on is not None:
        job.__dict__[LINKS_DUE] = (new.depends_on, new.on_failure)
    session.add(job)
    if flush:
        session.flush()
    return job


def _checked_params(new: NewJob, interval: dt.timedelta | None) -> dict[str, Any]:
    """`new`'s fields checked, once, as the `job_*` parameters its flush writes (unless a
    field is changed on the Job before: `_write_enqueued` then checks it again)."""
    if new.about is not None and not isinstance(new.about, str):  # set by a hook
        new.about = about_text(new.about, invalid_job(new.task))
    tags, meta_json = validate_tags_and_meta(new.task, new.tags, new.meta)
    params = plain_params(
        new.task, new.args, new.queue, new.priority, new.run_at, interval, column_values(new)
    )
    params["job_tags"], params["job_meta_json"] = tags, meta_json
    return params


def _unchanged(job: Job, run_at: object, interval: object, checked: dict[str, Any]) -> bool:
    """Whether `job`'s fields are still those `enqueue` checked (`_checked_params`): the
    same objects, and its args, tags and meta not changed in place either."""
    state = job.__dict__
    return (
        state.get("task") is checked["job_task"]
        and state.get("queue") is checked["job_queue"]
        and state.get("priority") is checked["job_priority"]
        and run_at is checked["job_run_at"]
        and interval is checked["job_delay"]
        and not [1 for name, key in _COLUMN_PARAMS if state.get(name) is not checked[key]]
        and state.get("tags") is checked["job_tags"]
        and tuple(checked["job_tags"] or ()) == state[_ENQUEUED][3]
        and _same_json(state.get("args"), checked["job_args_json"])
        and _same_json(state.get("meta"), checked["job_meta_json"])
    )


def _same_json(value: object, encoded: str) -> bool:
    """`encodes_as`, without encoding an empty dict that was empty."""
    if encoded == "{}" and type(value) is dict and not value:
        return True
    return encodes_as(value, encoded)


_COLUMN_PARAMS = tuple((name, f"job_{name}") for name in COLUMN_OPTIONS)


def install_listeners() -> None:
    """Install the listeners every enqueue path relies on, once per process (idempotent):
    on the `Session` class, the flush hooks that run insert hooks and write unique and
    linked jobs added to a session, and the NOTIFY that wakes workers (`inserts.wake`); on
    the `Engine` class, the clear errors for refused statements (`inserts.refusals`).

    `import sqla_queue` installs none: the first enqueue does (`enqueue`, `Task.enqueue`,
    `enqueue_many`, ...), as do `Registry()` and the first `Job(...)` made, so a job added
    with `session.add(Job(...))` is written as one enqueued."""
    if _INSTALLED:  # asking `event.contains` three times cost a tenth of an enqueue() call
        return
    refusals.listen()
    wake.listen()
    with _LISTENING:
        if not event.contains(Session, "before_flush", _hooks_before_flush):
            event.listen(Session, "after_flush_postexec", _link_after_flush)
            event.listen(Session, "before_flush", _hooks_before_flush)  # last: the check above
        _INSTALLED.append(True)


_LISTENING = threading.Lock()
_INSTALLED: list[bool] = []
"""Not empty once `install_listeners` has installed them all in this process."""


def _job_made(job: Job, args: Any, kwargs: Any) -> None:
    install_listeners()


# The one listener set at import, on our own `Job` class (not on Session or Engine): the
# first `Job(...)` made installs the enqueue listeners, once.
event.listen(Job, "init", _job_made, once=True)


def _check_session(session: object, call: str) -> None:
    """Refuse, in one line naming the mistake, a first argument that is not what the job
    is written through (args given first, an Engine, a sessionmaker)."""
    if isinstance(session, (Session, Connection, scoped_session)):
        return
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session

    if isinstance(session, (AsyncSession, async_scoped_session)):
        return
    if isinstance(session, Mapping):
        given = f"a {type(session).__name__}: the args go second"
    elif isinstance(session, Engine):
        given = "an Engine: open a Session or a Connection on it, whose commit writes the job"
    else:
        given = repr(session) if session is None else f"a {type(session).__name__}"
    raise TypeError(
        f"{call} writes the job in your transaction: pass a Session, an AsyncSession or a "
        f"Connection as the first argument, then the args (got {given}); e.g. "
        "`with Session(engine) as session, session.begin(): task.enqueue(session, {...})`"
    )


def _enqueue_core(connection: Connection, new: NewJob) -> int:
    """`enqueue(connection, ...)`: the INSERT and its NOTIFY in one round trip; the id."""
    params = row_params(new)
    depends = params.pop(DEPENDS, None)
    if new.unique is None:
        refuse_routed(connection, [{**params, "job_row_refs": has_row_refs(new.args)}])
        job_id = int(connection.execute(_insert_and_notify(params), params).scalar_one())
        duplicate = False
    else:
        ((job_id, duplicate),) = insert_unique(connection, [params], depends=[depends])
        if not duplicate:
            connection.execute(NOTIFY_QUEUES, {"queues": [new.queue]})
    if depends is not None and not duplicate:
        link_jobs(connection, [Link(job_id, new.task, depends, new.workflow_id)])
    return job_id


_LINKED = ["status", "deps_left", "workflow_id", "last_error", "finished_at"]
"""The columns `link_jobs` sets on a job after its insert: expired on the Job, so they
are read back on first use."""


def _link_now(connection: Connection, job_id: int, new: NewJob) -> None:
    """Link a job written at once (a unique one) to what it depends on."""
    pairs = resolve(new.task, new.depends_on, new.on_failure)
    link_jobs(connection, [Link(job_id, new.task, pairs, new.workflow_id)])


MERGED_JOB = (
    "session.merge(Job(...)) writes a copy of a new job without what Job(...) keeps for "
    "its flush (unique=, depends_on=, which options were given): it would run without its "
    "key or before the jobs it depends on; add a new job with session.add(job) or enqueue()"
)
"""Why a new Job that came through `session.merge` is refused at flush."""


def _run_due_hooks(job: Job) -> NewJob | None:
    """Task defaults and insert hooks for a `Job` constructed by the caller, at flush.

    A new Job that never passed `Job.__init__` is the copy `session.merge(Job(...))` makes,
    which leaves behind what `Job(...)` keeps for its flush (`unique=`, `depends_on=`, the
    options given): refused (`MERGED_JOB`), else it would run without its key or before
    the jobs it depends on. One with an id (a loaded job made transient again) has no
    record of what was given: its hooks run with every field taken as given. Returns the
    job as prepared if it is unique (it must then be written by `write_unique`, not by the
    flush), else None.
    """
    if HOOKS_DUE not in job.__dict__ and job.id is None:
        raise InvalidJobError(task=job.task, detail=MERGED_JOB)
    not_given = job.__dict__.get(HOOKS_DUE, frozenset())
    if not_given is None:  # made by enqueue, or already through the hooks
        return None
    raw_unique = job.__dict__.pop(UNIQUE_DUE, None)
    delay = job.__dict__.pop(DELAY_DUE, None)
    job.__dict__[HOOKS_DUE] = None  # once: a flush that fails later does not run them again
    given_run_at = job.run_at if isinstance(job.run_at, dt.datetime) else None
    depends_on, on_failure = job.__dict__.get(LINKS_DUE, (None, None))
    if default_registry() is None:
        unique = resolve_unique(raw_unique)
        if unique is None:
            return None
        return NewJob(
            task=job.task,
            args=job.args,
            queue=job.queue,
            priority=job.priority,
            run_at=given_run_at,
            delay=delay,
            tags=job.tags,
            meta=job.meta,
            unique=unique,
            depends_on=depends_on,  # checked against a holder's (a duplicate's are refused)
            on_failure=on_failure,
            **column_values(job),
        )
    as_given = {name: getattr(job, name, None) for name in OPTION_NAMES}
    as_given.update(
        run_at=given_run_at,
        delay=delay,
        unique=raw_unique,
        depends_on=depends_on,
        on_failure=on_failure,
    )
    given = JobOptions(**{k: None if k in not_given else v for k, v in as_given.items()})
    new = prepare_job(job.task, job.args, given)
    if new.depends_on is not None:
        job.__dict__[LINKS_DUE] = (new.depends_on, new.on_failure)
    else:
        job.__dict__.pop(LINKS_DUE, None)
    validate_job(new.task, new.args, new.queue, new.priority, new.run_at, column_values(new))
    interval = delay_interval(new.run_at, new.delay, invalid_job(new.task))
    new.tags, _ = validate_tags_and_meta(new.task, new.tags, new.meta)
    for field in JOB_FIELDS:
        if getattr(job, field) != getattr(new, field):
            setattr(job, field, getattr(new, field))
    if new.unique is not None:
        return new
    if interval is not None:
        job.run_at = func.now() + interval
    elif new.run_at is not given_run_at:
        job.run_at = new.run_at  # type: ignore[assignment]
    return None


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
            write_unique(session, job, unique)
    _refuse_routed_jobs(session, [job for job in jobs if job.id is None])
    linked = [job for job in jobs if _links_due(job)]
    for job in enqueued:
        if not _write_enqueued(session, job):  # the unit of work writes it, as an added Job
            del job.__dict__[_ENQUEUED]
    # Jobs written above whose parents have ids are linked now: the unit of work may have
    # nothing left to write, and then no after-flush event comes. The rest wait for it.
    ready = [job for job in linked if job.id is not None and _parents_written(job)]
    _link(session, ready)
    later = [job for job in linked if job not in ready]
    if later or _PENDING_LINKS in session.info:  # this flush's own (a failed one's are gone)
        session.info[_PENDING_LINKS] = later


def _not_kept_on_routes(job: Job | NewJob) -> bool:
    """Whether `job` has what a routed queue refuses, beside a unique key (checked where
    unique jobs are written): a sequence, a partition or a start deadline."""
    return (
        job.sequence is not None
        or job.partition is not None
        or job.expires_at is not None
        or has_row_refs(job.args) is not None
    )


def _routed_params(job: Job | NewJob) -> dict[str, Any]:
    """What `routed_refusal` reads of a job (not unique: those are checked when written)."""
    return {
        "job_queue": job.queue or DEFAULT_QUEUE,
        "job_task": job.task,
        "job_sequence": job.sequence,
        "job_partition": job.partition,
        "job_expires_at": job.expires_at,
        "job_row_refs": has_row_refs(job.args),
    }


def _refuse_routed_jobs(session: Session, jobs: list[Job]) -> None:
    """At flush, refuse a job with a sequence or a partition for a routed queue (one read
    for the flush's jobs, `routed_refusal`): it leaves the session, and the transaction
    goes on without it."""
    jobs = [j for j in jobs if _not_kept_on_routes(j) and not j.__dict__.get(_ROUTES_CHECKED)]
    if not jobs:
        return
    params = [_routed_params(job) for job in jobs]
    refused = routed_refusal(session.connection(bind_arguments=JOB_BIND), params)
    if refused is not None:
        session.expunge(jobs[refused[0]])
        raise refused[1]


def _links_due(job: Job) -> bool:
    due = job.__dict__.get(LINKS_DUE)
    return due is not None and due[0] is not None


def _link_after_flush(session: Session, flush_context: UOWTransaction) -> None:
    """Link the jobs of this flush that have `depends_on`, once every job of it (their
    parents among them) has its id: still in the flush's transaction."""
    jobs = session.info.pop(_PENDING_LINKS, None)
    if jobs:
        _link(session, jobs)


def _parents_written(job: Job) -> bool:
    depends_on = job.__dict__[LINKS_DUE][0]
    entries = depends_on if isinstance(depends_on, (list, tuple)) else ()
    return all(getattr(getattr(e, "job", e), "id", 0) is not None for e in entries)


def _link(session: Session, jobs: list[Job]) -> None:
    """Link `jobs` (written, with their parents) to what they depend on."""
    if not jobs:
        return
    links = []
    for job in jobs:
        depends_on, on_failure = job.__dict__.pop(LINKS_DUE)
        if job.duplicate or job.id is None:
            continue
        pairs = resolve(job.task, depends_on, on_failure)
        links.append(Link(job.id, job.task, pairs, job.__dict__.get("workflow_id")))
    link_jobs(session.connection(bind_arguments=JOB_BIND), links)
    for job in jobs:
        if job in session and not job.duplicate:
            session.expire(job, _LINKED)


_PENDING_LINKS = "_sqla_queue_pending_links"
"""Key in `session.info`: the Jobs of the current flush that have dependencies to link."""


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


_ROUTES_CHECKED = "_sqla_queue_routes_checked"
"""Instance key of a Job that `enqueue(session, ...)` checked against routed queues already
(its sequence or partition): the flush does not read the queues again for it."""
_ENQUEUED = "_sqla_queue_enqueued"
"""Instance key of a Job made by `enqueue(session, ...)`: (the run_at expression it was given
for a delay, or None; that delay; its `job_*` parameters as checked at the call; its tags
then). The flush writes it with `_write_enqueued`."""


def _write_enqueued(session: Session, job: Job) -> bool:
    """Write a job made by `enqueue(session, ...)` at flush, by one statement that also sends
    the NOTIFY (the unit of work would send an INSERT and then the NOTIFY: one round trip
    and about a third of the job's CPU more, profiled); it becomes persistent, its
    server-set columns loaded on first use, as after the unit of work's INSERT.

    False (the unit of work writes it) when its run_at was since set to another SQL
    expression. The parameters `enqueue` checked are sent as they are; a field changed
    since (set, or its args, tags or meta changed in place) has them all checked again.
    """
    later, interval, checked, _ = job.__dict__[_ENQUEUED]
    run_at: object = job.run_at
    if run_at is later is not None:
        run_at = None
    elif isinstance(run_at, ClauseElement):
        return False
    else:
        interval = None
    if _unchanged(job, run_at, interval, checked):
        params = checked  # checked by enqueue, and nothing changed since
    else:
        params = plain_params(
            job.task, job.args, job.queue, job.priority, run_at, interval, column_values(job)
        )
        if job.tags or job.meta:
            params["job_tags"], params["job_meta_json"] = validate_tags_and_meta(
                job.task, job.tags, job.meta
            )
    connection = session.connection(bind_arguments=JOB_BIND)
    # Failed: still pending, as a failed flush leaves the unit of work's jobs.
    job.id = int(connection.execute(_insert_and_notify(params), params).scalar_one())
    del job.__dict__[_ENQUEUED]
    # Pending to persistent as the unit of work makes its own (events, identity map, and
    # gone again on rollback): expunge, make_transient_to_detached and add cost a third of
    # the job's Python in a business transaction (profiled).
    session._register_persistent({inspect(job)})
    session.expire(job, SERVER_SET)
    session.info.setdefault(NOTIFIED_KEY, set()).add(job.queue)
    return True


def check_async_session(session: object, call: str) -> None:
    """Refuse, in one line, anything but an `AsyncSession` where one is needed."""
    from sqlalchemy.ext.asyncio import AsyncSession

    if isinstance(session, AsyncSession):
        return
    sync = "; with a sync Session, call enqueue()" if isinstance(session, Session) else ""
    raise TypeError(
        f"{call} needs an AsyncSession as the first argument, got a {type(session).__name__}{sync}"
    )


async def enqueue_async(session: AsyncSession, task: str, *args: Any, **kwargs: Any) -> Job:
    # Its keywords are enqueue's, checked there (`options=`, JobOptions' fields, registry).
    """`enqueue` for an `AsyncSession`, run in its sync session (for `unique=` and `flush`):
    the same registry in force (`registry=`, else the default), so a task's name takes its
    task's queue and defaults as with `enqueue`. `Task.enqueue_async` enqueues through the
    task object itself."""
    check_async_session(session, "enqueue_async()")
    return await session.run_sync(lambda sync_session: enqueue(sync_session, task, *args, **kwargs))


__all__ = [
    "COPY_MIN_ROWS",
    "UNIQUE_ROUNDS",
    "EnqueuedIds",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "unique_on_routed",
]
