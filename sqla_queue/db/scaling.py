"""The autoscaling signal: per queue, what an autoscaler (KEDA's metrics-api scaler, a
Kubernetes HPA on an external metric, a script) needs to size the worker fleet.

Read in a handful of bounded statements (`sqla_queue.db.queries.scaling`), never a scan of
the finished jobs: cheap enough to poll every few seconds whatever the table holds. Served
by the HTTP API (`GET /api/queues`, `/api/queues/{name}/scaling`) and on a worker's health
port (`GET /scaling`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection

from sqla_queue.db.queries import dashboard as dashboard_reads
from sqla_queue.db.queries import scaling as statements

READY_CAP = 1_000
"""Where the ready count stops counting rows; past it the count is the planner's estimate."""
RATE_SECONDS = 300
"""The arrival and completion rates are per second over this many seconds of whole minutes
(the completions come from the rollup, which each worker writes about once a minute)."""
ARRIVAL_WINDOW = 5_000
"""Newest jobs read for the arrival rate at most: when they were all created within the
rate's minutes, the rate is over the time they span instead."""


@dataclass
class QueueScaling:
    """One queue's autoscaling signal."""

    queue: str
    paused: bool
    ready: int
    """Jobs due now and not claimed (`queued`, `run_at <= now()`)."""
    ready_estimated: bool
    """`ready` passed `READY_CAP` and is the planner's estimate."""
    oldest_ready_age: float
    """Seconds the oldest ready job has been due (0 when none is)."""
    running: int
    """Jobs whose handler has started and not finished (handlers at work)."""
    claimed: int
    """Jobs a worker has claimed whose handler has not started (held in its buffer for a
    free handler): not `running`, but they take the worker's slots."""
    workers: int
    """Live workers that serve this queue (registered, registration not expired)."""
    free_slots: int
    """Of those workers' slots (`concurrency`), the ones not holding a running job. A
    worker serving several queues counts its free slots in each of them."""
    arrival_rate: float
    """Jobs enqueued per second over the last `RATE_SECONDS` (whole minutes)."""
    arrival_rate_complete: bool
    """False when the newest `ARRIVAL_WINDOW` jobs were all created within those minutes:
    the rate is then over the time they span (an estimate from the newest jobs)."""
    completion_rate: float
    """Jobs ended (succeeded or failed) per second over the same minutes, from the rollup."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _live_slots(
    conn: Connection,
) -> tuple[list[tuple[frozenset[str] | None, int]], dict[str, tuple[int, int]]]:
    """Each live worker's (queues or None for all, free slots), and per queue its jobs
    (running, claimed): a claimed job takes a slot as a running one does."""
    held: dict[str, int] = defaultdict(int)
    running: dict[str, tuple[int, int]] = {}
    for queue, worker, count, started in conn.execute(statements.RUNNING_BY_WORKER):
        was_running, was_claimed = running.get(queue, (0, 0))
        running[queue] = (was_running + int(started), was_claimed + int(count) - int(started))
        if worker is not None:
            held[worker] += int(count)
    live = [
        (None if queues is None else frozenset(queues), max(0, int(slots) - held[worker_id]))
        for worker_id, queues, slots in conn.execute(statements.LIVE_WORKERS)
    ]
    return live, running


def scaling_signal(conn: Connection, queue: str | None = None) -> list[QueueScaling]:
    """Each queue's signal (of the queues table; only `queue`'s if given), by name."""
    conn.execute(dashboard_reads.NO_JIT)  # this transaction's only: see `NO_JIT`
    rows = conn.execute(statements.READY_AND_OLDEST, {"cap": READY_CAP, "queue": queue}).all()
    if not rows:
        return []
    live, running = _live_slots(conn)
    rate = {"seconds": RATE_SECONDS}
    ended = {q: (int(e), int(s)) for q, e, s in conn.execute(statements.RECENT_ENDED, rate)}
    window = {"window": ARRIVAL_WINDOW, **rate}
    start, end = conn.execute(statements.RATE_SPAN, rate).one()
    created: dict[str, int] = {}
    searched, oldest = 0, None
    for name, count, seen, first in conn.execute(statements.RECENT_CREATED, window):
        if name is None:
            searched, oldest = int(seen), first
        else:
            created[name] = int(count)
    complete = searched < ARRIVAL_WINDOW or oldest is None or oldest < start
    # a full window within the minutes: the rate over the time its jobs span
    span = RATE_SECONDS if complete else max(1.0, (end - oldest).total_seconds())
    found: list[QueueScaling] = []
    for name, paused, _retention, ready, age in rows:
        ready, estimated = int(ready), False
        if ready >= READY_CAP:
            estimated = True
            plan = conn.execute(statements.ESTIMATED_READY, {"queue": name}).scalar_one()
            ready = max(ready, int(plan[0]["Plan"]["Plan Rows"]))
        serving = [free for queues, free in live if queues is None or name in queues]
        ended_count, succeeded = ended.get(name, (0, 0))
        # a succeeded job has left the table, deleted or moved to the history, whatever the
        # retention (but a `keep` queue's job whose unique key blocks while done): count it
        gone = succeeded / RATE_SECONDS
        found.append(
            QueueScaling(
                queue=name,
                paused=bool(paused),
                ready=ready,
                ready_estimated=estimated,
                oldest_ready_age=max(0.0, float(age or 0.0)),
                running=running.get(name, (0, 0))[0],
                claimed=running.get(name, (0, 0))[1],
                workers=len(serving),
                free_slots=sum(serving),
                arrival_rate=round(created.get(name, 0) / span + gone, 3),
                arrival_rate_complete=complete,
                completion_rate=round(ended_count / RATE_SECONDS, 3),
            )
        )
    return found
