"""The HTTP API (`/api/`) through a real HTTP client on the dashboard's app over a real
database: tokens and scopes, every action refused to a read token and done for an admin one,
idempotency keys, bulk actions by filter, the OpenAPI document."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.dashboard_kit import client, make_failed, new_queue
from helpers.support import enqueue_jobs, jobs_by_id
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from sqla_queue import admin
from sqla_queue.cli.job_filters import FILTER_NAMES
from sqla_queue.dashboard.api import ENDPOINTS, PREFIX
from sqla_queue.dashboard.api_auth import (
    IdempotencyKeys,
    caller_of,
    parse_tokens,
    request_digest,
)

ADMIN = {"Authorization": "Bearer adm1n-token"}
READ = {"Authorization": "Bearer r3ad-token"}
TOKENS = "adm1n-token:admin,r3ad-token:read"


@pytest.fixture
def api(engine: Engine) -> TestClient:
    return client(engine, api_tokens=TOKENS)


def actions(engine: Engine) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every action of the API, with a request that would act."""
    new_queue(engine, "api_q")
    failed = make_failed(engine, 1)
    queued = enqueue_jobs(engine, "t", 2, queue="api_q", workflow_id="wf-api")
    return [
        ("POST", "/api/queues/api_q/pause", None),
        ("POST", "/api/queues/api_q/resume", None),
        ("POST", "/api/jobs/retry", {"ids": failed}),
        ("POST", "/api/jobs/cancel", {"ids": queued[:1]}),
        ("POST", "/api/jobs/delete", {"ids": failed}),
        ("POST", "/api/workflows/wf-api/cancel", None),
    ]


def test_every_action_is_refused_to_a_read_token_and_done_for_an_admin_one(
    engine: Engine, api: TestClient
) -> None:
    calls = actions(engine)
    # the table's every admin route is among them
    admin_routes = {(e.method, e.path) for e in ENDPOINTS if e.scope == "admin"}
    called = {(m, p.replace("/api", "", 1)) for m, p, _ in calls}
    templated = {
        (m, p.replace("api_q", "{name}").replace("wf-api", "{workflow_id}")) for m, p in called
    }
    assert templated == admin_routes
    before = {job.id: job.status for job in jobs_by_id(engine).values()}
    for method, path, body in calls:
        refused = api.request(method, path, json=body, headers=READ)
        assert refused.status_code == 403, path
        route = path.replace("api_q", "{name}").replace("wf-api", "{workflow_id}")
        assert refused.json() == {
            "error": f"{method} {route} needs an admin token; this token's scope is read"
        }
    assert {job.id: job.status for job in jobs_by_id(engine).values()} == before
    with engine.begin() as conn:
        assert not next(q for q in admin.list_queues(conn) if q.name == "api_q").paused
    answers = {}
    for method, path, body in calls:
        done = api.request(method, path, json=body, headers=ADMIN)
        assert done.status_code == 200, (path, done.text)
        answers[path] = done.json()
    assert answers["/api/queues/api_q/pause"] == {"queue": "api_q", "paused": True}
    assert answers["/api/jobs/retry"]["acted"] == 1
    assert answers["/api/jobs/cancel"]["acted"] == 1
    assert answers["/api/jobs/delete"]["acted"] == 1  # the retried job, queued again
    assert answers["/api/workflows/wf-api/cancel"]["cancelled"] == 1  # the other one
    assert {job.status for job in jobs_by_id(engine).values()} == {"cancelled"}


def test_no_token_or_a_wrong_one_is_401_on_every_route_but_the_document(
    engine: Engine, api: TestClient
) -> None:
    for e in ENDPOINTS:
        path = PREFIX + e.path.format(name="q", job_id=1, workflow_id="w")
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic eDp5"}):
            answer = api.request(e.method, path, headers=headers, json={})
            if e.scope == "public":
                assert answer.status_code == 200, path
            else:
                assert answer.status_code == 401, path
                assert "Authorization: Bearer TOKEN" in answer.json()["error"]


