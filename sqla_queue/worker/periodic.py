"""Periodic jobs without a leader: every worker enqueues each due slot; the database keeps one.

    @registry.periodic(cron="0 3 * * *", timezone="Europe/Paris")
    def nightly_report() -> None: ...

    @registry.periodic(every=timedelta(seconds=30), args={"region": "eu"})
    def refresh_rates(region: str) -> None: ...

Each worker of a registry with schedules runs a small scheduler thread beside its loop
(`Worker.run` starts it before the `on_worker_started` hooks and stops it when the loop
ends). At each due slot every scheduler inserts `(task, slot)` into `sqla_queue.periodic_slots` with
`ON CONFLICT DO NOTHING`, and the one whose row went in enqueues the job in the same
transaction: ten workers give one job per slot, with no leader to elect or lose. The table
remembers the last slot of each task whatever the jobs' retention, so runs missed while no
worker ran (a deploy) are known: up to `catch_up` of them are enqueued when a worker comes
back (default 1: the last missed slot only; a timedelta: those within that long), never a
burst. A schedule that never ran starts with its first slot after a worker starts.

Slots are due by the database's clock, read in the transaction that claims them, so a
worker whose own clock is off enqueues nothing early or late.

When a slot is due is the schedule's (`sqla_queue.job.schedule`).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from sqla_queue.db import queries
from sqla_queue.db.database import begin_read_committed

if TYPE_CHECKING:
    from sqla_queue.registry import Registry

log = logging.getLogger("sqla_queue.periodic")

UTC = dt.timezone.utc
MAX_TICK = 5.0
"""Longest sleep between two looks at the schedules (a clock change is noticed by then)."""
CLOCK_SKEW_WARNING = 1.0
"""Seconds between a worker's clock and the database's beyond which the scheduler warns."""
MIN_TICK = 0.25
"""Shortest time between the starts of two looks, whatever the schedules say."""
WAKE_MARGIN = 0.02
"""A look is this much after the slot it waits for (so that the slot is due by then)."""
KEEP_SLOTS = dt.timedelta(days=7)
"""How long a task's past slots are kept beside its latest one (which is always kept)."""
LATE_MARGIN = dt.timedelta(seconds=1)
"""A slot this much before the scheduler's previous look is still current, not missed."""


