"""The jobs page's filter (from a query string or a form) and its bulk actions on an engine:
the count and a sample of the jobs an action would take (for the confirmation), then retry,
cancel or delete every job matching the filter (`sqla_queue.admin.filters`: in batches, each
its own transaction). The request's handler is `Dashboard.jobs_bulk` (`pages`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import Engine

from sqla_queue.admin import filters as bulk
from sqla_queue.admin.filters import JobFilter
from sqla_queue.dashboard import params as checks
from sqla_queue.db.models import JobStatus
from sqla_queue.errors import SqlaQueueError

FIELDS = (
    "queue",
    "task",
    "status",
    "tag",
    "workflow",
    "about",
    "waiting_for",
    "error",
    "traceback",
    "args_path",
    "args_value",
    "finished_after",
    "finished_before",
)
"""The filter's fields, as the jobs page's form names them (times in UTC)."""


def _time(value: str | None, name: str) -> dt.datetime | None:
    """A form's `datetime-local` value (`2026-12-03T12:00`), in UTC unless it has a zone."""
    if value is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise checks.BadParameter(f"{name} must be a time like 2026-12-03T12:00") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)


def parse_filter(given: Mapping[str, Any]) -> tuple[JobFilter, dict[str, str]]:
    """The `JobFilter` of a query string or form, and its fields as text (to fill the form
    and build links); `checks.BadParameter` names a bad field."""
    text: dict[str, str] = {}
    for name in FIELDS:
        value = given.get(name)
        text[name] = checks.text_filter(value if isinstance(value, str) else None, name) or ""
    status = text["status"] or None
    if status is not None and status not in {s.value for s in JobStatus}:
        choices = ", ".join(s.value for s in JobStatus)
        raise checks.BadParameter(f"status is one of {choices}")
    if bool(text["args_path"]) != bool(text["args_value"]):
        raise checks.BadParameter("args path and args value go together")
    try:
        args = (
            bulk.args_from_text(text["args_path"], text["args_value"])
            if text["args_path"]
            else None
        )
        where = JobFilter(
            queue=text["queue"] or None,
            task=text["task"] or None,
            status=status,
            tag=text["tag"] or None,
            workflow_id=text["workflow"] or None,
            about=text["about"] or None,
            waiting_for=text["waiting_for"] or None,
            error=text["error"] or None,
            traceback=text["traceback"] or None,
            finished_after=_time(text["finished_after"] or None, "finished after"),
            finished_before=_time(text["finished_before"] or None, "finished before"),
            args=args,
        )
    except SqlaQueueError as exc:
        raise checks.BadParameter(str(exc)) from None
    return where, text


def query_of(text: Mapping[str, str]) -> str:
    """The query string of the filter's fields given (none empty)."""
    return urlencode({name: value for name, value in text.items() if value})


SAMPLE_SIZE = 5
"""Jobs a bulk confirmation shows of those that matched."""


def count_matching(
    engine: Engine, action: str, where: JobFilter
) -> tuple[int, list[bulk.MatchedJob]]:
    """How many jobs `action` would take, and the first few of them (`SAMPLE_SIZE`)."""
    with engine.connect() as conn:
        count = bulk.count_matching(conn, where, action)
        sample = bulk.sample_matching(conn, where, action, SAMPLE_SIZE) if count else []
    return count, sample


def act(engine: Engine, action: str, where: JobFilter) -> str:
    """Do `action` on every job matching `where` (in batches); the notice that says what was
    done."""
    result = bulk.BULK_ACTIONS[action](engine, where)
    return str(result.notice)
