"""The click parameter types of the command line: bounded counts, durations and rates.

Each refuses bad input with the message the Python API's check gives
(`sqla_queue.job.validation`), naming the option, so that a value PostgreSQL cannot hold is
refused where it is typed:

    click.option("--batch", type=count(1, MAX_BATCH))
    click.option("--lease", type=DURATION)          90, 90s, 15m, 12h, 7d, 2w
    click.option("--rate", type=RATE)               100/s, 10/min, 500/h, 20/30s
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from sqla_queue.job.validation import (
    INT4_MAX,
    INT8_MAX,
    MAX_DURATION,
    check_rate,
    count_range,
    duration_range,
    parse_duration,
    parse_rate,
)

_PLAIN_INT = re.compile(r"\s*[-+]?[0-9]+\s*")


class Count(click.IntRange):
    """A whole number from `low` to `high` (`check_count`), refused with the same message as
    the Python API's (`count(1, 10)`, `JOB_ID`, `PORT`)."""

    def __init__(self, low: int = 1, high: int = INT4_MAX, what: str = "") -> None:
        super().__init__(low, high)
        self.low, self.high = low, high
        self.what = f"{what}, " if what else ""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.INT.convert(value, param, ctx)
        if isinstance(value, str) and not _PLAIN_INT.fullmatch(value):
            # int() takes "1_000" and other scripts' digits ("١٢" is 12): not a number to type.
            self.fail(
                f"must be {self.what}{count_range(self.low, self.high)} written in digits "
                f"0-9, got {value!r}"
            )
        if not self.low <= number <= self.high:
            self.fail(f"must be {self.what}{count_range(self.low, self.high)}, got {number}")
        return number


def count(low: int = 1, high: int = INT4_MAX, what: str = "") -> Count:
    """`click.option("--batch", type=count(1, MAX_BATCH))`: a bounded whole number; `what`
    names it in the message ("must be WHAT, a whole number from 1 to 10, got 0")."""
    return Count(low, high, what)


JOB_ID = count(1, INT8_MAX, what="a job id")
"""The click type of a job id argument or option."""
PORT = count(1, 65535, what="a TCP port")
"""The click type of a port to listen on."""


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in recent click
    """A duration in seconds (see `parse_duration`), from `low` to `high` seconds
    (`sqla_queue.job.validation.check_duration`)."""

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


class Rate(click.ParamType):  # type: ignore[type-arg]  # generic only in recent click
    """A rate, as (count, window seconds) (see `parse_rate`)."""

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


__all__ = ["DURATION", "JOB_ID", "PORT", "RATE", "Count", "Duration", "Rate", "count"]
