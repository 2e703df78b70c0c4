"""The dashboard's pages and actions over one engine: queues, jobs, one job, a workflow's
tree, workers and doctor's findings; retry, cancel and delete jobs, pause and resume queues."""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, TypedDict
from urllib.parse import urlencode

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sqla_queue import admin
from sqla_queue.admin import workers as admin_workers
from sqla_queue.admin.filters import ACTIONS as BULK_ACTIONS
from sqla_queue.admin.signals import signal_waits
from sqla_queue.dashboard import bulk_actions, reads, rendering
from sqla_queue.dashboard import params as checks
from sqla_queue.dashboard.api import Api
from sqla_queue.dashboard.api_auth import tokens_from
from sqla_queue.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    Auth,
    SecurityMiddleware,
    csrf_matches,
    notice_proof,
)
from sqla_queue.db import rollup
from sqla_queue.db.models import JobStatus
from sqla_queue.doctor import DoctorOptions, Severity, diagnose
from sqla_queue.errors import SqlaQueueError
from sqla_queue.job.states import COUNTED

JOB_ACTIONS = ("retry", "cancel", "delete")
NOTICE_FIELD = "notice"
PROOF_FIELD = "proof"
NAMED_SKIPS = 5
"""Jobs a notice names one by one at most (it travels in a URL)."""
MAX_BACK = 2000
"""The longest `back` path an action returns to."""


class DashboardOptions(TypedDict, total=False):
    """`Dashboard`'s options as keyword arguments (`**options: Unpack[DashboardOptions]`), for
    `create_app` and `wsgi_app`, which pass them on: their defaults stay in `Dashboard`."""

    read_only: bool
    """Hide the actions (retry, cancel, delete, pause, resume): the pages only show."""
    auth: Auth | str | None
    """Credentials each request must carry (`Auth`, or "user:password" / a token); None
    asks for none."""
    poll_seconds: float
    """Seconds between the pages' refreshes of the counts."""
    api_tokens: str | Mapping[str, str] | None
    """The HTTP API's tokens and scopes ("token:admin,other:read", or {token: scope});
    None: from `SQLA_QUEUE_API_TOKENS`, else the API refuses every request (401)."""


