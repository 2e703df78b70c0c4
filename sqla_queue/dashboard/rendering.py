"""How the dashboard's pages are drawn: the Jinja2 templates (escaped), the filters they use
for durations and times, and the per-minute bar charts as inline SVG."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import escape

from sqla_queue.db.rollup import Series, Span
from sqla_queue.job.history import MAX_ENTRIES
from sqla_queue.job.states import STATES
from sqla_queue.job.validation import describe_age

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def duration(seconds: float | None) -> str:
    """A duration for a person: "350 ms", "4.2 s", "12 min", "3.5 h", "9 d"; "—" for none."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return describe_age(seconds)


def when(value: dt.datetime | str | None) -> str:
    """A moment in UTC to the second, saying so ("2026-12-03 15:40:12 UTC"): from a datetime,
    or ISO 8601 text as an error history entry holds it (shown as it is if it does not
    parse); "—" for none. Every time the dashboard shows goes through it."""
    if value is None:
        return "—"
    if not isinstance(value, str):
        return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        return when(dt.datetime.fromisoformat(value))
    except ValueError:
        return value


def bar_chart(
    values: list[int],
    failed: list[int],
    label: str = "jobs ended per minute, last hour",
    width: int = 240,
    height: int = 32,
) -> str:
    """An inline SVG bar chart, one bar per bucket, the oldest first: the jobs ended, the
    failed ones drawn over them in red; numbers only (and `label`, escaped), so it is safe."""
    top = max(values) or 1
    step = width / len(values)
    parts = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(label)}">'
    ]
    for i, (count, bad) in enumerate(zip(values, failed, strict=False)):
        if not count:
            continue
        h = max(1.0, height * count / top)
        bad_h = max(1.0, height * bad / top)
        x = i * step
        parts.append(
            f'<rect class="ok" x="{x:.1f}" y="{height - h:.1f}" width="{step * 0.8:.1f}" '
            f'height="{h:.1f}"><title>{count} ended, {bad} failed</title></rect>'
        )
        if bad:
            parts.append(
                f'<rect class="bad" x="{x:.1f}" y="{height - bad_h:.1f}" '
                f'width="{step * 0.8:.1f}" height="{bad_h:.1f}"></rect>'
            )
    parts.append("</svg>")
    return "".join(parts)


def series_chart(series: Series | None, span: Span, width: int = 240) -> str:
    """The chart of one queue's (or task's) series over `span`; an empty one for none."""
    if series is None:
        return bar_chart([0] * span.buckets, [0] * span.buckets, f"jobs ended, {span.label}", width)
    return bar_chart(series.finished, series.failed, f"jobs ended, {span.label}", width)


def templates() -> Environment:
    """The pages' templates, every value escaped unless a template says otherwise."""
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    environment.filters["duration"] = duration
    environment.filters["when"] = when
    environment.globals["states"] = STATES  # which buttons a job's status offers
    environment.globals["max_errors"] = MAX_ENTRIES  # a job's error history's bound
    return environment