def test_without_configured_tokens_the_api_says_how_to_configure_one(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SQLA_QUEUE_API_TOKENS", raising=False)
    answer = client(engine).get("/api/queues", headers=READ)
    assert answer.status_code == 401
    assert "SQLA_QUEUE_API_TOKENS" in answer.json()["error"]


def test_tokens_come_from_the_environment(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SQLA_QUEUE_API_TOKENS", "envtok:read")
    api = client(engine)
    assert api.get("/api/queues", headers={"Authorization": "Bearer envtok"}).status_code == 200
    assert (
        api.post(
            "/api/jobs/retry", json={"ids": [1]}, headers={"Authorization": "Bearer envtok"}
        ).status_code
        == 403
    )


def test_a_bad_token_configuration_names_the_entry_and_the_fix(engine: Engine) -> None:
    from sqla_queue.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="scope of read or admin"):
        client(engine, api_tokens="tok:write")


def test_an_idempotency_key_answers_a_retried_request_with_the_first_answer(
    engine: Engine, api: TestClient
) -> None:
    failed = make_failed(engine, 2)
    headers = {**ADMIN, "Idempotency-Key": "retry-1"}
    first = api.post("/api/jobs/retry", json={"status": ["failed"]}, headers=headers)
    assert first.status_code == 200
    assert first.json()["acted"] == 2
    # the jobs fail again: a second retry would act again, the replay must not
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'failed', finished_at = now() "
                "WHERE id = ANY(:ids)"
            ),
            {"ids": failed},
        )
    again = api.post("/api/jobs/retry", json={"status": ["failed"]}, headers=headers)
    assert again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert {job.status for job in jobs_by_id(engine, failed).values()} == {"failed"}
    # the same key for another request is refused; a new key acts
    other = api.post("/api/jobs/retry", json={"status": ["cancelled"]}, headers=headers)
    assert other.status_code == 422
    fresh = api.post(
        "/api/jobs/retry", json={"status": ["failed"]}, headers={**ADMIN, "Idempotency-Key": "2"}
    )
    assert fresh.json()["acted"] == 2


def test_a_retried_request_to_another_dashboard_process_replays_the_first_answer(
    engine: Engine,
) -> None:
    # two app instances on one database: two processes of a fleet behind a load balancer
    first_process, second_process = (
        client(engine, api_tokens=TOKENS),
        client(engine, api_tokens=TOKENS),
    )
    failed = make_failed(engine, 2)
    headers = {**ADMIN, "Idempotency-Key": "fleet-1"}
    first = first_process.post("/api/jobs/retry", json={"status": ["failed"]}, headers=headers)
    assert first.json()["acted"] == 2
    with engine.begin() as conn:  # failed again: a retry that acted would take them
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'failed' WHERE id = ANY(:ids)"),
            {"ids": failed},
        )
    again = second_process.post("/api/jobs/retry", json={"status": ["failed"]}, headers=headers)
    assert again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert {job.status for job in jobs_by_id(engine, failed).values()} == {"failed"}
    other = second_process.post("/api/jobs/retry", json={"status": ["queued"]}, headers=headers)
    assert other.status_code == 422


def test_a_key_being_answered_by_one_process_is_refused_by_another_until_it_expires(
    engine: Engine, api: TestClient
) -> None:
    make_failed(engine, 1)
    body = {"status": ["failed"]}
    headers = {**ADMIN, "Idempotency-Key": "in-flight"}
    caller = caller_of(parse_tokens(TOKENS), ADMIN["Authorization"])
    assert caller is not None
    # another process took the key and is answering it (its reservation, held open)
    digest = request_digest("POST", "/api/jobs/retry", json.dumps(body).encode())
    assert IdempotencyKeys(engine).claim(caller, "in-flight", digest) is None
    busy = api.post("/api/jobs/retry", json=body, headers=headers)
    assert busy.status_code == 409
    assert busy.json()["error"].startswith("a request with this Idempotency-Key is being answered")
    # that process died: once its reservation expires, the key is taken and acts once
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.api_idempotency SET expires_at = now() - interval '1 s'")
        )
    taken = api.post("/api/jobs/retry", json=body, headers=headers)
    assert taken.status_code == 200
    assert taken.json()["acted"] == 1


