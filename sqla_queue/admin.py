"""Administration as Python calls: queues, stats, pruning, cancelling. The CLI is built on these.

Each takes a `Connection` or a `Session` and runs in the caller's transaction; none commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Result
from sqlalchemy.orm import Session

from . import queries
from .errors import ConfigurationError, UnknownQueueError
from .models import JobStatus, Retention, validate_name

Bind = Connection | Session


def _rowcount(result: Result[Any]) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def _retention(value: str) -> str:
    try:
        return Retention(value).value
    except ValueError:
        choices = ", ".join(r.value for r in Retention)
        raise ConfigurationError(detail=f"retention {value!r} is not one of: {choices}") from None


def create_queue(bind: Bind, name: str, retention: str = Retention.delete.value) -> bool:
    """Create queue `name`; returns False if it already existed (it is left unchanged)."""
    validate_name("queue", name, task="(none)")
    row = bind.execute(queries.create_queue(), {"name": name, "retention": _retention(retention)})
    return row.first() is not None


def set_paused(bind: Bind, name: str, paused: bool) -> None:
    """Pause (no job of it is claimed) or resume queue `name`."""
    if bind.execute(queries.set_queue_paused(paused), {"queue_name": name}).first() is None:
        raise UnknownQueueError(queue=name)


def set_retention(bind: Bind, name: str, retention: str) -> None:
    """Set what happens to queue `name`'s succeeded jobs: delete, keep or archive."""
    params = {"queue_name": name, "new_retention": _retention(retention)}
    if bind.execute(queries.set_queue_retention(), params).first() is None:
        raise UnknownQueueError(queue=name)


def delete_queue(bind: Bind, name: str, force: bool = False) -> int:
    """Delete queue `name` and its finished jobs. Refuses while it has queued or running
    jobs unless `force`, which deletes those too. Returns how many jobs were deleted."""
    if bind.execute(queries.lock_queue(), {"queue_name": name}).first() is None:
        raise UnknownQueueError(queue=name)
    unfinished = bind.execute(queries.count_unfinished_in_queue(), {"queue_name": name}).scalar()
    if unfinished and not force:
        raise ConfigurationError(
            detail=f"queue {name!r} still has {unfinished} queued or running job(s); "
            "wait for them, or pass --force to delete them with the queue"
        )
    # Without --force only finished jobs go: a job enqueued since the count (possible once
    # the foreign key is dropped) is never deleted by accident.
    statement = queries.delete_jobs_of_queue(finished_only=not force)
    deleted = _rowcount(bind.execute(statement, {"queue_name": name}))
    bind.execute(queries.delete_queue(), {"queue_name": name})
    return deleted


def set_route(bind: Bind, name: str, route: str | None) -> None:
    """Route queue `name`'s jobs to a broker (`nats:SUBJECT`, `amqp:EXCHANGE/KEY`) or, with
    None, back to table workers. Jobs already in the table follow the new setting."""
    from .brokers.routes import parse_route

    value = None if route is None else str(parse_route(route))
    params = {"queue_name": name, "new_route": value}
    if bind.execute(queries.set_queue_route(), params).first() is None:
        raise UnknownQueueError(queue=name)


@dataclass
class QueueInfo:
    name: str
    paused: bool
    retention: str
    route: str | None = None


def list_queues(bind: Bind) -> list[QueueInfo]:
    rows = bind.execute(queries.queue_settings()).mappings()
    return [QueueInfo(r["name"], r["paused"], r["retention"], r["route"]) for r in rows]


@dataclass
class QueueStats:
    """Counts per status for one queue, and the age in seconds of its oldest due job."""

    queue: str
    paused: bool | None
    counts: dict[str, int]
    oldest_due_age: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "paused": self.paused,
            **{status.value: self.counts.get(status.value, 0) for status in JobStatus},
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
    """Delete finished jobs older than `older_than` seconds (and archived ones, if `archive`)."""
    finished = {JobStatus.done.value, JobStatus.failed.value, JobStatus.cancelled.value}
    bad = set(statuses) - finished
    if bad:
        raise ConfigurationError(
            detail=f"can only prune finished statuses {sorted(finished)}, not {sorted(bad)}"
        )
    if older_than < 0:
        raise ConfigurationError(detail="older-than must not be negative")
    params = {"statuses": list(statuses), "older_than": older_than}
    count = _rowcount(bind.execute(queries.prune_jobs(), params))
    if archive:
        count += _rowcount(bind.execute(queries.prune_archive(), {"older_than": older_than}))
    return count


NOTIFY_PAYLOAD_CHARS = 7000
"""Ids per cancel notification at most, in characters (PostgreSQL's payload limit is 8000)."""


def cancel_jobs(bind: Bind, job_ids: Iterable[int]) -> dict[int, str]:
    """Cancel queued or running jobs; returns {id: status it had}. Others are left alone.

    When the transaction commits, the workers holding the running ones are told at once
    (NOTIFY): a handler sees `ctx.cancelled`, a job claimed but not started never starts.
    Whatever a handler returns afterwards is discarded, and the job never runs again.
    """
    ids = [int(i) for i in job_ids]
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
    """{id: status} of the jobs that exist (in the jobs table) among `job_ids`."""
    found: dict[int, str] = {}
    for job_id in job_ids:
        row = bind.execute(queries.job_by_id(), {"job_id": int(job_id)}).mappings().first()
        if row is not None:
            found[int(job_id)] = str(row["status"])
    return found
