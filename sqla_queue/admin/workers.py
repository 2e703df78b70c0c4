"""The workers as Python calls: the live ones, their running jobs, and the ones that stopped
in the last day (gracefully, or lost: their registration expired). `sqla-queue workers list`
and the dashboard's workers page are built on these.

Each takes a `Connection` or a `Session` and runs in the caller's transaction; none writes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from sqla_queue.admin.jobs import jsonable
from sqla_queue.db import queries
from sqla_queue.job.validation import check_count

Bind = Connection | Session

MAX_STOPPED = 100
"""Stopped workers listed by default (the latest first)."""
RUNNING_SHOWN = 20
"""Running jobs listed per worker by default (the oldest ids first)."""


def _seconds(value: Any) -> Any:
    """A number of seconds from SQL (numeric: a Decimal) as a float; None stays None."""
    return None if value is None else float(value)


class _AsDict:
    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values (datetimes as ISO 8601 text)."""
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {name: jsonable(value) for name, value in fields.items()}


@dataclass(frozen=True)
class WorkerInfo(_AsDict):
    """What a worker registered when it started."""

    id: str
    hostname: str
    pid: int
    queues: list[str] | None
    """None: it takes jobs of every queue."""
    concurrency: int
    started_at: dt.datetime


@dataclass(frozen=True)
class LiveWorker(WorkerInfo):
    """A registered worker whose registration has not expired."""

    silent_seconds: float
    """Seconds since its last heartbeat."""
    running: int
    """Jobs whose handlers it runs now (started, as its last heartbeat reported)."""
    claimed: int = 0
    """Jobs it holds that have not started: claimed ahead, waiting for a free handler
    thread (at most its claim size), or started since its last heartbeat."""
    version: str | None = None
    """The sqla-queue version it runs (None: a release before fleet versions)."""
    schema_revision: str | None = None
    """The schema revision its code was built for (None: a release before fleet versions)."""


@dataclass(frozen=True)
class StoppedWorker(WorkerInfo):
    """A worker that stopped in the last day."""

    heartbeat_at: dt.datetime
    """Its last heartbeat."""
    stopped_at: dt.datetime
    """When it deregistered (graceful), or when a reaper found its registration expired."""
    how: str
    """`graceful` (it stopped cleanly) or `lost` (killed, crashed, cut off)."""


@dataclass(frozen=True)
class RunningJob(_AsDict):
    """A job a live worker runs now."""

    id: int
    task: str
    queue: str
    attempts: int
    running_seconds: float | None
    """Seconds since its handler started; None until its worker reports the start."""


def live_workers(bind: Bind) -> list[LiveWorker]:
    """Every registered worker whose registration has not expired, the oldest first."""
    names = [field.name for field in dataclasses.fields(LiveWorker)]
    rows = bind.execute(queries.live_workers()).mappings()
    found = []
    for row in rows:
        values = {name: row[name] for name in names}
        values["silent_seconds"] = _seconds(values["silent_seconds"])
        found.append(LiveWorker(**values))
    return found


def stopped_workers(bind: Bind, limit: int = MAX_STOPPED) -> list[StoppedWorker]:
    """The workers that stopped in the last day, the latest first (at most `limit`)."""
    check_count("limit", limit)
    rows = bind.execute(queries.stopped_workers(), {"limit": limit}).mappings()
    return [StoppedWorker(**row) for row in rows]


def running_jobs(
    bind: Bind, worker_ids: Iterable[str], per_worker: int = RUNNING_SHOWN
) -> dict[str, list[RunningJob]]:
    """The running jobs of each of `worker_ids` (the first `per_worker` by id), by worker
    id; a worker that runs none has no key."""
    check_count("per_worker", per_worker)
    params = {"worker_ids": list(worker_ids), "per_worker": per_worker}
    found: dict[str, list[RunningJob]] = {}
    for row in bind.execute(queries.running_jobs_of_workers(), params).mappings():
        job = {name: value for name, value in row.items() if name != "worker_id"}
        job["running_seconds"] = _seconds(job["running_seconds"])
        found.setdefault(row["worker_id"], []).append(RunningJob(**job))
    return found