class Scheduler:
    """One worker's scheduler thread: enqueues the registry's periodic jobs as they fall due."""

    def __init__(self, registry: Registry, engine: Engine, name: str) -> None:
        self.registry = registry
        self.engine = engine
        self._stop = threading.Event()
        self._name = f"{name}-periodic"
        self._thread: threading.Thread | None = None
        self._pruned_at = 0.0
        self.looked_at: dt.datetime | None = None
        """The database's time at this scheduler's latest look."""
        self._looked_mono = 0.0
        self._skew_warned = False

    def start(self) -> None:
        """Look once now, in the caller's thread, then keep looking on the scheduler's own:
        the worker starting it claims only after the first look's jobs are enqueued (so a
        `--burst` worker runs them before it finds the queue empty)."""
        wait = self._look()
        self._thread = threading.Thread(
            target=self._run, args=(wait,), name=self._name, daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self, wait: float) -> None:
        while not self._stop.wait(wait):
            wait = self._look()

    def _look(self) -> float:
        """One look at the schedules; returns the seconds to wait until the next."""
        previous = self.looked_at
        try:
            # At its first look a scheduler has seen nothing: every slot due is missed.
            self.tick(current_from=None if previous is None else previous - LATE_MARGIN)
        except Exception as exc:  # a database away: try again at the next look
            log.warning("periodic jobs not enqueued this time: %s", exc)
            return MAX_TICK
        if self.looked_at is None:  # no schedules (yet)
            return MAX_TICK
        # counted from the database's clock read, on this host's steady clock
        elapsed = time.monotonic() - self._looked_mono
        return max(self.next_wait(self.looked_at) - elapsed, 0.0)

    def next_wait(self, looked_at: dt.datetime) -> float:
        """Seconds from a look at `looked_at` to the next one: just past the nearest slot,
        but at least `MIN_TICK` (a slot never makes a scheduler spin) and at most `MAX_TICK`."""
        wakes = [s.next_after(looked_at) for s in self.registry.schedules.values()]
        pause = (min(wakes) - looked_at).total_seconds() + WAKE_MARGIN if wakes else MAX_TICK
        return min(max(pause, MIN_TICK), MAX_TICK)

    def tick(
        self, now: dt.datetime | None = None, current_from: dt.datetime | None = None
    ) -> list[tuple[str, dt.datetime]]:
        """Enqueue every due slot of every schedule that no one has yet; returns those this
        scheduler enqueued. One transaction.

        `now`: the database's clock, read in that transaction, unless given (a test's
        simulated time); it is kept as `looked_at`. `current_from`: this scheduler's
        previous look (None: `now`, a first look)."""
        schedules = self.registry.schedules
        if not schedules:
            return []
        looked_mono = time.monotonic()
        with begin_read_committed(self.engine) as conn:
            if now is None:
                now = conn.execute(queries.database_now()).scalar_one()
                looked_mono = time.monotonic()
                self._check_clock(now)
            if current_from is None:
                current_from = now
            last = _last_slots(conn, list(schedules))
            wanted = [
                (task, slot)
                for task, schedule in schedules.items()
                for slot in schedule.due(now, last.get(task), current_from)
            ]
            won = _claim_slots(conn, wanted) if wanted else []
            if won:
                self._enqueue(conn, won)
            if self._pruned_at + 3600 < now.timestamp():
                conn.execute(queries.prune_periodic_slots(), {"keep": KEEP_SLOTS})
                self._pruned_at = now.timestamp()
        self.looked_at, self._looked_mono = now, looked_mono  # once committed
        return won

    def _check_clock(self, database_now: dt.datetime) -> None:
        """Warn once if this worker's clock is off the database's (slots follow the latter)."""
        skew = (_now() - database_now).total_seconds()
        if abs(skew) > CLOCK_SKEW_WARNING and not self._skew_warned:
            self._skew_warned = True
            log.warning(
                "this worker's clock is %.1f s %s the database's: periodic jobs follow the "
                "database's clock (sync this host with NTP)",
                abs(skew),
                "ahead of" if skew > 0 else "behind",
            )

    def _enqueue(self, conn: Connection, won: list[tuple[str, dt.datetime]]) -> None:
        from sqla_queue.enqueue import enqueue_many

        rows = [
            {
                "task": task,
                "args": dict(self.registry.schedules[task].args),
                "meta": {"periodic_slot": slot.isoformat()},
            }
            for task, slot in won
        ]
        with Session(bind=conn) as session:
            ids = enqueue_many(session, rows, registry=self.registry)
        conn.execute(
            queries.record_periodic_jobs(),
            {
                "slot_tasks": [task for task, _ in won],
                "slot_times": [slot for _, slot in won],
                "slot_jobs": list(ids),
            },
        )


def _now() -> dt.datetime:
    return dt.datetime.now(UTC)


def _last_slots(conn: Connection, tasks: list[str]) -> dict[str, dt.datetime]:
    rows = conn.execute(queries.last_periodic_slots(), {"tasks": tasks})
    return {row[0]: row[1] for row in rows}


def _claim_slots(
    conn: Connection, wanted: list[tuple[str, dt.datetime]]
) -> list[tuple[str, dt.datetime]]:
    params = {"slot_tasks": [t for t, _ in wanted], "slot_times": [s for _, s in wanted]}
    return [(task, slot) for task, slot in conn.execute(queries.claim_periodic_slots(), params)]


@dataclass
class ScheduleState:
    """A schedule as `sqla-queue periodic list` shows it."""

    task: str
    schedule: str
    next_run: dt.datetime
    last_run: dt.datetime | None
    last_job_id: int | None


def schedule_states(conn: Connection, registry: Registry) -> list[ScheduleState]:
    """Each schedule of `registry`, its next slot and the last one enqueued (by anyone)."""
    tasks = list(registry.schedules)
    last = {
        task: (slot, job_id)
        for task, slot, job_id in conn.execute(queries.last_periodic_jobs(), {"tasks": tasks})
    }
    now = conn.execute(queries.database_now()).scalar_one()
    return [
        ScheduleState(
            task,
            schedule.describe(),
            schedule.next_after(now),
            last.get(task, (None, None))[0],
            last.get(task, (None, None))[1],
        )
        for task, schedule in registry.schedules.items()
    ]
