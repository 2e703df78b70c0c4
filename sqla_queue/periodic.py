"""Periodic jobs without a leader: every worker enqueues each due slot; the database keeps one.

    @registry.periodic(cron="0 3 * * *", timezone="Europe/Paris")
    def nightly_report() -> None: ...

    @registry.periodic(every=timedelta(seconds=30), args={"region": "eu"})
    def refresh_rates(region: str) -> None: ...

Each worker of the registry runs a small scheduler thread (started and stopped by the
registry's lifecycle hooks, so it is a plugin of the worker, not part of its loop). At each
due slot every scheduler inserts `(task, slot)` into `sqla_queue.periodic_slots` with
`ON CONFLICT DO NOTHING`, and the one whose row went in enqueues the job in the same
transaction: ten workers give one job per slot, with no leader to elect or lose. The table
remembers the last slot of each task whatever the jobs' retention, so runs missed while no
worker ran (a deploy) are known: up to `catch_up` of them are enqueued when a worker comes
back (default 1: the last missed slot only; a timedelta: those within that long), never a
burst. A schedule that never ran starts with its first slot after a worker starts.

Cron expressions are read by `cronsim` (five fields, or a sixth for seconds), in the
schedule's time zone (`zoneinfo`; DST gaps and repeats as cronsim handles them).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from . import queries
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .registry import Registry
    from .worker import Worker

log = logging.getLogger("sqla_queue.periodic")

UTC = dt.timezone.utc
MAX_TICK = 5.0
"""Longest sleep between two looks at the schedules (a clock change is noticed by then)."""
KEEP_SLOTS = dt.timedelta(days=7)
"""How long a task's past slots are kept beside its latest one (which is always kept)."""
LATE_MARGIN = dt.timedelta(seconds=1)
"""A slot this much before the scheduler's previous look is still current, not missed."""


@dataclass(frozen=True)
class Schedule:
    """When a periodic task's jobs are due: a cron expression in a time zone, or every N s."""

    task: str
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    args: Mapping[str, Any] = field(default_factory=dict)
    catch_up: int | dt.timedelta = 1

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(
                detail=f"periodic task {self.task!r}: pass cron='*/5 * * * *' or "
                "every=timedelta(seconds=30), one of them"
            )
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigurationError(
                detail=f"periodic task {self.task!r}: no time zone {self.timezone!r}; use an "
                "IANA name such as 'Europe/Paris' or 'UTC'"
            ) from None
        object.__setattr__(self, "_zone", zone)
        if self.cron is not None:
            try:
                CronSim(self.cron, dt.datetime.now(zone))
            except (CronSimError, TypeError) as exc:
                raise ConfigurationError(
                    detail=f"periodic task {self.task!r}: cron {self.cron!r} is not valid "
                    f"({exc}); e.g. '0 3 * * *' for 03:00 every day"
                ) from None
        if self.every is not None and not self.every >= 1:
            raise ConfigurationError(
                detail=f"periodic task {self.task!r}: every must be at least 1 second, "
                f"got {self.every!r}"
            )
        catch_up = self.catch_up
        if isinstance(catch_up, bool) or not (
            (isinstance(catch_up, int) and catch_up >= 0)
            or (isinstance(catch_up, dt.timedelta) and catch_up >= dt.timedelta(0))
        ):
            raise ConfigurationError(
                detail=f"periodic task {self.task!r}: catch_up is a number of slots (0 or "
                f"more) or a timedelta, got {catch_up!r}"
            )

    @property
    def zone(self) -> ZoneInfo:
        zone: ZoneInfo = self.__dict__["_zone"]
        return zone

    def describe(self) -> str:
        """`cron '0 3 * * *' Europe/Paris` or `every 30s`."""
        if self.cron is not None:
            return f"cron {self.cron!r} {self.timezone}"
        assert self.every is not None
        return f"every {self.every:g}s"

    def slots_back(self, at: dt.datetime) -> Iterator[dt.datetime]:
        """Slots at or before `at`, newest first, as aware UTC datetimes."""
        if self.every is not None:
            slot = math.floor(at.timestamp() / self.every) * self.every
            while True:
                yield dt.datetime.fromtimestamp(slot, UTC)
                slot -= self.every
        assert self.cron is not None
        # cronsim yields slots strictly before its start in reverse: start just after `at`.
        start = at.astimezone(self.zone) + dt.timedelta(microseconds=1)
        for found in CronSim(self.cron, start, reverse=True):
            yield found.astimezone(UTC)

    def next_after(self, at: dt.datetime) -> dt.datetime:
        """The first slot strictly after `at`."""
        if self.every is not None:
            return dt.datetime.fromtimestamp(
                (math.floor(at.timestamp() / self.every) + 1) * self.every, UTC
            )
        assert self.cron is not None
        return next(iter(CronSim(self.cron, at.astimezone(self.zone)))).astimezone(UTC)

    def due(
        self, now: dt.datetime, last: dt.datetime | None, current_from: dt.datetime
    ) -> list[dt.datetime]:
        """The slots to enqueue now, oldest first.

        `last`: the task's latest slot enqueued by anyone (None: never). `current_from`:
        slots after it are current (this scheduler's previous look, or its start) and all
        enqueued; older ones after `last` were missed, and only `catch_up` of them are.
        A schedule that never ran has missed nothing.
        """
        current: list[dt.datetime] = []
        missed: list[dt.datetime] = []
        floor = current_from if last is None else last
        for slot in self.slots_back(now):
            if slot <= floor:
                break
            if slot > current_from:
                current.append(slot)
                continue
            if isinstance(self.catch_up, dt.timedelta):
                if slot < now - self.catch_up:
                    break
            elif len(missed) >= self.catch_up:
                break
            missed.append(slot)
        return sorted(current + missed)