def test_expired_keys_are_deleted_as_new_keys_are_taken(engine: Engine, api: TestClient) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.api_idempotency (caller, key, request, status, body, "
                "expires_at) SELECT 'c', 'old-' || i, 'r', 200, '{}', now() - interval '1 h' "
                "FROM generate_series(1, 150) i"
            )
        )
    new_queue(engine, "keys_q")
    for n in range(2):
        answer = api.post(
            "/api/queues/keys_q/pause", headers={**ADMIN, "Idempotency-Key": f"new-{n}"}
        )
        assert answer.status_code == 200
    with engine.begin() as conn:
        left = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE key LIKE 'old-%'), count(*) "
                "FROM sqla_queue.api_idempotency"
            )
        ).one()
    assert tuple(left) == (0, 2)  # 100 deleted with each key taken; the new ones kept


def test_an_idempotency_key_on_a_schema_without_its_table_is_refused_naming_migrate(
    engine: Engine, api: TestClient
) -> None:
    # an app mounted by code newer than the database (the CLI's dashboard checks the schema)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE sqla_queue.api_idempotency"))
    new_queue(engine, "old_schema_q")
    keyed = api.post("/api/queues/old_schema_q/pause", headers={**ADMIN, "Idempotency-Key": "k"})
    assert keyed.status_code == 503
    assert "run 'sqla-queue migrate'" in keyed.json()["error"]
    with engine.begin() as conn:
        assert not next(q for q in admin.list_queues(conn) if q.name == "old_schema_q").paused
    assert api.post("/api/queues/old_schema_q/pause", headers=ADMIN).status_code == 200


def test_bulk_actions_take_every_filter_of_the_cli_in_batches(
    engine: Engine, api: TestClient
) -> None:
    keep = make_failed(engine, 2, message="kept", user=1)
    take = make_failed(engine, 3, message="smtp down", user=2)
    dry = api.post("/api/jobs/retry", json={"error": "smtp", "dry_run": True}, headers=ADMIN).json()
    assert dry["matched"] == 3
    assert [job["id"] for job in dry["sample"]] == take
    assert {job.status for job in jobs_by_id(engine).values()} == {"failed"}
    done = api.post(
        "/api/jobs/retry",
        json={"args_path": "user", "args_value": 2, "status": ["failed"], "batch": 1},
        headers=ADMIN,
    ).json()
    assert done["acted"] == 3
    assert done["batches"] == 3
    statuses = {job.id: job.status for job in jobs_by_id(engine).values()}
    assert {statuses[i] for i in take} == {"queued"}
    assert {statuses[i] for i in keep} == {"failed"}


def test_an_action_on_every_job_and_a_bad_filter_are_refused_with_one_line(
    engine: Engine, api: TestClient
) -> None:
    make_failed(engine, 1)
    every = api.post("/api/jobs/delete", json={}, headers=ADMIN)
    assert every.status_code == 400
    assert every.json() == {"error": "set a filter or ids first: delete on every job is refused"}
    assert len(jobs_by_id(engine)) == 1
    bad = api.post("/api/jobs/cancel", json={"status": ["nope"]}, headers=ADMIN)
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("status.0:")
    both = api.post("/api/jobs/cancel", json={"ids": [1], "queue": "x"}, headers=ADMIN)
    assert both.json() == {"error": "pass ids or filters, not both"}
    unknown = api.get("/api/jobs?colour=red", headers=READ)
    assert unknown.status_code == 400
    assert "unknown query parameter colour" in unknown.json()["error"]
    late = api.get(
        "/api/jobs",
        params={
            "created_after": "2026-01-02T00:00:00+00:00",
            "created_before": "2026-01-01T00:00:00+00:00",
        },
        headers=READ,
    )
    assert late.status_code == 400
    assert "must be earlier than created_before" in late.json()["error"]


