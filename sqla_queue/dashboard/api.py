"""The HTTP API under `/api/`: JSON over the admin API, on the dashboard's own application.

One table (`ENDPOINTS`) declares each route: its method and path, the scope it needs, its
query or body model (`api_models`) and the call that answers it. The Starlette routes and
the OpenAPI document (`/api/openapi.json`, shown at `/api/docs`) are both made from it.
This layer parses, authorizes and serialises; every read and action is `sqla_queue.admin`'s
(bulk actions: `admin.filters`, in the CLI's bounded batches).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from sqla_queue import admin
from sqla_queue.admin import filters as bulk
from sqla_queue.admin import workers as admin_workers
from sqla_queue.dashboard import api_models as models
from sqla_queue.dashboard.api_auth import (
    Answer,
    Caller,
    IdempotencyKeys,
    KeyInUse,
    caller_of,
    check_key,
    request_digest,
)
from sqla_queue.dashboard.api_models import ApiError, JobAction, JobSearch
from sqla_queue.db import rollup
from sqla_queue.doctor import DoctorOptions, diagnose
from sqla_queue.errors import (
    ConfigurationError,
    SchemaMissingError,
    SqlaQueueError,
    UnknownQueueError,
)
from sqla_queue.job.validation import check_job_id, validate_name

if TYPE_CHECKING:
    from jinja2 import Environment

    from sqla_queue.dashboard.reads import QueueRow

PREFIX = "/api"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SAMPLE = 5
"""Jobs a dry run shows of those it counted."""


class ApiRefusal(Exception):
    """A request refused: its status and one line naming the problem and the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    """One route of the API: what it needs, what it takes, what answers it."""

    method: str
    path: str
    """Under `/api`, with `{name}` parameters (`{job_id}` is an integer)."""
    name: str
    summary: str
    scope: str
    """`read`, `admin`, or `public` (no token: the OpenAPI document and its page)."""
    call: str
    """The `Api` method that answers: `(request, parsed model or None) -> JSON-able`."""
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    tag: str = "jobs"
    response: Any = None
    """The model (or a union of models) of the answer: its schema in the OpenAPI document
    (`api_models`; None only for the HTML page)."""


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/openapi.json",
        "openapi",
        "This document.",
        "public",
        "openapi",
        tag="api",
        response=models.OpenApiDocument,
    ),
    Endpoint("GET", "/docs", "docs", "This document as a page.", "public", "docs", tag="api"),
    Endpoint(
        "GET",
        "/queues",
        "list_queues",
        "Every queue: its settings, counts by status and autoscaling signal.",
        "read",
        "queues",
        tag="queues",
        response=models.QueueList,
    ),
    Endpoint(
        "GET",
        "/queues/{name}",
        "show_queue",
        "One queue: its settings, counts and autoscaling signal.",
        "read",
        "queue",
        tag="queues",
        response=models.QueueEntry,
    ),
    Endpoint(
        "GET",
        "/queues/{name}/scaling",
        "queue_scaling",
        "One queue's autoscaling signal (flat: for KEDA's metrics-api scaler).",
        "read",
        "queue_scaling",
        tag="queues",
        response=admin.QueueScaling,
    ),
    Endpoint(
        "POST",
        "/queues/{name}/pause",
        "pause_queue",
        "Pause a queue.",
        "admin",
        "pause",
        tag="queues",
        response=models.PausedQueue,
    ),
    Endpoint(
        "POST",
        "/queues/{name}/resume",
        "resume_queue",
        "Resume a queue.",
        "admin",
        "resume",
        tag="queues",
        response=models.PausedQueue,
    ),
    Endpoint(
        "GET",
        "/jobs",
        "list_jobs",
        "Jobs matching the filters, newest first (page on with `before`).",
        "read",
        "jobs",
        query=JobSearch,
        response=models.JobPage,
    ),
    Endpoint(
        "GET",
        "/jobs/{job_id}",
        "show_job",
        "One job in full.",
        "read",
        "job",
        response=models.JobInFull,
    ),
    *(
        Endpoint(
            "POST",
            f"/jobs/{action}",
            f"{action}_jobs",
            f"{action.capitalize()} the jobs `ids`, or every job the filters match (in "
            "batches; `dry_run` counts them).",
            "admin",
            "act",
            body=JobAction,
            response=models.ActedOnIds | models.DryRun | models.ActedByFilter,
        )
        for action in bulk.ACTIONS
    ),
    Endpoint(
        "GET",
        "/workers",
        "list_workers",
        "Live workers, their jobs, and stopped ones.",
        "read",
        "workers",
        tag="workers",
        response=models.Workers,
    ),
    Endpoint(
        "GET",
        "/workflows/{workflow_id}",
        "show_workflow",
        "A workflow's jobs, each with the ids of the jobs it depends on.",
        "read",
        "workflow",
        tag="workflows",
        response=models.Workflow,
    ),
    Endpoint(
        "POST",
        "/workflows/{workflow_id}/cancel",
        "cancel_workflow",
        "Cancel every unfinished job of a workflow.",
        "admin",
        "cancel_workflow",
        tag="workflows",
        response=models.CancelledWorkflow,
    ),
    Endpoint(
        "GET",
        "/stats",
        "stats",
        "Jobs ended per queue over the last hour and day (rollup).",
        "read",
        "stats",
        tag="stats",
        response=models.Stats,
    ),
    Endpoint(
        "GET",
        "/doctor",
        "doctor",
        "Doctor's findings: each check's severity, figure and fix.",
        "read",
        "doctor",
        tag="doctor",
        response=models.DoctorFindings,
    ),
)


