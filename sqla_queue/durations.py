"""Durations as the CLI accepts them: a number of seconds, or a number with a unit.

    90      90 seconds          15m   15 minutes         7d   7 days
    90s     90 seconds          12h   12 hours           2w   2 weeks
    0.5     half a second

`Duration` is the click parameter type every duration-like option uses, so each of them
accepts the same forms and refuses bad input with the same message, naming the option.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

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
    """A click parameter type: a duration in seconds (see `parse_duration`)."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"


DURATION = Duration()
"""The shared instance: `click.option("--lease", type=DURATION, ...)`."""

__all__ = ["ACCEPTED", "DURATION", "UNITS", "Duration", "parse_duration"]
