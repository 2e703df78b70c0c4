"""When a periodic task's jobs are due: `Schedule`, a cron expression in a time zone or every
N seconds (`@registry.periodic`). The worker's scheduler thread (`sqla_queue.worker.periodic`)
enqueues the slots it says are due.

Cron expressions are read by `cronsim` (five fields, or a sixth for seconds), in the
schedule's time zone (`zoneinfo`). Across DST, as cron does: a time of day the spring
change skips runs once, when the gap ends; one the autumn change repeats runs once, in its
first pass; a cron whose minute or hour is `*` follows the clock through both passes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from sqla_queue.errors import ConfigurationError

UTC = dt.timezone.utc
MAX_EVERY = dt.timedelta(days=366)
"""The longest `every` (slots are aligned to the epoch; use cron for longer periods)."""
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = dt.timedelta(microseconds=1)
OFFSET_SCAN = dt.timedelta(hours=6)
"""Steps in which a cron on the elapsed time looks for a change of its zone's UTC offset."""


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
