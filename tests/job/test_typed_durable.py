"""Where typed tasks and start deadlines meet durable execution and the HTTP API (issues
36, 37, 38): the handler's typed values are rebuilt for every run a step, a sleep or a
signal starts; a start deadline is for the first start only, so a job that slept or waited
past it runs to its end; the API shows a job's deadline and retries a typed job."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from helpers.dashboard_kit import client
from helpers.support import end_sleeps, make_due, statuses
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import JobContext, Registry, RetryPolicy
from sqla_queue.testing import drain

WHEN = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone.utc)
NO_WAIT = RetryPolicy(base=0.0, jitter=0.0)
ADMIN = {"Authorization": "Bearer adm1n-token"}


@dataclasses.dataclass
class Order:
    id: int
    total: str


def past_deadlines(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET expires_at = now() - interval '1 s'"))


def wake_sleepers(engine: Engine) -> None:
    end_sleeps(engine)
    make_due(engine)


def test_typed_values_are_rebuilt_for_a_retry_that_replays_its_steps(engine: Engine) -> None:
    seen: list[tuple[type, type]] = []
    charged: list[int] = []
    registry = Registry()

    @registry.task(name="charge", pass_context=True, retry=NO_WAIT, max_attempts=3)
    def charge(ctx: JobContext, order: Order, when: dt.datetime) -> None:
        seen.append((type(order), type(when)))
        ctx.step("charge", charged.append, order.id)
        if ctx.attempt == 1:
            raise RuntimeError("the receipt failed")

    with Session(engine) as session, session.begin():
        job = charge.defer(session, Order(7, "9.90"), WHEN)
        session.flush()
        job_id = job.id
    drain(engine, registry, include_scheduled=True)
    assert seen == [(Order, dt.datetime), (Order, dt.datetime)]
    assert charged == [7]
    assert statuses(engine, [job_id]) == {}


def test_typed_values_are_rebuilt_after_a_sleep_and_after_a_signal(engine: Engine) -> None:
    seen: list[Any] = []
    registry = Registry()

    @registry.task(name="remind", pass_context=True)
    def remind(ctx: JobContext, order: Order, when: dt.datetime) -> None:
        seen.append((order, when))
        ctx.sleep(dt.timedelta(hours=1), name="cool-off")
        ctx.wait_for_signal(f"paid:{order.id}", timeout=dt.timedelta(days=1))

    with Session(engine) as session, session.begin():
        job = remind.defer(session, order=Order(8, "1.00"), when=WHEN)
        session.flush()
        job_id = job.id
    drain(engine, registry)  # sleeps
    wake_sleepers(engine)
    assert drain(engine, registry, include_scheduled=True).waiting == 1
    with Session(engine) as session, session.begin():
        assert sqla_queue.signal(session, "paid:8") == 1
    drain(engine, registry)
    assert seen == [(Order(8, "1.00"), WHEN)] * 3
    assert statuses(engine, [job_id]) == {}


def test_a_job_that_slept_or_waited_past_its_start_deadline_runs_to_its_end(
    engine: Engine,
) -> None:
    ends: list[str] = []
    registry = Registry()

    @registry.task(name="slow", pass_context=True)
    def slow(ctx: JobContext, kind: str) -> None:
        ctx.step("first", lambda: None)
        if kind == "sleep":
            ctx.sleep(dt.timedelta(hours=1))
        else:
            ctx.wait_for_signal("go", timeout=dt.timedelta(days=1))
        ends.append(kind)

    with Session(engine) as session, session.begin():
        jobs = [slow.using(expires_in=3600).defer(session, kind=k) for k in ("sleep", "wait")]
        session.flush()
        sleeper, waiter = (j.id for j in jobs)
    drain(engine, registry)
    assert statuses(engine, [sleeper, waiter]) == {sleeper: "waiting", waiter: "waiting"}
    past_deadlines(engine)  # both started before their deadline, which now passes
    wake_sleepers(engine)
    with Session(engine) as session, session.begin():
        assert sqla_queue.signal(session, "go") == 1
    drain(engine, registry, include_scheduled=True)
    assert sorted(ends) == ["sleep", "wait"]
    assert statuses(engine, [sleeper, waiter]) == {}


def test_the_api_shows_a_jobs_deadline_and_retries_a_typed_job(engine: Engine) -> None:
    seen: list[Any] = []
    registry = Registry()

    @registry.task(name="typed_api", max_attempts=1)
    def typed_api(order: Order, when: dt.datetime) -> None:
        seen.append((order, when))
        if len(seen) == 1:
            raise RuntimeError("once")

    with Session(engine) as session, session.begin():
        job = typed_api.using(expires_in=3600).defer(session, Order(3, "2.00"), WHEN)
        session.flush()
        job_id = job.id
    api = client(engine, api_tokens="adm1n-token:admin")
    shown = api.get(f"/api/jobs/{job_id}", headers=ADMIN).json()
    assert shown["expires_at"] is not None
    assert shown["args"]["order"] == {"id": 3, "total": "2.00"}
    assert dt.datetime.fromisoformat(shown["args"]["when"]) == WHEN
    assert drain(engine, registry).failed == 1
    answer = api.post("/api/jobs/retry", json={"ids": [job_id]}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    assert drain(engine, registry).succeeded == 1
    assert seen == [(Order(3, "2.00"), WHEN)] * 2
