"""Durations and rates as the CLI accepts them: a number of seconds, or a number with a unit;
a rate is a count per duration (`100/s`, `10/min`, `500/h`, `20/30s`).

    90      90 seconds          15m   15 minutes         7d   7 days
    90s     90 seconds          12h   12 hours           2w   2 weeks
    0.5     half a second

`Duration` is the click parameter type every duration-like option uses, so each of them
accepts the same forms and refuses bad input with the same message, naming the option;
durations and rates stay within the bounds of `sqla_queue.job.bounds` (at most 100 years).
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from sqla_queue.job.bounds import MAX_DURATION, check_rate, duration_range

UNITS: dict[str, float] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""Seconds per unit letter."""

ACCEPTED = "seconds, or a number with a unit s, m, h, d or w (e.g. 90, 90s, 15m, 12h, 7d)"
"""The accepted forms, as error messages and help texts name them."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_duration(value: str | float) -> float:
    """'90', '90s', '15m', '12h', '7d', '2w' (or a number) -> seconds.

    Raises `ValueError` naming the accepted forms for anything else (negative, `inf`, `1y`).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration; expected {ACCEPTED}")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration; expected {ACCEPTED}")
    number, unit = match.groups()
    return float(number) * UNITS.get(unit.lower(), 1)


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in recent click
    """A click parameter type: a duration in seconds (see `parse_duration`), from `low` to
    `high` seconds (`sqla_queue.job.bounds.check_duration`)."""

    name = "duration"

    def __init__(self, low: float = 0.0, high: float = MAX_DURATION) -> None:
        self.low, self.high = low, high

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not (math.isfinite(seconds) and self.low <= seconds <= self.high):
            self.fail(f"must be {duration_range(self.low, self.high)}, got {value!r}", param, ctx)
        return seconds

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"


DURATION = Duration()
"""The shared instance: `click.option("--lease", type=DURATION, ...)`."""

RATE_ACCEPTED = (
    "COUNT/PER, a whole count per a duration or a unit: 100/s, 10/min, 500/h, 20/30s, 1000/d"
)
"""The accepted forms of a rate, as error messages and help texts name them."""

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\S+)\s*$")
_RATE_WORDS = {"sec": "s", "second": "s", "min": "m", "minute": "m", "hour": "h", "day": "d"}


def parse_rate(value: str) -> tuple[int, float]:
    """'100/s', '10/min', '500/h', '20/30s' -> (count, window in seconds).

    Raises `ValueError` naming the accepted forms for anything else (a zero count or window,
    a fraction of a job, an unknown unit).
    """
    match = _RATE.match(str(value))
    if match:
        count, per = int(match.group(1)), match.group(2).lower()
        per = _RATE_WORDS.get(per.rstrip("s") if len(per) > 3 else per, per)
        try:
            window = parse_duration(per if per[0].isdigit() else f"1{per}")
        except ValueError:
            window = 0.0
        if count > 0 and window > 0:
            return count, window
    raise ValueError(f"{value!r} is not a rate; expected {RATE_ACCEPTED}")


class Rate(click.ParamType):  # type: ignore[type-arg]  # generic only in recent click
    """A click parameter type: a rate, as (count, window seconds) (see `parse_rate`)."""

    name = "rate"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, float]:
        if isinstance(value, tuple):
            return value
        try:
            count, window = parse_rate(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        try:
            return check_rate("rate", count, window, ValueError)
        except ValueError as exc:
            self.fail(f"{value!r}: {exc}", param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "COUNT/PER"


RATE = Rate()
"""The shared instance: `click.option("--rate", type=RATE, ...)`."""


def describe_rate(count: int, window: float) -> str:
    """(100, 1.0) -> '100/s', (10, 60.0) -> '10/min', (20, 30.0) -> '20/30s': the form
    `parse_rate` reads back."""
    for unit, seconds in (("s", 1), ("min", 60), ("h", 3600), ("d", 86400)):
        if window == seconds:
            return f"{count}/{unit}"
    return f"{count}/{window:g}s"


def describe_duration(seconds: float) -> str:
    """300.0 -> '5m', 30.0 -> '30s', 5400.0 -> '90m', 1.5 -> '1.5s': the form `parse_duration`
    reads back, in the largest unit that divides it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def describe_age(seconds: float) -> str:
    """How long something has lasted, for a person: '45 s', '21 min', '3.5 h', '9 d'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"


__all__ = [
    "ACCEPTED",
    "DURATION",
    "RATE",
    "RATE_ACCEPTED",
    "UNITS",
    "Duration",
    "Rate",
    "describe_age",
    "describe_duration",
    "describe_rate",
    "parse_duration",
    "parse_rate",
]