def test_reads_answer_json(engine: Engine, api: TestClient) -> None:
    new_queue(engine, "api_r")
    ids = enqueue_jobs(engine, "t", 3, queue="api_r", tags=["a"])
    listed = api.get("/api/jobs", params={"queue": "api_r", "tag": "a", "limit": 2}, headers=READ)
    assert [j["id"] for j in listed.json()["jobs"]] == sorted(ids, reverse=True)[:2]
    nxt = listed.json()["next_before"]
    rest = api.get("/api/jobs", params={"queue": "api_r", "before": nxt}, headers=READ).json()
    assert [j["id"] for j in rest["jobs"]] == [min(ids)]
    job = api.get(f"/api/jobs/{ids[0]}", headers=READ).json()
    assert job["id"] == ids[0]
    assert job["queue"] == "api_r"
    assert api.get("/api/jobs/999999999", headers=READ).status_code == 404
    queues = api.get("/api/queues", headers=READ).json()["queues"]
    mine = next(q for q in queues if q["name"] == "api_r")
    assert mine["counts"]["queued"] == 3
    assert mine["scaling"]["ready"] == 3
    assert mine["settings"]["retention"] == "delete"
    one = api.get("/api/queues/api_r", headers=READ).json()
    assert one["name"] == "api_r"
    scaling = api.get("/api/queues/api_r/scaling", headers=READ).json()
    assert scaling["ready"] == 3
    assert scaling["workers"] == 0
    assert api.get("/api/queues/nope/scaling", headers=READ).status_code == 404
    assert api.post("/api/queues/nope/pause", headers=ADMIN).status_code == 404
    assert set(api.get("/api/workers", headers=READ).json()) == {"live", "running", "stopped"}
    assert "queues" in api.get("/api/stats", headers=READ).json()
    findings = api.get("/api/doctor", headers=READ).json()["findings"]
    assert {"name", "severity", "value", "fix"} <= set(findings[0])
    assert api.get("/api/workflows/none-such", headers=READ).status_code == 404


def test_a_read_only_dashboard_refuses_actions_even_to_an_admin_token(engine: Engine) -> None:
    api = client(engine, api_tokens=TOKENS, read_only=True)
    answer = api.post("/api/jobs/retry", json={"ids": [1]}, headers=ADMIN)
    assert answer.status_code == 403
    assert "read-only" in answer.json()["error"]


def test_the_api_needs_no_csrf_and_sets_no_cookie_and_ignores_the_dashboards_auth(
    engine: Engine,
) -> None:
    api = client(engine, api_tokens=TOKENS, auth="user:password")
    answer = api.post("/api/queues/default/pause", headers=ADMIN)
    assert answer.status_code in (200, 404)
    assert "set-cookie" not in answer.headers
    # the pages still ask for the dashboard's own credentials
    assert api.get("/", headers=ADMIN).status_code == 401


def test_the_openapi_document_is_valid_and_lists_every_route(api: TestClient) -> None:
    validator = pytest.importorskip("openapi_spec_validator")
    document = api.get("/api/openapi.json").json()
    validator.validate(document)
    listed = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert listed == {(e.method, e.path) for e in ENDPOINTS}
    routes = {
        (method, route.path.replace(":int", "").removeprefix(PREFIX))
        for route in api.app.routes  # type: ignore[attr-defined]
        if getattr(route, "path", "").startswith(PREFIX + "/")
        for method in (route.methods or ()) - {"HEAD"}
    }
    assert routes == listed
    search = document["paths"]["/jobs"]["get"]["parameters"]
    # every filter of `sqla-queue jobs list` is a parameter (named as in a JobFilter)
    renamed = {"statuses": "status", "tags": "tag", "args_json": "args"}
    cli_filters = {renamed.get(name, name) for name in FILTER_NAMES}
    assert {p["name"] for p in search} == cli_filters | {"limit", "before"}
    assert document["servers"] == [{"url": "/api"}]
    # the signal's fields are in the document, as KEDA's valueLocation names them
    scaling = document["components"]["schemas"]["QueueScaling"]["properties"]
    assert {"ready", "oldest_ready_age", "free_slots", "arrival_rate"} <= set(scaling)


