"""The jobs page's filter (from a query string or a form) and its bulk actions: retry,
cancel or delete every job matching the filter, after a confirmation showing the count and
a sample of the jobs that matched (`sqla_queue.admin.filters`: in batches, each its own
transaction)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from sqla_queue.admin import filters as bulk
from sqla_queue.admin.filters import JobFilter
from sqla_queue.dashboard import params as checks
from sqla_queue.db.models import JobStatus
from sqla_queue.errors import SqlaQueueError

if TYPE_CHECKING:
    from sqla_queue.dashboard.pages import Dashboard

FIELDS = (
    "queue",
    "task",
    "status",
    "tag",
    "workflow",
    "about",
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


async def bulk_action(dash: Dashboard, request: Request) -> Response:
    """POST /jobs/bulk: without `confirmed`, a page with the count of jobs `action` would
    take and a form to confirm; with it, the action on every matching job, then back to
    the filtered list with a notice."""
    form = await dash._checked_form(request)
    if isinstance(form, Response):
        return form
    action = form.get("action")
    if action not in bulk.ACTIONS:
        return PlainTextResponse(f"action must be one of {', '.join(bulk.ACTIONS)}", 400)
    try:
        where, text = parse_filter(form)
    except checks.BadParameter as exc:
        return dash._bad_request(request, f"bad filter: {exc}")
    back = f"/jobs?{query_of(text)}"
    if where.empty:
        return dash._back(request, back, "set a filter first: an action on every job is refused")
    try:
        if form.get("confirmed") != "yes":
            count, sample = await run_in_threadpool(_count, dash, str(action), where)
            if not count:
                return dash._back(request, back, f"no job to {action} matches this filter")
            return dash._render(
                request,
                "jobs_bulk.html",
                action=str(action),
                count=count,
                sample=sample,
                described=where.describe(),
                fields=text,
                back=back,
            )
        notice = await run_in_threadpool(_act, dash, str(action), where)
    except SqlaQueueError as exc:
        notice = str(exc)
    return dash._back(request, back, notice)


SAMPLE_SIZE = 5
"""Jobs a bulk confirmation shows of those that matched."""


def _count(dash: Dashboard, action: str, where: JobFilter) -> tuple[int, list[bulk.MatchedJob]]:
    """How many jobs `action` would take, and the first few of them."""
    with dash.engine.connect() as conn:
        count = bulk.count_matching(conn, where, action)
        sample = bulk.sample_matching(conn, where, action, SAMPLE_SIZE) if count else []
    return count, sample


def _act(dash: Dashboard, action: str, where: JobFilter) -> str:
    result = bulk.BULK_ACTIONS[action](dash.engine, where)
    dash._forget_counts()
    return str(result.notice)
