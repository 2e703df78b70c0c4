"""The HTTP API where it meets other features: its bulk actions on timed-out, snoozed,
kept-result and routed jobs (ctx.session() jobs: test_features_meet's
`test_bulk_retry_reruns_a_job_whose_session_rolled_back[api]`), each through a real HTTP client."""

from __future__ import annotations

import time

import pytest
from helpers.dashboard_kit import api_action
from helpers.support import jobs_by_id
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from sqla_queue import Registry, RetryPolicy, Snooze, admin, enqueue, wait_for
from sqla_queue.dashboard import create_app
from sqla_queue.errors import ResultMissingError
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig

ADMIN = {"Authorization": "Bearer meets"}
LATER = RetryPolicy(base=3600, jitter=0)


def api(engine: Engine) -> TestClient:
    return TestClient(create_app(engine, api_tokens="meets:admin"))


ONE_AT_A_TIME = WorkerConfig(concurrency=1, batch=1, poll_only=True)


def test_a_retry_by_error_through_the_api_finds_the_timed_out_jobs(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="slow", timeout=0.2, retry=LATER)
    def slow() -> None:
        time.sleep(0.8)

    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "slow", {}, max_attempts=1, flush=True).id
    run_until_empty(engine, registry, ONE_AT_A_TIME)
    assert jobs_by_id(engine)[job_id].status == "failed"
    dry = api_action(engine, "retry", error="JobTimeoutError", dry_run=True)
    assert [job["id"] for job in dry["sample"]] == [job_id]
    assert api_action(engine, "retry", error="JobTimeoutError")["acted"] == 1
    assert jobs_by_id(engine)[job_id].status == "queued"


def test_a_cancel_by_filter_through_the_api_takes_a_snoozed_job(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="later")(lambda: (_ for _ in ()).throw(Snooze(3600)))
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "later", {}, flush=True).id
    run_until_empty(engine, registry, ONE_AT_A_TIME)
    assert jobs_by_id(engine)[job_id].status == "queued"
    assert api_action(engine, "cancel", task="later")["acted"] == 1
    assert jobs_by_id(engine)[job_id].status == "cancelled"


def test_a_delete_through_the_api_takes_a_kept_result_and_wait_for_says_so(
    engine: Engine,
) -> None:
    registry = Registry()
    registry.task(name="kept", keep_result=True)(lambda: {"ok": 1})
    with engine.begin() as conn:
        admin.create_queue(conn, "kept_q", retention="keep")
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "kept", {}, queue="kept_q", flush=True).id
    run_until_empty(engine, registry, ONE_AT_A_TIME)
    assert wait_for(engine, job_id, timeout=0) == {"ok": 1}
    shown = api(engine).get(f"/api/jobs/{job_id}", headers=ADMIN).json()
    assert shown["result"] == {"ok": 1}
    assert api_action(engine, "delete", task="kept", status=["done"])["acted"] == 1
    with pytest.raises(ResultMissingError):
        wait_for(engine, job_id, timeout=0)


def test_a_cancel_through_the_api_takes_a_routed_queues_jobs_still_in_the_table(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "routed_q")
        admin.set_route(conn, "routed_q", "nats:jobs.meets")
    with Session(engine) as session, session.begin():
        by_id = enqueue(session, "t", {}, queue="routed_q", flush=True).id
        by_filter = enqueue(session, "u", {}, queue="routed_q", flush=True).id
    assert api_action(engine, "cancel", ids=[by_id, 10**9])["jobs"] == {str(by_id): "queued"}
    assert api_action(engine, "cancel", queue="routed_q", task="u")["acted"] == 1
    assert {j.id: j.status for j in jobs_by_id(engine).values()} == {
        by_id: "cancelled",
        by_filter: "cancelled",
    }
    queues = api(engine).get("/api/queues", headers=ADMIN).json()["queues"]
    routed = next(q for q in queues if q["name"] == "routed_q")
    assert routed["settings"]["route"] == "nats:jobs.meets"
