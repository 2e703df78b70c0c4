"""What a test's code enqueued: `enqueued_jobs`, `assert_enqueued`, `assert_not_enqueued`.

Each reads the jobs table itself (real PostgreSQL, no mock), and the history too when a
finished status is asked for (a `keep` or `archive` queue's succeeded jobs live there).
Given a `Session` it reads through that session, so it sees what the session has added and
not yet committed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from sqlalchemy import Connection, Engine, Select, select
from sqlalchemy.orm import Session

from sqla_queue.db.models import HistoryJob, Job, JobStatus
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.states import FINISHED
from sqla_queue.registry import Task

_SHOWN = 10
"""Jobs listed in an assertion's message at most."""


class JobFilters(TypedDict, total=False):
    """The filters of `enqueued_jobs` as keyword arguments (`**filters: Unpack[JobFilters]`),
    for the signatures that pass them on (`QueueHelper`): their defaults stay here alone."""

    task: str | Task[Any, Any] | None
    args: Mapping[str, Any] | None
    queue: str | None
    status: str | JobStatus | Sequence[str | JobStatus] | None


def _statuses(status: str | JobStatus | Sequence[str | JobStatus] | None) -> list[str] | None:
    if status is None:
        return None
    wanted = [status] if isinstance(status, str | JobStatus) else list(status)
    return [JobStatus(s).value for s in wanted]


def _query(
    model: type[Job] | type[HistoryJob],
    task: str | Task[Any, Any] | None,
    args: Mapping[str, Any] | None,
    queue: str | None,
    statuses: list[str] | None,
) -> Select[Any]:
    statement = select(model).order_by(model.id)
    if task is not None:
        statement = statement.where(model.task == (task.name if isinstance(task, Task) else task))
    if args is not None:
        statement = statement.where(model.args.contains(dict(args)))
    if queue is not None:
        statement = statement.where(model.queue == queue)
    if statuses is not None:
        statement = statement.where(model.status.in_(statuses))
    return statement


def _read(target: Session | Connection | Engine, statement: Select[Any]) -> list[Any]:
    if isinstance(target, Session):
        return list(target.scalars(statement))
    if not isinstance(target, Connection | Engine):
        raise ConfigurationError(
            detail=f"expected a Session, Connection or Engine, got {type(target).__name__}; "
            "for an AsyncSession use `await session.run_sync(lambda s: enqueued_jobs(s))`"
        )
    # A savepoint of its own: reading never ends a transaction the caller has open.
    with Session(bind=target, join_transaction_mode="create_savepoint") as session:
        jobs = list(session.scalars(statement))
        session.expunge_all()  # detached, with every column loaded
    return jobs


def enqueued_jobs(
    target: Session | Connection | Engine,
    *,
    task: str | Task[Any, Any] | None = None,
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    status: str | JobStatus | Sequence[str | JobStatus] | None = JobStatus.queued,
) -> list[Job | HistoryJob]:
    """The jobs matching every filter given, oldest first.

    `task` is a name or a registered `Task`; `args` matches jobs whose args contain these
    keys with these values (jsonb `@>`: other keys may be present too); `status` defaults
    to `queued` (scheduled jobs included), `None` for any status. A finished job moved to
    the history (a `keep` or `archive` queue's) is listed as a `HistoryJob`, which has the
    same attributes.
    """
    statuses = _statuses(status)
    found: list[Job | HistoryJob] = _read(target, _query(Job, task, args, queue, statuses))
    if statuses is None or set(statuses) & set(FINISHED):
        found += _read(target, _query(HistoryJob, task, args, queue, statuses))
        found.sort(key=lambda job: job.id)
    return found


def _describe(filters: dict[str, Any]) -> str:
    given = [f"{name}={value!r}" for name, value in filters.items() if value is not None]
    return ", ".join(given) or "no filter"


def _listing(jobs: list[Job | HistoryJob]) -> str:
    if not jobs:
        return "none"
    lines = [
        f"  #{job.id} task={job.task!r} args={job.args!r} queue={job.queue!r} status={job.status}"
        for job in jobs[:_SHOWN]
    ]
    if len(jobs) > _SHOWN:
        lines.append(f"  ... and {len(jobs) - _SHOWN} more")
    return "\n" + "\n".join(lines)


def assert_enqueued(
    target: Session | Connection | Engine,
    *,
    task: str | Task[Any, Any] | None = None,
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    status: str | JobStatus | Sequence[str | JobStatus] | None = JobStatus.queued,
    count: int | None = None,
) -> list[Job | HistoryJob]:
    """Assert that a job matches (exactly `count` jobs, if given); return the matches.

    The filters are those of `enqueued_jobs`. On failure the message lists the jobs that
    are there, so a wrong task name or argument shows at once.
    """
    task_name = task.name if isinstance(task, Task) else task
    filters = {"task": task_name, "args": args, "queue": queue, "status": status}
    matches = enqueued_jobs(target, task=task, args=args, queue=queue, status=status)
    if (count is None and matches) or (count is not None and len(matches) == count):
        return matches
    present = enqueued_jobs(target, status=status)
    expected = "a job" if count is None else f"{count} job(s)"
    raise AssertionError(
        f"expected {expected} matching {_describe(filters)}, found {len(matches)}; "
        f"jobs with that status: {_listing(present)}"
    )


def assert_not_enqueued(
    target: Session | Connection | Engine,
    *,
    task: str | Task[Any, Any] | None = None,
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    status: str | JobStatus | Sequence[str | JobStatus] | None = JobStatus.queued,
) -> None:
    """Assert that no job matches the filters of `enqueued_jobs`."""
    task_name = task.name if isinstance(task, Task) else task
    matches = enqueued_jobs(target, task=task, args=args, queue=queue, status=status)
    if matches:
        filters = {"task": task_name, "args": args, "queue": queue, "status": status}
        raise AssertionError(
            f"expected no job matching {_describe(filters)}, found {len(matches)}: "
            f"{_listing(matches)}"
        )