def answer_validator(document: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A JSON Schema validator of `schema` (a route's answer) with the document's components."""
    from jsonschema import Draft202012Validator

    root = {**schema, "components": document["components"]}
    Draft202012Validator.check_schema(root)
    return Draft202012Validator(root)


def route_matches(template: tuple[str, str], method: str, path: str) -> bool:
    """Whether `method path` (under /api, a query string aside) is the route `template`."""
    parts = path.split("?")[0].removeprefix(PREFIX).split("/")
    wanted = template[1].split("/")
    return (
        template[0] == method
        and len(parts) == len(wanted)
        and all(w.startswith("{") or w == p for w, p in zip(wanted, parts, strict=True))
    )


def test_every_routes_answer_has_a_schema_and_real_answers_validate_against_it(
    engine: Engine, api: TestClient
) -> None:
    document = api.get("/api/openapi.json").json()
    answers: dict[tuple[str, str], dict[str, Any]] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            content = operation["responses"]["200"]["content"]
            if "text/html" in content:  # the document as a page
                continue
            schema = content["application/json"]["schema"]
            refs = [schema] if "$ref" in schema else schema.get("anyOf", [])
            assert refs, path
            assert all(r["$ref"].startswith("#/components/schemas/") for r in refs), path
            answers[(method.upper(), path)] = schema
    # every route, called for real on a database with a queue, a worker, jobs and a rollup
    calls = actions(engine)
    failed = make_failed(engine, 2)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.workers (id, hostname, pid, queues, concurrency, "
                "expires_at) VALUES ('w-api', 'h', 1, ARRAY['api_q'], 2, "
                "now() + interval '1 minute')"
            )
        )
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'running', attempts = 1, locked_by = 'w-api', "
                "locked_at = now(), started_at = now(), heartbeat_at = now(), "
                "lease_expires_at = now() + interval '1 minute' WHERE id = :id"
            ),
            {"id": enqueue_jobs(engine, "t", 1, queue="api_q")[0]},
        )
        conn.execute(
            text(
                "INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed) "
                "VALUES (date_trunc('minute', now()) - interval '2 minutes', 'api_q', 't', 3, 1)"
            )
        )
    calls += [
        ("GET", "/api/openapi.json", None),
        ("GET", "/api/queues", None),
        ("GET", "/api/queues/api_q", None),
        ("GET", "/api/queues/api_q/scaling", None),
        ("GET", "/api/jobs?limit=2", None),
        ("GET", f"/api/jobs/{failed[0]}", None),
        ("POST", "/api/jobs/retry", {"status": ["failed"], "dry_run": True}),
        ("POST", "/api/jobs/cancel", {"queue": "api_q", "status": ["queued"]}),
        ("GET", "/api/workers", None),
        ("GET", "/api/workflows/wf-api", None),
        ("GET", "/api/stats", None),
        ("GET", "/api/doctor", None),
    ]
    called = set()
    for method, path, body in calls:
        answer = api.request(method, path, json=body, headers=ADMIN)
        assert answer.status_code == 200, (path, answer.text)
        template = next(t for t in answers if route_matches(t, method, path))
        called.add(template)
        errors = list(answer_validator(document, answers[template]).iter_errors(answer.json()))
        assert not errors, (path, [e.message for e in errors[:3]])
    assert called == set(answers)


def test_mounted_under_a_prefix_the_document_names_it(engine: Engine) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from sqla_queue.dashboard import create_app

    outer = Starlette(routes=[Mount("/queue", app=create_app(engine, api_tokens=TOKENS))])
    http = TestClient(outer)
    assert http.get("/queue/api/openapi.json").json()["servers"] == [{"url": "/queue/api"}]
    assert http.get("/queue/api/queues", headers=READ).status_code == 200
    assert http.get("/queue/api/queues").status_code == 401


def test_mounted_in_flask_the_api_answers_under_the_prefix(engine: Engine) -> None:
    from flask import Flask
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from sqla_queue.dashboard import wsgi_app

    (job_id,) = make_failed(engine)
    flask_app = Flask(__name__)
    flask_app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        flask_app.wsgi_app, {"/queue": wsgi_app(engine, api_tokens=TOKENS)}
    )
    web = flask_app.test_client()
    assert web.get("/queue/api/openapi.json").get_json()["servers"] == [{"url": "/queue/api"}]
    assert web.get(f"/queue/api/jobs/{job_id}").status_code == 401
    shown = web.get(f"/queue/api/jobs/{job_id}", headers=READ).get_json()
    assert shown["status"] == "failed"
    done = web.post("/queue/api/jobs/delete", json={"ids": [job_id]}, headers=ADMIN)
    assert done.get_json()["acted"] == 1
    assert jobs_by_id(engine) == {}