class Scheduler:
    """One worker's scheduler thread: enqueues the registry's periodic jobs as they fall due."""

    def __init__(self, registry: Registry, engine: Engine, name: str) -> None:
        self.registry = registry
        self.engine = engine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-periodic", daemon=True)
        self._pruned_at = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        previous: dt.datetime | None = None
        while not self._stop.is_set():
            now = _now()
            try:
                # At its first look a scheduler has seen nothing: every slot due is missed.
                self.tick(now, now if previous is None else previous - LATE_MARGIN)
                previous = now
            except Exception as exc:  # a database away: try again at the next look
                log.warning("periodic jobs not enqueued this time: %s", exc)
            schedules = self.registry.schedules.values()
            wake = min((s.next_after(now) for s in schedules), default=now)
            pause = (wake - _now()).total_seconds() + 0.01
            self._stop.wait(min(max(pause, 0.05), MAX_TICK))

    def tick(self, now: dt.datetime, current_from: dt.datetime) -> list[tuple[str, dt.datetime]]:
        """Enqueue every due slot of every schedule that no one has yet; returns those this
        scheduler enqueued. One transaction."""
        schedules = self.registry.schedules
        if not schedules:
            return []
        with self.engine.begin() as conn:
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
        return won

    def _enqueue(self, conn: Connection, won: list[tuple[str, dt.datetime]]) -> None:
        from .enqueue import enqueue_many

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


_schedulers_lock = threading.Lock()


def install(registry: Registry) -> None:
    """Start a scheduler with each worker of `registry`, stop it when the worker stops."""
    schedulers: dict[int, Scheduler] = {}

    def started(worker: Worker) -> None:
        scheduler = Scheduler(registry, worker.engine, worker.config.worker_id)
        with _schedulers_lock:
            schedulers[id(worker)] = scheduler
        scheduler.start()

    def stopping(worker: Worker) -> None:
        with _schedulers_lock:
            scheduler = schedulers.pop(id(worker), None)
        if scheduler is not None:
            scheduler.stop()

    registry.on_worker_started(started)
    registry.on_worker_stopping(stopping)


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
    now = _now()
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
