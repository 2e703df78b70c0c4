"""Administration as Python calls: queues, stats, pruning, and finding, retrying, cancelling and
deleting jobs. The CLI (and a dashboard) is built on these.

Each takes a `Connection` or a `Session` and runs in the caller's transaction; none commits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Result
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sqla_queue.db import queries
from sqla_queue.db.queries import steps as step_queries
from sqla_queue.db.queries.admin import UNIQUE_KEY_INDEX
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.encoding import PENDING_RESULT
from sqla_queue.job.states import COUNTED, FINISHED, JobStatus
from sqla_queue.job.validation import (
    MAX_ATTEMPTS,
    check_count,
    check_duration,
    check_job_id,
    check_workflow_id,
    validate_name,
)

Bind = Connection | Session


def rowcount(result: Result[Any]) -> int:
    """The rows the statement of `result` changed (0 where the driver does not say)."""
    return int(getattr(result, "rowcount", 0) or 0)


@dataclass
class QueueStats:
    """Counts per status for one queue (`running` jobs whose handler has not started as
    `claimed`), and the age in seconds of its oldest due job."""

    queue: str
    paused: bool | None
    counts: dict[str, int]
    oldest_due_age: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "paused": self.paused,
            **{name: self.counts.get(name, 0) for name in COUNTED},
            "oldest_due_age_seconds": self.oldest_due_age,
        }


def stats(bind: Bind) -> list[QueueStats]:
    """Per queue: jobs by status and the oldest due job's age. Queues without a row in
    `queues` (possible once the foreign key is dropped) are listed with `paused` None."""
    result: dict[str, QueueStats] = {}
    for name, paused, status, count, age in bind.execute(queries.queue_stats()):
        entry = result.setdefault(name, QueueStats(name, paused, {}, None))
        if status is not None:
            entry.counts[status] = int(count)
        if age is not None:
            entry.oldest_due_age = float(age)
    return list(result.values())


def prune(
    bind: Bind,
    older_than: float,
    statuses: Sequence[str] = (JobStatus.done.value,),
    archive: bool = False,
) -> int:
    """Delete finished jobs older than `older_than` seconds, from `jobs` and the history.

    A partition of the history whose whole period is older, holding only jobs of
    `statuses`, is dropped (`DROP TABLE`: its jobs go at once, however many, with their
    steps, progress and log lines); the rows of the partition the cut-off falls in are
    deleted. `archive` also prunes the unpartitioned archive of releases before
    sqlaq_0030_history (the keeper empties it into the history)."""
    finished = set(FINISHED)
    bad = set(statuses) - finished
    if bad:
        raise ConfigurationError(
            detail=f"can only prune finished statuses {sorted(finished)}, not {sorted(bad)}"
        )
    older_than = check_duration("older_than", older_than)
    params = {"statuses": list(statuses), "older_than": older_than}
    count = rowcount(bind.execute(queries.prune_jobs(), params))
    count += _drop_history_partitions(bind, older_than, list(statuses))
    count += rowcount(bind.execute(queries.prune_history(), params))
    if archive:
        count += rowcount(bind.execute(queries.prune_archive(), {"older_than": older_than}))
    bind.execute(queries.workflows.prune_edges())  # the edges of jobs gone from both tables
    return count


def _drop_history_partitions(bind: Bind, older_than: float, statuses: list[str]) -> int:
    """Drop the history's partitions whose period ended `older_than` seconds ago or more
    and that hold only jobs of `statuses`; returns how many jobs they held."""
    before = bind.execute(queries.prune_cut_off(), {"older_than": older_than}).scalar_one()
    dropped = 0
    for part in bind.execute(queries.history_partitions()).all():
        if part.ends > before:
            break
        rows = bind.execute(queries.history_partition_rows(part.name), {"statuses": statuses})
        kept, other = rows.one()
        if other:
            continue  # jobs of another status stay: their rows are deleted one by one
        bind.execute(queries.drop_history_journal(part.name))
        bind.execute(queries.drop_history_partition(part.name))
        dropped += int(kept)
    return dropped


NOTIFY_PAYLOAD_CHARS = 7000
"""Ids per cancel notification at most, in characters (PostgreSQL's payload limit is 8000)."""


def cancel_jobs(bind: Bind, job_ids: Iterable[int]) -> dict[int, str]:
    """Cancel queued or running jobs; returns {id: status it had}. Others are left alone.

    When the transaction commits, the workers holding the running ones are told at once
    (NOTIFY): a handler sees `ctx.cancelled`, a job claimed but not started never starts.
    Whatever a handler returns afterwards is discarded, and the job never runs again.
    """
    ids = _job_ids(job_ids)
    rows = bind.execute(queries.cancel_jobs(), {"job_ids": ids}).mappings()
    cancelled = {int(row["id"]): str(row["status"]) for row in rows}
    running = [str(i) for i, status in cancelled.items() if status == JobStatus.running.value]
    payload = ""
    for job_id in running:
        if len(payload) + len(job_id) + 1 > NOTIFY_PAYLOAD_CHARS:
            bind.execute(queries.notify_cancelled(), {"job_ids": payload})
            payload = ""
        payload = f"{payload},{job_id}" if payload else job_id
    if payload:
        bind.execute(queries.notify_cancelled(), {"job_ids": payload})
    return cancelled


def job_statuses(bind: Bind, job_ids: Iterable[int]) -> dict[int, str]:
    """{id: status} of the jobs that exist among `job_ids`: in the jobs table, or finished
    and kept in the history."""
    rows = bind.execute(queries.job_statuses(), {"job_ids": _job_ids(job_ids)})
    return {int(job_id): str(status) for job_id, status in rows}


# -- finding, retrying and deleting jobs -------------------------------------------------------

MAX_LIST_LIMIT = 1000
"""The most jobs `list_jobs` returns per page; page on with `before=`."""
DEFAULT_DEPTH_CAP = 10_000
"""`queue_depth` counts due and scheduled jobs up to this many: it stays cheap at any backlog."""


@dataclass
class JobSummary:
    """One job as `list_jobs` returns it (never its args)."""

    id: int
    task: str
    queue: str
    status: str
    priority: int
    attempts: int
    max_attempts: int | None
    run_at: dt.datetime
    created_at: dt.datetime
    finished_at: dt.datetime | None
    tags: list[str]
    workflow_id: str | None
    """The workflow it belongs to (`enqueue(..., workflow_id=)`, or its first parent's)."""
    about: str | None
    """The row it is about, as `<table>:<key>` (`enqueue(..., about=order)`)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 text."""
        return {key: jsonable(value) for key, value in dataclasses.asdict(self).items()}


@dataclass
class JobDetail(JobSummary):
    """One job in full, as `get_job` returns it: args, the last error, each attempt's
    error, timings."""

    args: dict[str, Any]
    meta: dict[str, Any]
    last_error: str | None
    locked_by: str | None
    locked_at: dt.datetime | None
    started_at: dt.datetime | None
    heartbeat_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    archived: bool
    """Whether it was found in the history (a succeeded job of a `keep` or `archive` queue)."""
    deps_left: int | None
    """While `waiting`: how many of the jobs it depends on have not ended (None without
    `depends_on`)."""
    errors: list[dict[str, Any]] | None
    """Its error history, oldest first: one entry per attempt that ended without success
    ({attempt, worker, started_at, finished_at, class, message, traceback}; times as ISO
    8601 text), at most 20, the first and the latest (`sqla_queue.job.history`); None
    until its first error."""
    result: Any = None
    """What its handler returned, when its task keeps results (`keep_result=True`); None
    otherwise (and while a `ctx.session()` commit keeps it pending)."""
    expires_at: dt.datetime | None = None
    """Its start deadline (`expires_in=`, `expires_at=`): not started by then, it is
    cancelled ("expired"); None for none."""
    signal_key: str | None = None
    """While `waiting` for a signal (`ctx.wait_for_signal`): its key, `run_at` the wait's
    deadline; afterwards the last key it waited for; None for a job that never waited."""

    @property
    def sleeping_until(self) -> dt.datetime | None:
        """When a job parked by a durable sleep (`ctx.sleep`) runs again: its `run_at`,
        while it sleeps (`waiting` for neither a signal nor a job it depends on); None
        otherwise."""
        if (
            self.status == JobStatus.waiting.value
            and self.signal_key is None
            and self.deps_left is None
            and not self.archived
        ):
            return self.run_at
        return None

    @property
    def attempts_text(self) -> str:
        """ "1 of 5": its attempts and its budget (unknown until a worker that knows its
        task claims it: then the task's max_attempts, else 5)."""
        budget = self.max_attempts or "its task's max_attempts (else 5)"
        return f"{self.attempts} of {budget}"


def jsonable(value: Any) -> Any:
    """A field of an admin result as a JSON-ready value (a datetime as ISO 8601 text)."""
    return value.isoformat() if isinstance(value, dt.datetime) else value


def checked_status(value: object) -> JobStatus:
    """`value` as a `JobStatus`, else `ConfigurationError` naming the statuses there are."""
    try:
        return JobStatus(value)
    except ValueError:
        choices = ", ".join(s.value for s in JobStatus)
        raise ConfigurationError(detail=f"status {value!r:.80} is not one of: {choices}") from None


def _job_ids(job_ids: Iterable[Any]) -> list[int]:
    return [check_job_id("job id", job_id) for job_id in job_ids]


def list_jobs(
    bind: Bind,
    *,
    queue: str | None = None,
    task: str | None = None,
    status: str | JobStatus | None = None,
    tag: str | Iterable[str] | None = None,
    limit: int = 50,
    before: int | None = None,
    workflow: str | None = None,
) -> list[JobSummary]:
    """Jobs newest first, filtered by queue, task, status, tag (a name, or several that
    a job must all have) and workflow id; at most `limit` (1 to 1000).

    Page on with `before=` the last id of the previous page (keyset pagination: each page
    costs the same, however deep).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_LIST_LIMIT:
        raise ConfigurationError(
            detail=f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {limit!r}; page "
            "on with before=<the last id shown>"
        )
    if before is not None:
        _job_ids([before])
    for label, value in (("queue name", queue), ("task name", task)):
        if value is not None:
            validate_name(label, value)
    tags = None if tag is None else ([tag] if isinstance(tag, str) else list(tag))
    for name in tags or ():
        validate_name("tag", name)
    if workflow is not None:
        checked_workflow_id(workflow)
    statement = queries.list_jobs(
        queue=queue is not None,
        task=task is not None,
        status=None if status is None else checked_status(status),
        tags=bool(tags),
        before=before is not None,
        workflow=workflow is not None,
    )
    params = {
        "queue": queue,
        "task": task,
        "tags": tags,
        "before": before,
        "limit": limit,
        "workflow_id": workflow,
    }
    return [JobSummary(**row) for row in bind.execute(statement, params).mappings()]


_SUMMARY_FIELDS = frozenset(f.name for f in dataclasses.fields(JobSummary))
_DETAIL_FIELDS = frozenset(f.name for f in dataclasses.fields(JobDetail))
_PENDING = json.loads(PENDING_RESULT)


def get_job(bind: Bind, job_id: int) -> JobDetail | None:
    """The job `job_id` in full, from the jobs table or the archive; None if neither has it."""
    (job_id,) = _job_ids([job_id])
    row = bind.execute(queries.job_detail(), {"job_id": job_id}).mappings().first()
    if row is None:
        return None
    detail = JobDetail(**{key: row[key] for key in _DETAIL_FIELDS})
    if detail.result == _PENDING:
        detail.result = None
    return detail


@dataclass(frozen=True)
class JobStepInfo:
    """A durable step of a job (`ctx.step`) or a sleep (`ctx.sleep`), as `job_steps`
    returns it: `status` "done" (its `result` recorded) or "failed" (its last `error`), the
    `attempt` of the job that wrote it, its `tries`, and how long it took (`seconds`)."""

    name: str
    kind: str
    status: str
    attempt: int
    tries: int
    result: Any
    error: str | None
    started_at: dt.datetime
    finished_at: dt.datetime
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 text."""
        return {key: jsonable(value) for key, value in dataclasses.asdict(self).items()}

    @property
    def summary(self) -> str:
        """One line: its result as JSON (cut at `STEP_SUMMARY_CHARS`), or "failed: " and
        its error's first line."""
        if self.status != "done":
            first = (self.error or "").partition("\n")[0]
            return f"failed: {first}"
        shown = json.dumps(self.result, ensure_ascii=False)
        cut = len(shown) > STEP_SUMMARY_CHARS
        return f"{shown[:STEP_SUMMARY_CHARS]} ..." if cut else shown


STEP_SUMMARY_CHARS = 200
"""The characters of a step's result `jobs show` and the dashboard print at most."""


def job_steps(bind: Bind, job_id: int) -> list[JobStepInfo]:
    """The recorded steps and sleeps of job `job_id`, in the order they started."""
    (job_id,) = _job_ids([job_id])
    rows = bind.execute(step_queries.list_job_steps(), {"job_id": job_id}).mappings()
    return [JobStepInfo(**row) for row in rows]


@dataclass(frozen=True)
class SkippedRetry:
    """A job `retry_jobs` left where it was: its unique key is held by job `held_by`."""

    job_id: int
    status: str
    """Its status, which it keeps (failed or cancelled)."""
    held_by: int

    @property
    def reason(self) -> str:
        """Why it was not retried, as the CLI and the dashboard say it."""
        return f"its unique key is held by job {self.held_by}"


class RetriedJobs(dict[int, str]):
    """What `retry_jobs` did: {id: status it had} of each job put back to queued, in
    `skipped` {id: SkippedRetry} each unique job left alone because its key is held, and in
    `not_revived` {id: SkippedRetry} each cancelled dependent of a retried job that stays
    cancelled because another job holds its unique key (its own dependents stay too)."""

    def __init__(
        self,
        retried: dict[int, str],
        skipped: dict[int, SkippedRetry],
        not_revived: dict[int, SkippedRetry] | None = None,
    ) -> None:
        super().__init__(retried)
        self.skipped = skipped
        self.not_revived = not_revived or {}


RETRY_RACES = 5
"""How often `retry_jobs` runs its statement again when another transaction takes a
unique key between the statement's snapshot and its write."""


def retry_jobs(
    bind: Bind,
    job_ids: Iterable[int] | None = None,
    *,
    all_failed: bool = False,
    queue: str | None = None,
    attempts: int | None = None,
) -> RetriedJobs:
    """Put failed or cancelled jobs back to queued, due now; returns {id: status it had},
    with `.skipped`: {id: SkippedRetry} of the jobs left alone because their unique key is
    held (by a queued or running job, or by a job of the same retry: the lowest id goes).

    Pass `job_ids`, or `all_failed=True` (every failed job, of `queue` if given), not both.
    Each job gets a fresh budget of `attempts` (default: its own max_attempts, else 5): its
    attempt number keeps counting, as the fencing token a late worker is held to. One
    statement, fenced: a job that is queued, running or done (or changes while this runs)
    is left alone and missing from both. A key taken by another transaction while this runs
    makes it run again (in a savepoint, up to RETRY_RACES times), never a database error.

    A retried job's dependents that its failure cancelled wait again (a workflow), except a
    unique one whose key another job now holds: it stays cancelled, and so do its own
    dependents; `.not_revived` names each with the job that holds its key (not on an
    autocommit connection, where the record ends with the statement).
    """
    if (job_ids is None) == (not all_failed):
        raise ConfigurationError(detail="pass job ids or all_failed=True (--failed), not both")
    if queue is not None and job_ids is not None:
        raise ConfigurationError(detail="queue= filters all_failed=True only; ids name jobs")
    if attempts is not None:
        check_count("attempts", attempts, 1, MAX_ATTEMPTS)
    if queue is not None:
        validate_name("queue name", queue)
    ids = _job_ids(job_ids) if job_ids is not None else None
    statement = queries.retry_failed_jobs(by_ids=ids is not None, queue=queue is not None)
    params = {"job_ids": ids, "retry_queue": queue, "budget": attempts}
    for _ in range(RETRY_RACES):
        try:
            with _savepoint(bind):
                bind.execute(_TAKE_NOT_REVIVED)  # what an earlier retry of ours left there
                rows = bind.execute(statement, params).all()
                recorded = bind.execute(_TAKE_NOT_REVIVED).scalar()
        except IntegrityError as exc:
            if not _is_unique_key_violation(exc):
                raise
            continue
        retried = {int(job_id): str(status) for job_id, status, held_by in rows if held_by is None}
        skipped = {
            int(job_id): SkippedRetry(int(job_id), str(status), int(held_by))
            for job_id, status, held_by in rows
            if held_by is not None
        }
        return RetriedJobs(retried, skipped, _not_revived(recorded))
    raise ConfigurationError(
        detail=f"other transactions took the unique keys of jobs being retried {RETRY_RACES} "
        "times in a row; nothing was retried: try again"
    )


_TAKE_NOT_REVIVED = queries.take_not_revived()


def _not_revived(recorded: str | None) -> dict[int, SkippedRetry]:
    """The `<id>:<holder>,` pairs the revival trigger recorded, as SkippedRetry."""
    found: dict[int, SkippedRetry] = {}
    for pair in filter(None, (recorded or "").split(",")):
        job_id, held_by = (int(part) for part in pair.split(":"))
        found[job_id] = SkippedRetry(job_id, JobStatus.cancelled.value, held_by)
    return found


def _savepoint(bind: Bind) -> AbstractContextManager[object]:
    """A savepoint, so a failed statement leaves the caller's transaction usable; none on
    an autocommit connection (each statement is its own transaction there)."""
    conn = bind.connection() if isinstance(bind, Session) else bind
    if getattr(conn.connection.dbapi_connection, "autocommit", False):
        return nullcontext()
    return bind.begin_nested()


def _is_unique_key_violation(exc: IntegrityError) -> bool:
    diag = getattr(exc.orig, "diag", None)
    return getattr(diag, "constraint_name", None) == UNIQUE_KEY_INDEX


def delete_jobs(bind: Bind, job_ids: Iterable[int]) -> dict[int, str]:
    """Delete jobs that are not running (also from the archive); returns {id: status}.

    A running job is left alone and missing from the result: cancel it first
    (`cancel_jobs`), then delete it once its worker has let go.
    """
    ids = _job_ids(job_ids)
    return {
        int(row[0]): str(row[1]) for row in bind.execute(queries.delete_jobs(), {"job_ids": ids})
    }


@dataclass
class QueueDepth:
    """A queue's due, scheduled and running jobs; due and scheduled stop counting at `cap`."""

    queue: str
    due: int
    scheduled: int
    running: int
    cap: int

    @property
    def capped(self) -> bool:
        """Whether due or scheduled reached the cap (there may be more)."""
        return self.due >= self.cap or self.scheduled >= self.cap


def queue_depth(bind: Bind, queue: str, cap: int = DEFAULT_DEPTH_CAP) -> QueueDepth:
    """Due, scheduled and running jobs of one queue, from the claim index; cheap to poll.

    Counting stops at `cap` for due and scheduled jobs, so the cost is bounded whatever the
    backlog (measured with 100,000 due jobs: 4.6 ms at the default cap, 1.8 ms at
    cap=1000; `stats()` took 86 ms).
    """
    validate_name("queue name", queue)
    check_count("cap", cap)
    row = bind.execute(queries.queue_depth(), {"queue": queue, "cap": cap}).one()
    return QueueDepth(queue, int(row.due), int(row.scheduled), int(row.running), cap)


# -- workflows ----------------------------------------------------------------------------------

MAX_WORKFLOW_JOBS = 500
"""The most jobs `workflow_jobs` returns by default (a page of the dashboard draws them)."""
MAX_LINKED = 500
"""The most dependents `job_links` returns of one job (a fan-out may have thousands)."""


def checked_workflow_id(value: object) -> str:
    """`value` as a workflow id (what `enqueue(..., workflow_id=)` takes), else
    `ConfigurationError` naming the problem."""
    check_workflow_id(value)
    return str(value)


@dataclass(frozen=True)
class LinkedJob:
    """A job at the other end of an edge of a workflow, as `job_links` returns it."""

    id: int
    on_failure: str
    """What the dependent does if the parent fails or is cancelled: "cancel" or "run"."""
    task: str | None
    """None if the job is gone (deleted by its retention or by hand)."""
    status: str | None
    """Its status now; None if the job is gone."""
    ended: str | None = None
    """Of a parent: how it ended, as recorded when it did (None while it has not), so a
    parent deleted since still tells."""

    @property
    def state(self) -> str:
        """Its status, or for a job gone "gone (ended done)" or "gone"."""
        if self.status is not None:
            return self.status
        return f"gone (ended {self.ended})" if self.ended else "gone"

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "state": self.state}


