"""Where the HTTP API meets durable execution (issue 36 beside issue 38): a waiting job is
found and cancelled by its signal key, a sleeping job cancelled by id never runs again, and
a failed job with recorded steps retried through the API replays them."""

from __future__ import annotations

from datetime import timedelta

from helpers.dashboard_kit import api_action, client
from helpers.support import end_sleeps, enqueue_jobs, statuses
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import JobContext, Registry
from sqla_queue.testing import drain

ADMIN = {"Authorization": "Bearer adm1n-token"}


def test_a_job_waiting_for_a_signal_is_cancelled_by_its_key_through_the_api(
    engine: Engine,
) -> None:
    registry = Registry()

    @registry.task(name="waiter", pass_context=True)
    def waiter(ctx: JobContext) -> None:
        ctx.wait_for_signal("order:9", timeout=timedelta(days=1))

    (job_id, other) = enqueue_jobs(engine, "waiter", 2)
    assert drain(engine, registry).waiting == 2
    listed = client(engine, api_tokens="adm1n-token:admin").get(
        "/api/jobs", params={"waiting_for": "order:9"}, headers=ADMIN
    )
    assert listed.status_code == 200, listed.text
    assert sorted(j["id"] for j in listed.json()["jobs"]) == [job_id, other]
    assert api_action(engine, "cancel", ids=[job_id])["jobs"] == {str(job_id): "waiting"}
    assert api_action(engine, "cancel", waiting_for="order:9")["acted"] == 1
    assert statuses(engine, [job_id, other]) == {job_id: "cancelled", other: "cancelled"}
    with Session(engine) as session, session.begin():
        assert sqla_queue.signal(session, "order:9", wake="all") == 0  # nobody left to wake


def test_a_sleeping_job_cancelled_through_the_api_never_runs_again(engine: Engine) -> None:
    runs: list[int] = []
    registry = Registry()

    @registry.task(name="sleeper", pass_context=True)
    def sleeper(ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        ctx.sleep(timedelta(hours=1))

    (job_id,) = enqueue_jobs(engine, "sleeper", 1)
    assert drain(engine, registry).snoozed == 1
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    assert api_action(engine, "cancel", ids=[job_id])["jobs"] == {str(job_id): "waiting"}
    end_sleeps(engine)
    drain(engine, registry, include_scheduled=True)
    assert runs == [job_id]
    assert statuses(engine, [job_id]) == {job_id: "cancelled"}


def test_a_failed_job_retried_through_the_api_replays_its_recorded_steps(engine: Engine) -> None:
    charged: list[int] = []
    registry = Registry()

    @registry.task(name="charge", pass_context=True, max_attempts=1)
    def charge(ctx: JobContext) -> None:
        ctx.step("charge", charged.append, ctx.job_id)
        if ctx.attempt == 1:
            raise RuntimeError("the receipt could not be sent")

    (job_id,) = enqueue_jobs(engine, "charge", 1)
    assert drain(engine, registry).failed == 1
    assert api_action(engine, "retry", task="charge", status=["failed"])["acted"] == 1
    assert drain(engine, registry).succeeded == 1
    assert charged == [job_id]  # the step ran once, its record replayed by the retry
