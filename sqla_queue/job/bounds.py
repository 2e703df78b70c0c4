"""The bounds of every number and duration sqla-queue accepts, in one place. The CLI's
parameter types and the Python API's checks share them, so that a value PostgreSQL cannot
hold is refused where it enters, in one line naming the limit, never as a database error:

    durations   0 to 100 years (`MAX_DURATION`): now() plus 100 years stays far inside
                PostgreSQL's timestamps (to 294276 AD) and Python's (to 9999), the longest
                wait Python's threads take (`threading.TIMEOUT_MAX`, about 292 years) is
                longer, and a stored setting multiplied into an interval cannot overflow
    counts      an int4 column's range (1 to 2147483647) unless an option allows less
    job ids     a positive int8 (1 to 2**63 - 1)
    ports       1 to 65535

Each `check_*` function returns the value (as the type stored) or raises the caller's error
(`ConfigurationError` by default) with the message the CLI's types show too:
"max_attempts must be a whole number from 1 to 1000000, got 99999999999".
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable
from typing import Any

import click

from sqla_queue.errors import ConfigurationError, InvalidJobError

INT4_MAX = 2**31 - 1
"""The largest value of PostgreSQL's `integer` (int4)."""
INT8_MAX = 2**63 - 1
"""The largest value of PostgreSQL's `bigint` (int8), and so of a job id."""
MAX_DURATION = 100 * 365.25 * 86400
"""The longest duration accepted anywhere, in seconds: 100 years (see the module's text)."""
MAX_ATTEMPTS = 1_000_000
"""The most attempts a job may be given: room below int4 for the attempts a reaper refunds."""
PRIORITY_MAX = 32767
"""The largest priority (a smallint column); 0 runs first."""
MAX_WORKER_CONCURRENCY = 10_000
"""The most handlers one worker runs at once (each is a thread or a task)."""
MAX_BATCH = 10_000
"""The most jobs a worker claims, or the relay moves, in one statement."""
MAX_PROCESSES = 1000
"""The most worker processes `sqla-queue worker --processes` supervises."""
MIN_RATE_WINDOW = 0.001
"""The shortest rate window, in seconds: a shorter one limits nothing."""

ErrorFactory = Callable[[str], Exception]
"""Makes the error a check raises from its message (e.g. an `InvalidJobError` naming a task)."""


def _configuration_error(detail: str) -> Exception:
    return ConfigurationError(detail=detail)


def invalid_job(task: object) -> ErrorFactory:
    """The error factory of the checks of a job's fields: an `InvalidJobError` naming `task`."""
    return lambda detail: InvalidJobError(task=task, detail=detail)


def describe_duration(seconds: float) -> str:
    """3155760000.0 -> '3155760000 s (100 years)'; 60.0 -> '60 s'."""
    text = f"{seconds:g} s" if seconds < 1e6 else f"{seconds:.0f} s"
    return f"{text} (100 years)" if seconds == MAX_DURATION else text


def count_range(low: int, high: int) -> str:
    """The accepted range of a count, as messages name it: 'a whole number from 1 to 10'."""
    return f"a whole number from {low} to {high}"


def duration_range(low: float, high: float) -> str:
    """The accepted range of a duration, as messages name it."""
    return f"a number of seconds from {low:g} to {describe_duration(high)}"


def check_count(
    name: str,
    value: object,
    low: int = 1,
    high: int = INT4_MAX,
    error: ErrorFactory = _configuration_error,
) -> int:
    """`value` if it is an int (not a bool) from `low` to `high`; else `error(message)`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{name} must be {count_range(low, high)}, got {value!r}")
    return value


def check_job_id(name: str, value: object, error: ErrorFactory = _configuration_error) -> int:
    """`value` if it can be a job id (a positive int8); else `error(message)`."""
    return check_count(name, value, 1, INT8_MAX, error)


def check_duration(
    name: str,
    value: object,
    low: float = 0.0,
    high: float = MAX_DURATION,
    error: ErrorFactory = _configuration_error,
) -> float:
    """`value` (seconds, or a timedelta) as seconds if it is finite and from `low` to
    `high`; else `error(message)`."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not low <= seconds <= high
    ):
        raise error(f"{name} must be {duration_range(low, high)}, got {value!r}")
    return float(seconds)


def check_rate(
    name: str, count: object, window: object, error: ErrorFactory = _configuration_error
) -> tuple[int, float]:
    """(count, window seconds) of a rate limit, each within its bounds; else `error`."""
    return (
        check_count(f"{name} count", count, 1, INT4_MAX, error),
        check_duration(f"{name} window", window, MIN_RATE_WINDOW, MAX_DURATION, error),
    )


_PLAIN_INT = re.compile(r"\s*[-+]?[0-9]+\s*")


class Count(click.IntRange):
    """A click parameter type: a whole number from `low` to `high` (`check_count`), refused
    with the same message as the Python API's (`count(1, 10)`, `JOB_ID`, `PORT`)."""

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


__all__ = [
    "INT4_MAX",
    "INT8_MAX",
    "JOB_ID",
    "MAX_ATTEMPTS",
    "MAX_BATCH",
    "MAX_DURATION",
    "MAX_PROCESSES",
    "MAX_WORKER_CONCURRENCY",
    "MIN_RATE_WINDOW",
    "PORT",
    "PRIORITY_MAX",
    "Count",
    "ErrorFactory",
    "check_count",
    "check_duration",
    "check_job_id",
    "check_rate",
    "count",
    "count_range",
    "describe_duration",
    "duration_range",
    "invalid_job",
]