def jsonable(value: Any) -> Any:
    """Dataclasses, datetimes and tuples as JSON values."""
    if hasattr(value, "as_dict"):
        return jsonable(value.as_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return admin.jobs.jsonable(value)


def _refused(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class Api:
    """The API's handlers over the dashboard's engine, templates and cached queue counts
    (`queue_rows`: (rows, seconds since counted, ms); `forget_counts` after an action)."""

    def __init__(
        self,
        engine: Engine,
        tokens: dict[str, str],
        *,
        read_only: bool,
        templates: Environment,
        queue_rows: Callable[[], tuple[list[QueueRow], float, float]],
        forget_counts: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.tokens = tokens
        self.read_only = read_only
        self.templates = templates
        self.queue_rows = queue_rows
        self.forget_counts = forget_counts
        self.keys = IdempotencyKeys(engine)

    def routes(self) -> list[Route]:
        return [
            Route(
                PREFIX + e.path.replace("{job_id}", "{job_id:int}"),
                self._endpoint(e),
                methods=[e.method],
                name=f"api_{e.name}",
            )
            for e in ENDPOINTS
        ]

    # -- the request's way through --------------------------------------------------------------

    def _endpoint(self, endpoint: Endpoint) -> Callable[[Request], Any]:
        async def answer(request: Request) -> Response:
            try:
                return await self._answer(endpoint, request)
            except ApiRefusal as exc:
                return _refused(exc.status, str(exc))

        return answer

    def _caller(self, endpoint: Endpoint, request: Request) -> Caller | None:
        if endpoint.scope == "public":
            return None
        if not self.tokens:
            raise ApiRefusal(
                401,
                'no API token is configured: set SQLA_QUEUE_API_TOKENS="TOKEN:admin" (or '
                "TOKEN:read), or the dashboard's api_tokens option, and send "
                "'Authorization: Bearer TOKEN'",
            )
        caller = caller_of(self.tokens, request.headers.get("authorization"))
        if caller is None:
            raise ApiRefusal(401, "send a valid API token as 'Authorization: Bearer TOKEN'")
        if endpoint.scope == "admin":
            if not caller.admin:
                raise ApiRefusal(
                    403,
                    f"{endpoint.method} {PREFIX}{endpoint.path} needs an admin token; this "
                    "token's scope is read",
                )
            if self.read_only:
                raise ApiRefusal(403, "this dashboard is read-only (--read-only): no action")
        return caller

    async def _answer(self, endpoint: Endpoint, request: Request) -> Response:
        caller = self._caller(endpoint, request)
        if endpoint.call == "docs":
            return self.docs(request)
        body = await request.body()
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is None or endpoint.scope != "admin" or caller is None:
            return await self._run(endpoint, request, body)
        problem = check_key(key)
        if problem:
            raise ApiRefusal(400, problem)
        digest = request_digest(request.method, request.url.path, body)
        try:
            kept = await run_in_threadpool(self.keys.claim, caller, key, digest)
        except KeyInUse:
            raise ApiRefusal(
                409, "a request with this Idempotency-Key is being answered: retry later"
            ) from None
        except SchemaMissingError:
            raise ApiRefusal(
                503,
                "Idempotency-Key needs the schema at revision sqlaq_0025_api_idempotency or "
                "later: run 'sqla-queue migrate' (or send the action without the key)",
            ) from None
        if kept is not None:
            if kept.request != digest:
                raise ApiRefusal(
                    422,
                    "this Idempotency-Key was used for another request (method, path or "
                    "body differ): use a new key for a new request",
                )
            return Response(
                kept.body,
                status_code=kept.status,
                media_type="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
        try:
            response = await self._run(endpoint, request, body)
        except BaseException:
            await run_in_threadpool(self.keys.release, caller, key)
            raise
        if response.status_code >= 500:
            await run_in_threadpool(self.keys.release, caller, key)
        else:
            answer = Answer(response.status_code, bytes(response.body), digest)
            await run_in_threadpool(self.keys.keep, caller, key, answer)
        return response

    async def _run(self, endpoint: Endpoint, request: Request, body: bytes) -> JSONResponse:
        parsed = self._parse(endpoint, request, body)
        handler = getattr(self, endpoint.call)
        try:
            result = await run_in_threadpool(handler, request, parsed)
        except ApiRefusal as exc:
            return _refused(exc.status, str(exc))
        except UnknownQueueError as exc:
            return _refused(404, str(exc))
        except SqlaQueueError as exc:
            detail = exc.context.get("detail") if isinstance(exc, ConfigurationError) else None
            return _refused(400, str(detail or exc))
        return JSONResponse(jsonable(result))

    def _parse(self, endpoint: Endpoint, request: Request, body: bytes) -> BaseModel | None:
        try:
            if endpoint.query is not None:
                return endpoint.query.model_validate(_query_values(endpoint.query, request))
            if endpoint.body is not None:
                return endpoint.body.model_validate_json(body or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise ApiRefusal(400, f"{where}: {first['msg']}") from None
        return None

    # -- queues ----------------------------------------------------------------------------------

    def _queue_name(self, request: Request) -> str:
        name = str(request.path_params["name"])
        try:
            validate_name("queue name", name)
        except SqlaQueueError as exc:
            raise ApiRefusal(404, f"no such queue: {exc}") from None
        return name

    def _queues(self, name: str | None = None) -> list[dict[str, Any]]:
        rows, age, _ = self.queue_rows()
        with self.engine.begin() as conn:
            settings = {q.name: q for q in admin.list_queues(conn)}
            signal = {s.queue: s for s in admin.scaling_signal(conn, name)}
        found = []
        for row in rows:
            if name is not None and row.name != name:
                continue
            info = settings.get(row.name)
            found.append(
                {
                    "name": row.name,
                    "paused": row.paused,
                    "settings": info,
                    "counts": row.counts,
                    "estimated": sorted(row.estimated),
                    "capped": sorted(row.capped),
                    "counted_seconds_ago": round(age, 3),
                    "scaling": signal.get(row.name),
                }
            )
        return found

    def queues(self, request: Request, _: None) -> Any:
        return {"queues": self._queues()}

    def queue(self, request: Request, _: None) -> Any:
        name = self._queue_name(request)
        found = self._queues(name)
        if not found:
            raise ApiRefusal(404, f"no queue {name}: list them with GET {PREFIX}/queues")
        return found[0]

    def queue_scaling(self, request: Request, _: None) -> Any:
        name = self._queue_name(request)
        with self.engine.begin() as conn:
            found = admin.scaling_signal(conn, name)
        if not found:
            raise ApiRefusal(404, f"no queue {name}: list them with GET {PREFIX}/queues")
        return found[0]

    def _set_paused(self, request: Request, paused: bool) -> Any:
        name = self._queue_name(request)
        with self.engine.begin() as conn:
            admin.set_paused(conn, name, paused)
        self.forget_counts()
        return {"queue": name, "paused": paused}

    def pause(self, request: Request, _: None) -> Any:
        return self._set_paused(request, True)

    def resume(self, request: Request, _: None) -> Any:
        return self._set_paused(request, False)

    # -- jobs ------------------------------------------------------------------------------------

    def jobs(self, request: Request, search: JobSearch) -> Any:
        where = search.job_filter(value_as_text=True)
        with self.engine.begin() as conn:
            found = bulk.search_jobs(conn, where, limit=search.limit, before=search.before)
        more = len(found) == search.limit
        return {"jobs": found, "next_before": found[-1].id if more and found else None}

    def job(self, request: Request, _: None) -> Any:
        job_id = int(request.path_params["job_id"])
        try:
            check_job_id("job id", job_id)
        except SqlaQueueError as exc:
            raise ApiRefusal(404, f"no such job: {exc}") from None
        with self.engine.begin() as conn:
            job = admin.job_in_full(conn, job_id)
        if job is None:
            raise ApiRefusal(
                404,
                f"no job {job_id}: never enqueued, or deleted once finished (by its queue's "
                "retention, prune, or a delete)",
            )
        return job

    def act(self, request: Request, body: JobAction) -> Any:
        action = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        where = body.job_filter()
        if body.attempts is not None and action != "retry":
            raise ApiRefusal(400, f"attempts is retry's only: {action} takes none")
        if body.ids is not None:
            if not where.empty:
                raise ApiRefusal(400, "pass ids or filters, not both")
            if body.dry_run:
                raise ApiRefusal(400, "dry_run counts the jobs filters match: pass filters")
            return self._act_on_ids(action, body)
        if where.empty:
            raise ApiRefusal(400, f"set a filter or ids first: {action} on every job is refused")
        if body.dry_run:
            with self.engine.begin() as conn:
                count = bulk.count_matching(conn, where, action)
                sample = bulk.sample_matching(conn, where, action, SAMPLE) if count else []
            return {
                "action": action,
                "dry_run": True,
                "matched": count,
                "sample": sample,
                "filter": where.describe(),
            }
        extra = {"attempts": body.attempts} if action == "retry" else {}
        result = bulk.BULK_ACTIONS[action](self.engine, where, batch=body.batch, **extra)
        self.forget_counts()
        return {**dataclasses.asdict(result), "notice": result.notice, "filter": where.describe()}

    def _act_on_ids(self, action: str, body: JobAction) -> Any:
        ids = list(dict.fromkeys(body.ids or ()))
        for job_id in ids:
            try:
                check_job_id("job id", job_id)
            except SqlaQueueError as exc:
                raise ApiRefusal(400, str(exc)) from None
        skipped: dict[int, Any] = {}
        not_revived: dict[int, Any] = {}
        with self.engine.begin() as conn:
            if action == "retry":
                retried = admin.retry_jobs(conn, ids, attempts=body.attempts)
                done: dict[int, str] = dict(retried)
                skipped, not_revived = retried.skipped, retried.not_revived
            elif action == "cancel":
                done = admin.cancel_jobs(conn, ids)
            else:
                done = admin.delete_jobs(conn, ids)
        self.forget_counts()
        return {
            "action": action,
            "acted": len(done),
            "jobs": {str(k): v for k, v in done.items()},
            "held": {str(k): v.reason for k, v in skipped.items()},
            "not_revived": {str(k): v.reason for k, v in not_revived.items()},
            "left_alone": [i for i in ids if i not in done and i not in skipped],
        }

    # -- workers, workflows, stats, doctor ------------------------------------------------------

    def workers(self, request: Request, _: None) -> Any:
        with self.engine.begin() as conn:
            live = admin_workers.live_workers(conn)
            running = admin_workers.running_jobs(conn, [w.id for w in live])
            stopped = admin_workers.stopped_workers(conn)
        return {"live": live, "running": running, "stopped": stopped}

    def _workflow_id(self, request: Request) -> str:
        workflow_id = str(request.path_params["workflow_id"])
        try:
            return admin.jobs.checked_workflow_id(workflow_id)
        except SqlaQueueError as exc:
            raise ApiRefusal(404, f"no such workflow: {exc}") from None

    def workflow(self, request: Request, _: None) -> Any:
        workflow_id = self._workflow_id(request)
        with self.engine.begin() as conn:
            found = admin.workflow_jobs(conn, workflow_id)
        if not found:
            raise ApiRefusal(404, f"no job of workflow {workflow_id}")
        return {"workflow_id": workflow_id, "jobs": list(found), "truncated": found.truncated}

    def cancel_workflow(self, request: Request, _: None) -> Any:
        workflow_id = self._workflow_id(request)
        with self.engine.begin() as conn:
            cancelled = admin.cancel_workflow(conn, workflow_id)
        self.forget_counts()
        return {
            "workflow_id": workflow_id,
            "cancelled": len(cancelled),
            "jobs": {str(k): v for k, v in cancelled.items()},
        }

    def stats(self, request: Request, _: None) -> Any:
        with self.engine.begin() as conn:
            spans = {
                "hour": rollup.recent(conn, rollup.HOUR),
                "day": rollup.recent(conn, rollup.DAY),
            }
        found: dict[str, dict[str, Any]] = {}
        for span, series in spans.items():
            for queue, counts in series.items():
                found.setdefault(queue, {})[span] = {
                    name: counts.total(name)
                    for name in ("succeeded", "failed", "retried", "run_seconds")
                }
        return {"queues": found}

    def doctor(self, request: Request, _: None) -> Any:
        # no MultiXact sampling: an answer must not sleep for a second
        return {"findings": diagnose(self.engine, DoctorOptions(sample=0))}

    # -- the document ----------------------------------------------------------------------------

    def openapi(self, request: Request, _: None) -> Any:
        return openapi_document(request.scope.get("root_path", "").rstrip("/"))

    def docs(self, request: Request) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        page = self.templates.get_template("api.html").render(
            base=base,
            document=openapi_document(base),
            endpoints=ENDPOINTS,
            prefix=PREFIX,
            read_only=self.read_only,
            notice=None,
        )
        return HTMLResponse(page)


def _query_values(model: type[BaseModel], request: Request) -> dict[str, Any]:
    """A query string as a model's input: list fields from repeated keys, `args` as JSON."""
    values: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name not in request.query_params:
            continue
        if "list[" in str(info.annotation):
            values[name] = request.query_params.getlist(name)
        elif name == "args":
            try:
                values[name] = json.loads(request.query_params[name])
            except ValueError:
                raise ApiRefusal(400, 'args: must be a JSON object, e.g. {"user": 42}') from None
        else:
            values[name] = request.query_params[name]
    unknown = sorted(set(request.query_params) - set(model.model_fields))
    if unknown:
        raise ApiRefusal(400, f"unknown query parameter {unknown[0]}: see {PREFIX}/openapi.json")
    return values


SCHEMA_REF = "#/components/schemas/{model}"


def openapi_document(base: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 document of `ENDPOINTS`, served under `base` (the app's mount path)."""
    schemas: dict[str, Any] = {"ApiError": ApiError.model_json_schema(ref_template=SCHEMA_REF)}
    paths: dict[str, dict[str, Any]] = {}
    error = {
        "description": "Refused: one line naming the problem and the fix.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApiError"}}},
    }
    for e in ENDPOINTS:
        answer = _answer_schema(e.response, schemas) if e.response is not None else {}
        operation: dict[str, Any] = {
            "operationId": e.name,
            "summary": e.summary,
            "tags": [e.tag],
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {
                        ("text/html" if e.call == "docs" else "application/json"): {
                            "schema": {"type": "string"} if e.call == "docs" else answer
                        }
                    },
                },
            },
        }
        if e.scope == "public":
            operation["security"] = []
        else:
            operation["description"] = f"Needs a token of scope `{e.scope}`."
            operation["responses"].update({"401": error, "403": error})
        parameters: list[dict[str, Any]] = []
        for part in e.path.split("/"):
            if part.startswith("{"):
                name = part.strip("{}")
                kind = {"type": "integer", "minimum": 1} if name == "job_id" else {"type": "string"}
                parameters.append({"name": name, "in": "path", "required": True, "schema": kind})
                operation["responses"]["404"] = error
        if e.query is not None:
            schema = e.query.model_json_schema(ref_template=SCHEMA_REF)
            for name, prop in schema["properties"].items():
                parameter: dict[str, Any] = {
                    "name": name,
                    "in": "query",
                    "required": False,
                    "description": prop.get("description", ""),
                    "schema": {k: v for k, v in prop.items() if k not in ("description", "title")},
                }
                if name == "args":  # an object travels as JSON text
                    schema_of = parameter.pop("schema")
                    parameter["content"] = {"application/json": {"schema": schema_of}}
                parameters.append(parameter)
            schemas.update(schema.get("$defs", {}))
            operation["responses"]["400"] = error
        if e.body is not None:
            schema = e.body.model_json_schema(ref_template=SCHEMA_REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[e.body.__name__] = schema
            operation["requestBody"] = {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {"$ref": SCHEMA_REF.format(model=e.body.__name__)}
                    }
                },
            }
            operation["parameters"] = [
                {
                    "name": IDEMPOTENCY_HEADER,
                    "in": "header",
                    "required": False,
                    "description": "A retried request with the same key gets the first "
                    "answer and acts once, whichever dashboard process it reaches (kept in "
                    "the database for a day).",
                    "schema": {"type": "string", "maxLength": 255},
                }
            ]
            operation["responses"]["400"] = error
        if parameters:
            operation["parameters"] = parameters + operation.get("parameters", [])
        paths.setdefault(e.path, {})[e.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sqla-queue",
            "version": _version(),
            "description": "Queues, jobs, workers, workflows, stats and doctor's findings; "
            "bulk actions by filter in bounded batches. Tokens: SQLA_QUEUE_API_TOKENS.",
        },
        "servers": [{"url": f"{base}{PREFIX}"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _answer_schema(response: Any, schemas: dict[str, Any]) -> dict[str, Any]:
    """The schema of an answer's model (a reference to it, its own schema among `schemas`),
    or of a union of models (one of their references)."""
    schema = TypeAdapter(response).json_schema(ref_template=SCHEMA_REF, mode="serialization")
    schemas.update(schema.pop("$defs", {}))
    name = getattr(response, "__name__", None)
    if name is None:  # a union: anyOf its members' references
        return schema
    schemas[name] = schema
    return {"$ref": SCHEMA_REF.format(model=name)}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sqla-queue")
    except PackageNotFoundError:
        return "0"


__all__ = ["ENDPOINTS", "Api", "Endpoint", "openapi_document"]
