"""Signals as an operator sees them: a job's waits (`jobs show`, the dashboard's job page)
and the jobs parked for a signal per queue (the metrics)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from sqla_queue.admin.jobs import jsonable
from sqla_queue.db.queries import signals as queries

Bind = Connection | Session


@dataclass(frozen=True)
class SignalWaitInfo:
    """One `ctx.wait_for_signal` of a job: the key, its number among the job's waits for
    that key in a run (`seq`), its state (`waiting`, `received`, `timed_out`), its
    deadline, and what it got."""

    key: str
    seq: int
    state: str
    deadline: dt.datetime
    payload: Any
    started_at: dt.datetime
    resolved_at: dt.datetime | None

    def describe(self) -> str:
        """One line: "payment:42 #1 waiting until ...", "... received {...}", "... timed out"."""
        head = f"{self.key} #{self.seq}"
        if self.state == "waiting":
            return f"{head} waiting until {self.deadline.isoformat()}"
        if self.state == "timed_out":
            return f"{head} timed out at {self.deadline.isoformat()}"
        return f"{head} received at {jsonable(self.resolved_at)}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 text."""
        return {key: jsonable(value) for key, value in dataclasses.asdict(self).items()}


def signal_waits(bind: Bind, job_id: int) -> list[SignalWaitInfo]:
    """The signal waits of job `job_id`, in the order they began (empty for a job that
    never waited, or whose waits the workers' upkeep removed with it)."""
    rows = bind.execute(queries.job_waits(), {"job_id": job_id}).mappings()
    return [SignalWaitInfo(**row) for row in rows]


def waiting_for_signals(bind: Bind) -> dict[str, int]:
    """Jobs parked for a signal, per queue (queues with none are left out)."""
    return {queue: int(n) for queue, n in bind.execute(queries.waiting_for_signals())}


__all__ = ["SignalWaitInfo", "signal_waits", "waiting_for_signals"]