@dataclass
class JobLinks:
    """A job's place in its workflow: the jobs it depends on (in `depends_on` order) and
    the jobs that depend on it (by id, at most `limit`; `more_children` if there are more)."""

    parents: list[LinkedJob]
    children: list[LinkedJob]
    more_children: bool = False


def job_links(bind: Bind, job_id: int, limit: int = MAX_LINKED) -> JobLinks:
    """The parents and children of job `job_id` (edges outlive the jobs: a gone parent is
    listed with how it ended). Children are capped at `limit` (1 to 1000)."""
    (job_id,) = _job_ids([job_id])
    check_count("limit", limit, 1, MAX_LIST_LIMIT)
    parents = [
        LinkedJob(**row)
        for row in bind.execute(queries.workflows.job_parents(), {"job_id": job_id}).mappings()
    ]
    params = {"job_id": job_id, "limit": limit + 1}
    children = [
        LinkedJob(**row)
        for row in bind.execute(queries.workflows.job_children(), params).mappings()
    ]
    return JobLinks(parents, children[:limit], len(children) > limit)


@dataclass(frozen=True)
class JobProgressReport:
    """A job's latest `ctx.progress(fraction, message)`, of the attempt that reported it."""

    attempt: int
    fraction: float | None
    message: str | None
    updated_at: dt.datetime

    @property
    def text(self) -> str:
        """ "40% resized 4 of 10 (attempt 1, at ...)"."""
        percent = "" if self.fraction is None else f"{self.fraction * 100:.0f}%"
        said = " ".join(part for part in (percent, self.message or "") if part)
        return f"{said} (attempt {self.attempt}, at {self.updated_at.isoformat()})"

    def as_dict(self) -> dict[str, Any]:
        return {name: jsonable(value) for name, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class AttemptLog:
    """The log lines one attempt's handler emitted (`at`, `level`, `logger`, `message`
    each), and how many past the cap were not kept."""

    attempt: int
    lines: list[dict[str, Any]]
    dropped: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class JobJournalView:
    """A job's progress (None if it reported none) and its attempts' log lines."""

    progress: JobProgressReport | None
    logs: list[AttemptLog]

    def as_dict(self) -> dict[str, Any]:
        return {
            "progress": None if self.progress is None else self.progress.as_dict(),
            "logs": [log.as_dict() for log in self.logs],
        }


def job_journal(bind: Bind, job_id: int) -> JobJournalView:
    """Job `job_id`'s progress and kept log lines (kept while the job is: deleted with it)."""
    (job_id,) = _job_ids([job_id])
    params = {"job_id": job_id}
    row = bind.execute(queries.journal.read_progress(), params).mappings().one_or_none()
    progress = None if row is None else JobProgressReport(**row)
    found = bind.execute(queries.journal.read_logs(), params).mappings()
    logs = [AttemptLog(**log) for log in found]
    return JobJournalView(progress, logs)


@dataclass(frozen=True)
class WorkflowJob:
    """One job of a workflow, as `workflow_jobs` returns it."""

    id: int
    task: str
    queue: str
    status: str
    deps_left: int | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    archived: bool
    """Found in the history (a succeeded job of a `keep` or `archive` queue)."""
    parents: tuple[int, ...] = ()
    """The ids of the jobs it depends on, in `depends_on` order (in this workflow or not,
    listed or not)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 text."""
        return {key: jsonable(value) for key, value in dataclasses.asdict(self).items()}


class WorkflowJobs(list[WorkflowJob]):
    """What `workflow_jobs` found, by id; `truncated` if the workflow has more jobs."""

    def __init__(self, found: Iterable[WorkflowJob], truncated: bool) -> None:
        super().__init__(found)
        self.truncated = truncated


def workflow_jobs(bind: Bind, workflow_id: str, limit: int = MAX_WORKFLOW_JOBS) -> WorkflowJobs:
    """The jobs of workflow `workflow_id` by id, from the jobs table and the archive (a job
    deleted by its retention is gone), each with the ids of the jobs it depends on: a
    workflow's graph. At most `limit` (1 to 10,000) jobs, the first ones; `.truncated`
    says whether there are more (`list_jobs(workflow=...)` pages through all of them).
    Reads the partial indexes on `workflow_id` and the edges' index: bounded by `limit`."""
    workflow_id = checked_workflow_id(workflow_id)
    check_count("limit", limit, 1, DEFAULT_DEPTH_CAP)
    params = {"workflow_id": workflow_id, "limit": limit + 1}
    rows = list(bind.execute(queries.workflows.workflow_jobs(), params).mappings())
    found = rows[:limit]
    parents: dict[int, list[int]] = {}
    ids = [int(row["id"]) for row in found]
    for parent_id, child_id, _ in bind.execute(queries.workflows.edges_into(), {"job_ids": ids}):
        parents.setdefault(int(child_id), []).append(int(parent_id))
    return WorkflowJobs(
        (WorkflowJob(**row, parents=tuple(parents.get(int(row["id"]), ()))) for row in found),
        truncated=len(rows) > limit,
    )


def cancel_workflow(bind: Bind, workflow_id: str) -> dict[int, str]:
    """Cancel every unfinished job of workflow `workflow_id` (queued, waiting, running);
    returns {id: status it had}. One `cancel_jobs`: the workers holding running ones are
    told when the transaction commits. A job enqueued into the workflow afterwards that
    depends on a cancelled one is cancelled as it is enqueued (its parent has failed)."""
    workflow_id = checked_workflow_id(workflow_id)
    ids = bind.execute(queries.workflows.unfinished_in_workflow(), {"workflow_id": workflow_id})
    return cancel_jobs(bind, ids.scalars().all())
