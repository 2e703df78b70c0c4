"""How the dashboard's pages are drawn: the Jinja2 templates (escaped), the filters they use
for durations and times, and the per-minute bar charts as inline SVG."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

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


def ago(value: dt.datetime | None, now: dt.datetime | None = None) -> Markup:
    """A moment, compact: "3 min ago", "in 2 h" (to the second within a minute), with the
    exact time (`when`) on hover; "—" for none."""
    if value is None:
        return Markup("—")
    now = now or dt.datetime.now(dt.timezone.utc)
    seconds = (now - value).total_seconds()
    span = f"{abs(seconds):.0f} s" if abs(seconds) < 60 else describe_age(abs(seconds))
    said = f"{span} ago" if seconds >= 0 else f"in {span}"
    exact = when(value)
    return Markup('<time datetime="{}" title="{}">{}</time>').format(value.isoformat(), exact, said)


QUEUE_FRAME = re.compile(r'^\s*File "[^"]*[/\\]sqla_queue[/\\][^"]*", line \d+')
"""A traceback's frame in the queue's own code (any install path, any OS)."""


def traceback_parts(text: str) -> list[tuple[str, str]]:
    """A traceback cut into runs of lines: ("queue", the queue's own frames, shown folded)
    and ("user", the rest: the user's frames and the error), in order."""
    parts: list[tuple[str, list[str]]] = []
    in_queue_frame = False
    for line in text.splitlines():
        if line.lstrip().startswith('File "'):
            in_queue_frame = bool(QUEUE_FRAME.match(line))
        elif not line.startswith("    "):  # not a frame's code line: the frames ended
            in_queue_frame = False
        kind = "queue" if in_queue_frame else "user"
        if parts and parts[-1][0] == kind:
            parts[-1][1].append(line)
        else:
            parts.append((kind, [line]))
    return [(kind, "\n".join(lines)) for kind, lines in parts]


HEADLINE_CHARS = 120
"""The longest headline of a doctor finding on its page (the rest is folded)."""


def headline(text: str, limit: int = HEADLINE_CHARS) -> tuple[str, str]:
    """A finding's text as (its headline, the rest): cut after its first clause (": ",
    "; ", ". ", " (") if that comes within `limit` characters, else at the last space
    before it; ("whole text", "") when it is short."""
    if len(text) <= limit:
        return text, ""
    cuts = [text.find(mark, 40) for mark in (": ", "; ", ". ", " (")]  # a clause, not a name
    found = [cut for cut in cuts if 0 < cut <= limit]
    cut = min(found) if found else text.rfind(" ", 0, limit)
    if cut <= 0:
        cut = limit
    return text[:cut].rstrip(" :;.(") + " …", text[cut:].lstrip(" :;.")


def details_json(details: object) -> str:
    """A finding's details for people: indented JSON (times and other values as text)."""
    return json.dumps(details, indent=2, sort_keys=True, default=str, ensure_ascii=False)


CHART_AXIS = 11
"""Pixels under a chart's bars for its time axis ("-60 min" ... "now")."""
CHART_SCALE = 56
"""Pixels right of a chart's bars for its scale (the tallest bar's count, per bucket)."""


def bar_chart(
    values: list[int],
    failed: list[int],
    label: str = "jobs ended per minute, last hour",
    width: int = 240,
    height: int = 32,
    start: dt.datetime | None = None,
    step: int = 1,
) -> str:
    """An inline SVG bar chart, one bar per bucket of `step` minutes, the oldest first (the
    first starting at `start`): the jobs ended, the failed ones drawn over them in red; a
    time axis under the bars, the scale (the tallest bar's count per bucket) right of them,
    and on hover each bar's bucket (UTC) and counts. Numbers only (and `label`, escaped),
    so it is safe."""
    top = max(values) or 1
    step_width = width / len(values)
    full_width, full_height = width + CHART_SCALE, height + CHART_AXIS
    parts = [
        f'<svg class="chart" width="{full_width}" height="{full_height}" '
        f'viewBox="0 0 {full_width} {full_height}" role="img" aria-label="{escape(label)}">',
        f'<line class="axis" x1="0" y1="{height + 0.5}" x2="{width}" y2="{height + 0.5}"/>',
    ]
    for i, (count, bad) in enumerate(zip(values, failed, strict=False)):
        if not count:
            continue
        h = max(1.0, height * count / top)
        bad_h = max(1.0, height * bad / top)
        x = i * step_width
        when_text = ""
        if start is not None:
            bucket = start + dt.timedelta(minutes=i * step)
            when_text = bucket.astimezone(dt.timezone.utc).strftime("%H:%M UTC: ")
        parts.append(
            f'<rect class="ok" x="{x:.1f}" y="{height - h:.1f}" width="{step_width * 0.8:.1f}" '
            f'height="{h:.1f}"><title>{when_text}{count} ended, {bad} failed</title></rect>'
        )
        if bad:
            parts.append(
                f'<rect class="bad" x="{x:.1f}" y="{height - bad_h:.1f}" '
                f'width="{step_width * 0.8:.1f}" height="{bad_h:.1f}"></rect>'
            )
    minutes = len(values) * step
    ago = f"-{minutes} min" if minutes < 120 else f"-{minutes // 60} h"
    per = "min" if step == 1 else f"{step} min"
    parts += [
        f'<text class="axis" x="0" y="{full_height - 1}">{ago}</text>',
        f'<text class="axis" x="{width}" y="{full_height - 1}" text-anchor="end">now</text>',
        f'<text class="axis scale" x="{width + 3}" y="8">{top}/{per}</text>',
        f'<text class="axis scale" x="{width + 3}" y="{height}">0</text>',
        "</svg>",
    ]
    return "".join(parts)


def series_chart(series: Series | None, span: Span, width: int = 240) -> str:
    """The chart of one queue's (or task's) series over `span`; an empty one for none."""
    label = f"jobs ended, {span.label}"
    if series is None:
        empty = [0] * span.buckets
        return bar_chart(empty, empty, label, width, step=span.step)
    return bar_chart(
        series.finished, series.failed, label, width, start=series.start, step=span.step
    )


def templates() -> Environment:
    """The pages' templates, every value escaped unless a template says otherwise."""
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    environment.filters["duration"] = duration
    environment.filters["when"] = when
    environment.filters["ago"] = ago
    environment.filters["headline"] = headline
    environment.filters["details_json"] = details_json
    environment.filters["traceback_parts"] = traceback_parts
    environment.globals["states"] = STATES  # which buttons a job's status offers
    environment.globals["max_errors"] = MAX_ENTRIES  # a job's error history's bound
    return environment