class Dashboard:
    """The pages and actions over one engine. `app` is the ASGI application."""

    def __init__(
        self,
        engine: Engine,
        *,
        read_only: bool = False,
        auth: Auth | str | None = None,
        poll_seconds: float = 2.0,
        api_tokens: str | Mapping[str, str] | None = None,
    ) -> None:
        self.engine = engine
        self.read_only = read_only
        self.poll_seconds = poll_seconds
        self.auth = Auth.parse(auth) if isinstance(auth, str) else auth
        self._counts_lock = threading.Lock()
        self._counts: tuple[float, list[reads.QueueRow] | None, float] = (0.0, None, 0.0)
        self.templates = rendering.templates()
        self.api = Api(
            engine,
            tokens_from(api_tokens),
            read_only=read_only,
            templates=self.templates,
            queue_rows=self._queue_rows,
            forget_counts=self._forget_counts,
        )
        routes = [
            *self.api.routes(),
            Route("/", self.queues_page, name="queues"),
            Route("/partials/queues", self.queues_partial, name="queues_partial"),
            Route("/jobs", self.jobs_page, name="jobs"),
            Route("/jobs/action", self.jobs_action, methods=["POST"], name="jobs_action"),
            Route("/jobs/bulk", self.jobs_bulk, methods=["POST"], name="jobs_bulk"),
            Route("/jobs/{job_id}", self.job_page, name="job"),
            Route("/workflows/{workflow_id:path}", self.workflow_page, name="workflow"),
            Route("/queues/{name:path}/pause", self.pause, methods=["POST"], name="pause"),
            Route("/queues/{name:path}/resume", self.resume, methods=["POST"], name="resume"),
            Route("/queues/{name:path}", self.queue_page, name="queue"),
            Route("/workers", self.workers_page, name="workers"),
            Route("/doctor", self.doctor_page, name="doctor"),
            Mount("/static", StaticFiles(directory=rendering.STATIC), name="static"),
        ]
        self.app = Starlette(
            routes=routes, middleware=[Middleware(SecurityMiddleware, auth=self.auth)]
        )

    # -- rendering ---------------------------------------------------------------------------

    def _render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        page = self.templates.get_template(template).render(
            base=base,
            csrf_field=CSRF_FIELD,
            csrf=request.state.csrf,
            read_only=self.read_only,
            poll_seconds=self.poll_seconds,
            notice=self._notice(request),
            **context,
        )
        return HTMLResponse(page, status_code=status)

    def _notice(self, request: Request) -> str | None:
        """The notice of the action that redirected here; None if this app did not write it
        for this browser (`?notice=` alone shows nothing)."""
        notice = request.query_params.get(NOTICE_FIELD)
        proof = request.query_params.get(PROOF_FIELD)
        if not notice or not proof:
            return None
        expected = notice_proof(request.state.csrf, notice)
        return notice if hmac.compare_digest(proof.encode(), expected.encode()) else None

    def _back(self, request: Request, path: str, notice: str) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        separator = "&" if "?" in path else "?"
        query = {NOTICE_FIELD: notice, PROOF_FIELD: notice_proof(request.state.csrf, notice)}
        return RedirectResponse(f"{base}{path}{separator}{urlencode(query)}", status_code=303)

    def _bad_request(self, request: Request, message: str, status: int = 400) -> Response:
        return self._render(request, "error.html", status=status, message=message)

    def _queue_rows(self) -> tuple[list[reads.QueueRow], float, float]:
        """The queues' counts, shared by every viewer: (rows, seconds since counted, ms
        the count took). Counted at most once per poll and never more than a tenth of the
        time (bounded on a big table: `reads.queue_rows`), so the counts age a little."""
        with self._counts_lock:
            now = time.monotonic()
            counted_at, rows, took = self._counts
            if rows is None or now - counted_at >= max(self.poll_seconds * 0.9, took * 10):
                with self.engine.connect() as conn:
                    rows = reads.queue_rows(conn)
                took = time.monotonic() - now
                counted_at = time.monotonic()
                self._counts = (counted_at, rows, took)
            return rows, time.monotonic() - counted_at, took * 1000

    def _forget_counts(self) -> None:
        with self._counts_lock:
            self._counts = (0.0, None, 0.0)

    def _queues_context(self) -> dict[str, Any]:
        rows, age, took_ms = self._queue_rows()
        charts = {
            row.name: (
                rendering.series_chart(row.hour, rollup.HOUR),
                rendering.series_chart(row.day, rollup.DAY, width=288),
            )
            for row in rows
        }
        return {
            "queues": rows,
            "charts": charts,
            "statuses": list(COUNTED),
            "counted_ago": age,
            "count_ms": took_ms,
        }

    # -- pages -------------------------------------------------------------------------------

    def queues_page(self, request: Request) -> Response:
        return self._render(request, "queues.html", **self._queues_context())

    def queues_partial(self, request: Request) -> Response:
        return self._render(request, "_queues_table.html", **self._queues_context())

    def queue_page(self, request: Request) -> Response:
        """One queue's settings and tasks (each one's jobs ended over the last hour and day,
        from the rollup); its deepest partitions, held sequences and aged jobs if it has any."""
        name = request.path_params["name"]
        try:
            checks.text_filter(name, "the queue name")
        except checks.BadParameter as exc:
            return self._bad_request(request, f"no such queue: {exc}", status=404)
        with self.engine.connect() as conn:
            hour = rollup.recent(conn, rollup.HOUR, queue=name, by_task=True)
            day = rollup.recent(conn, rollup.DAY, queue=name, by_task=True)
            turns = reads.queue_turns(conn, name)
        tasks = [
            {
                "name": task,
                "hour": hour.get(task),
                "day": day[task],
                "charts": (
                    rendering.series_chart(hour.get(task), rollup.HOUR),
                    rendering.series_chart(day[task], rollup.DAY, width=288),
                ),
            }
            for task in sorted(day)
        ]
        return self._render(
            request, "queue.html", queue=name, tasks=tasks, day=rollup.DAY, turns=turns
        )

    def jobs_page(self, request: Request) -> Response:
        params = request.query_params
        try:
            where, filters = bulk_actions.parse_filter(params)
            before = checks.job_id(params["before"], "before") if params.get("before") else None
        except checks.BadParameter as exc:
            return self._bad_request(request, f"bad filter: {exc}")
        with self.engine.connect() as conn:
            page = reads.list_jobs(conn, where, before)
        return self._render(
            request,
            "jobs.html",
            page=page,
            filters=filters,
            filter_query=bulk_actions.query_of(filters),
            has_filter=not where.empty,
            statuses=[s.value for s in JobStatus],
            first_page=before is None,
        )

    def job_page(self, request: Request) -> Response:
        try:
            job_id = checks.job_id(request.path_params["job_id"])
        except checks.BadParameter as exc:
            return self._bad_request(request, f"no such job: {exc}", status=404)
        with self.engine.connect() as conn:
            job = admin.get_job(conn, job_id)
            links = admin.job_links(conn, job_id) if job is not None else None
            steps = admin.job_steps(conn, job_id) if job is not None else []
            waits = signal_waits(conn, job_id) if job is not None else []
            journal = admin.job_journal(conn, job_id) if job is not None else None
        if job is None:
            return self._render(
                request,
                "error.html",
                status=404,
                message=f"no job {job_id}: never enqueued, or deleted once finished "
                "(by its queue's retention, prune, or from this page)",
            )
        began = job.started_at or job.locked_at
        timings = {
            "waited": reads.seconds_between(job.created_at, began),
            "ran": reads.seconds_between(began, job.finished_at),
            "total": reads.seconds_between(job.created_at, job.finished_at),
        }
        args = json.dumps(job.args, indent=2, ensure_ascii=False, sort_keys=True)
        meta = json.dumps(job.meta, indent=2, ensure_ascii=False, sort_keys=True)
        result = json.dumps(job.result, indent=2, ensure_ascii=False, sort_keys=True)
        return self._render(
            request,
            "job.html",
            job=job,
            args=args,
            meta=meta,
            result=result,
            timings=timings,
            links=links,
            steps=steps,
            waits=waits,
            journal=journal,
        )

    def workflow_page(self, request: Request) -> Response:
        workflow_id = request.path_params["workflow_id"]
        try:
            checks.text_filter(workflow_id, "the workflow id")
            with self.engine.connect() as conn:
                found = admin.workflow_jobs(conn, workflow_id)
        except (checks.BadParameter, SqlaQueueError) as exc:
            return self._bad_request(request, f"no such workflow: {exc}", status=404)
        if not found:
            return self._render(
                request,
                "error.html",
                status=404,
                message=f"no job of workflow {workflow_id}: never enqueued, or its jobs were "
                "deleted once finished (by their queues' retention, prune, or by hand)",
            )
        counts = Counter(job.status for job in found)
        return self._render(
            request,
            "workflow.html",
            workflow_id=workflow_id,
            found=found,
            tree=reads.workflow_tree(found),
            counts=[(s.value, counts[s.value]) for s in JobStatus if counts[s.value]],
        )

    def workers_page(self, request: Request) -> Response:
        with self.engine.connect() as conn:
            workers = admin_workers.live_workers(conn)
            running = admin_workers.running_jobs(conn, [w.id for w in workers])
            stopped = admin_workers.stopped_workers(conn)
        return self._render(
            request, "workers.html", workers=workers, running=running, stopped=stopped
        )

    def doctor_page(self, request: Request) -> Response:
        # No MultiXact sampling: a page must not sleep for a second.
        findings = diagnose(self.engine, DoctorOptions(sample=0))
        return self._render(request, "doctor.html", findings=findings, Severity=Severity)

    # -- actions -----------------------------------------------------------------------------

    async def _checked_form(self, request: Request) -> FormData | Response:
        """The POSTed form if the dashboard may act and its CSRF token matches the cookie."""
        if self.read_only:
            return PlainTextResponse("this dashboard is read-only (--read-only)", status_code=403)
        form = await request.form()
        if not csrf_matches(form.get(CSRF_FIELD), request.cookies.get(CSRF_COOKIE)):
            return PlainTextResponse(
                "missing or wrong CSRF token: reload the page and try again", status_code=403
            )
        return form

    async def jobs_action(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        action = form.get("action")
        back = form.get("back") or "/jobs"
        # Only a path of this app: never another site (`//host`, `/\host` in browsers).
        if (
            not isinstance(back, str)
            or len(back) > MAX_BACK
            or not back.startswith("/")
            or back[1:2] in ("/", "\\")
        ):
            back = "/jobs"
        if action not in JOB_ACTIONS:
            return PlainTextResponse(f"action must be one of {', '.join(JOB_ACTIONS)}", 400)
        try:
            ids = list(dict.fromkeys(checks.job_id(value) for value in form.getlist("job_id")))
        except checks.BadParameter as exc:
            return PlainTextResponse(str(exc), status_code=400)
        if not ids:
            return self._back(request, back, "no job selected")
        try:
            notice = await run_in_threadpool(self._act, str(action), ids)
        except SqlaQueueError as exc:
            notice = str(exc)
        return self._back(request, back, notice)

    async def jobs_bulk(self, request: Request) -> Response:
        """POST /jobs/bulk: without `confirmed`, a page with the count of jobs `action` would
        take and a form to confirm; with it, the action on every matching job, then back to
        the filtered list with a notice."""
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        action = form.get("action")
        if action not in BULK_ACTIONS:
            return PlainTextResponse(f"action must be one of {', '.join(BULK_ACTIONS)}", 400)
        try:
            where, text = bulk_actions.parse_filter(form)
        except checks.BadParameter as exc:
            return self._bad_request(request, f"bad filter: {exc}")
        back = f"/jobs?{bulk_actions.query_of(text)}"
        if where.empty:
            return self._back(
                request, back, "set a filter first: an action on every job is refused"
            )
        try:
            if form.get("confirmed") != "yes":
                count, sample = await run_in_threadpool(
                    bulk_actions.count_matching, self.engine, str(action), where
                )
                if not count:
                    return self._back(request, back, f"no job to {action} matches this filter")
                return self._render(
                    request,
                    "jobs_bulk.html",
                    action=str(action),
                    count=count,
                    sample=sample,
                    described=where.describe(),
                    fields=text,
                    back=back,
                )
            notice = await run_in_threadpool(bulk_actions.act, self.engine, str(action), where)
            self._forget_counts()
        except SqlaQueueError as exc:
            notice = str(exc)
        return self._back(request, back, notice)

    def _act(self, action: str, ids: list[int]) -> str:
        """Do `action` on the jobs `ids`; the notice that says what was done."""
        held: dict[int, admin.SkippedRetry] = {}
        kept: dict[int, admin.SkippedRetry] = {}
        with self.engine.begin() as conn:
            if action == "retry":
                retried = admin.retry_jobs(conn, ids)
                done, held, kept = len(retried), retried.skipped, retried.not_revived
            elif action == "cancel":
                done = len(admin.cancel_jobs(conn, ids))
            else:
                done = len(admin.delete_jobs(conn, ids))
        self._forget_counts()
        verb = {"retry": "retried", "cancel": "cancelled", "delete": "deleted"}[action]
        parts = [f"{done} job(s) {verb}"]
        for job_id, skip in sorted(held.items())[:NAMED_SKIPS]:
            parts.append(f"job {job_id} not retried: {skip.reason}")
        if len(held) > NAMED_SKIPS:
            parts.append(f"{len(held) - NAMED_SKIPS} more not retried: their unique keys are held")
        others = len(ids) - done - len(held)
        if others:
            parts.append(f"{others} left alone (not in a state that allows it)")
        if kept:
            parts.append(f"{len(kept)} cancelled dependent(s) not revived: unique key held")
        return "; ".join(parts)

    async def _set_paused(self, request: Request, paused: bool) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        name = request.path_params["name"]
        try:
            checks.text_filter(name, "the queue name")
            await run_in_threadpool(self._pause, name, paused)
        except (checks.BadParameter, SqlaQueueError) as exc:
            return self._back(request, "/", str(exc))
        return self._back(request, "/", f"queue {name} {'paused' if paused else 'resumed'}")

    def _pause(self, name: str, paused: bool) -> None:
        with self.engine.begin() as conn:
            admin.set_paused(conn, name, paused)
        self._forget_counts()

    async def pause(self, request: Request) -> Response:
        return await self._set_paused(request, True)

    async def resume(self, request: Request) -> Response:
        return await self._set_paused(request, False)
