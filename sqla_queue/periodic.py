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

Slots are due by the database's clock, read in the transaction that claims them, so a
worker whose own clock is off enqueues nothing early or late.

Cron expressions are read by `cronsim` (five fields, or a sixth for seconds), in the
schedule's time zone (`zoneinfo`). Across DST, as cron does: a time of day the spring
change skips runs once, when the gap ends; one the autumn change repeats runs once, in its
first pass; a cron whose minute or hour is `*` follows the clock through both passes.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
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
CLOCK_SKEW_WARNING = 1.0
"""Seconds between a worker's clock and the database's beyond which the scheduler warns."""
MIN_TICK = 0.25
"""Shortest time between the starts of two looks, whatever the schedules say."""
WAKE_MARGIN = 0.02
"""A look is this much after the slot it waits for (so that the slot is due by then)."""
KEEP_SLOTS = dt.timedelta(days=7)
"""How long a task's past slots are kept beside its latest one (which is always kept)."""
MAX_EVERY = dt.timedelta(days=366)
"""The longest `every` (slots are aligned to the epoch; use cron for longer periods)."""
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = dt.timedelta(microseconds=1)
OFFSET_SCAN = dt.timedelta(hours=6)
"""Steps in which a cron on the elapsed time looks for a change of its zone's UTC offset."""
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
            if isinstance(self.cron, str) and len(self.cron.split()) == 6:
                # cronsim's seconds field: its DST rules differ from the five-field ones
                raise ConfigurationError(
                    detail=f"periodic task {self.task!r}: cron {self.cron!r} has six fields "
                    "(seconds); use five (minute hour day month weekday), or every= for a "
                    "schedule in seconds"
                )
            try:
                CronSim(self.cron, dt.datetime.now(zone))
            except (CronSimError, TypeError) as exc:
                raise ConfigurationError(
                    detail=f"periodic task {self.task!r}: cron {self.cron!r} is not valid "
                    f"({exc}); e.g. '0 3 * * *' for 03:00 every day"
                ) from None
        if self.every is not None and not 1 <= self.every <= MAX_EVERY.total_seconds():
            raise ConfigurationError(
                detail=f"periodic task {self.task!r}: every must be at least 1 second and at "
                f"most {MAX_EVERY.days} days (use cron for longer periods), got {self.every!r}"
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

    @property
    def on_wall_clock(self) -> bool:
        """True for a time of day (cron's rule: five fields, neither minute nor hour `*`):
        its slots are wall-clock times; other crons follow the elapsed time."""
        parts = (self.cron or "").split()
        return len(parts) == 5 and not parts[0].startswith("*") and not parts[1].startswith("*")

    def slots_back(self, at: dt.datetime) -> Iterator[dt.datetime]:
        """Slots at or before `at`, newest first (strictly decreasing), as aware UTC datetimes."""
        if self.every is not None:
            step = _micros(dt.timedelta(seconds=self.every))
            count = _micros(at - EPOCH) // step
            while True:
                yield EPOCH + dt.timedelta(microseconds=count * step)
                count -= 1
        assert self.cron is not None
        if not self.on_wall_clock:
            yield from self._elapsed_back(at)
            return
        local = at.astimezone(self.zone)
        if local.fold:
            # In the second pass of a repeated hour the first pass reached later wall times
            # than `at`'s: cronsim walks wall times, so start past them and filter.
            shift = local.replace(fold=0).utcoffset() - local.utcoffset()  # type: ignore[operator]
            local = (at + shift).astimezone(self.zone)
        newest = None
        # cronsim yields slots strictly before its start in reverse: start just after `at`.
        for found in CronSim(self.cron, local + MICROSECOND, reverse=True):
            slot = found.astimezone(UTC)
            if slot <= at and (newest is None or slot < newest):
                newest = slot
                yield slot

    def next_after(self, at: dt.datetime) -> dt.datetime:
        """The first slot strictly after `at`.

        Across DST, as cron does: a time of day that the spring change skips runs once, at
        the first time after the gap; one that the autumn change repeats runs once, in its
        first pass. A cron on the elapsed time (its minute or hour `*`, as `*/15 * * * *`)
        matches the clock as it reads, through both passes.
        """
        if self.every is not None:
            step = _micros(dt.timedelta(seconds=self.every))
            return EPOCH + dt.timedelta(microseconds=(_micros(at - EPOCH) // step + 1) * step)
        assert self.cron is not None
        if not self.on_wall_clock:
            return self._elapsed_next(at)
        for found in CronSim(self.cron, at.astimezone(self.zone)):
            slot = found.astimezone(UTC)
            # after a repeated hour's first pass cronsim, walking wall times, yields its
            # slots again (already past): the next slot is the first one after `at`
            if slot > at:
                return slot
        raise AssertionError("unreachable: cronsim ends only after 50 years without a match")

    # cronsim's own time zone arithmetic misses slots where a zone moves its clocks by less
    # than an hour (Lord Howe): on the elapsed time, iterate at each stretch's fixed offset.

    def _elapsed_next(self, at: dt.datetime) -> dt.datetime:
        assert self.cron is not None
        edge, start = at, at
        while True:
            fixed = dt.timezone(_offset(self.zone, edge))
            found = next(iter(CronSim(self.cron, start.astimezone(fixed)))).astimezone(UTC)
            change = _offset_change(self.zone, edge, found)
            if change is None:
                return found
            edge, start = change, change - MICROSECOND  # slots from the change on

    def _elapsed_back(self, at: dt.datetime) -> Iterator[dt.datetime]:
        assert self.cron is not None
        edge = at
        while True:
            fixed = dt.timezone(_offset(self.zone, edge))
            for found in CronSim(self.cron, (edge + MICROSECOND).astimezone(fixed), reverse=True):
                slot = found.astimezone(UTC)
                change = _offset_change(self.zone, edge, slot)
                if change is not None:  # `slot` is of another offset: restart before `change`
                    edge = change - MICROSECOND
                    break
                yield slot
                edge = slot
            else:
                return  # cronsim found none for 50 years

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
        with self.engine.begin() as conn:
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


def _micros(delta: dt.timedelta) -> int:
    """`delta` in whole microseconds (exact integer arithmetic for `every` slots)."""
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _offset(zone: ZoneInfo, at: dt.datetime) -> dt.timedelta:
    offset = at.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _offset_change(zone: ZoneInfo, edge: dt.datetime, to: dt.datetime) -> dt.datetime | None:
    """Going from `edge` to `to` (later or earlier), the first instant whose UTC offset in
    `zone` is not `edge`'s (later: the change itself; earlier: just after it), or None.
    Scans in steps of `OFFSET_SCAN` (no zone changes its clocks twice within one)."""
    offset = _offset(zone, edge)
    step = OFFSET_SCAN if to >= edge else -OFFSET_SCAN
    same = edge
    while same != to:
        probe = same + step if abs(to - same) > OFFSET_SCAN else to
        if _offset(zone, probe) != offset:
            changed = probe  # bisect down to the microsecond between `same` and `changed`
            while abs(_micros(changed - same)) > 1:
                middle = same + dt.timedelta(microseconds=_micros(changed - same) // 2)
                same, changed = (
                    (middle, changed)
                    if _offset(zone, middle) == offset
                    else (
                        same,
                        middle,
                    )
                )
            return changed if to >= edge else same
        same = probe
    return None


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
