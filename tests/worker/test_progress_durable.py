"""Where progress and per-job log lines meet durable execution, typed tasks and the HTTP API
(issues 36, 37, 38): a sleeping or waiting job shows the progress it reported before it
parked, a retry that replays its steps reports its own, a typed handler reports like any
other, and the API's job view carries progress, log lines, steps and waits; a handler given an
ORM row reports like any other, and a job whose row is gone reports nothing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from helpers.dashboard_kit import API_ADMIN, client
from helpers.row_models import Order, make_shop, order_of
from helpers.support import end_sleeps, keep_jobs, make_due, signal_now, statuses
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Registry, RetryPolicy, admin
from sqla_queue.admin import JobJournalView
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig

BURST = WorkerConfig(concurrency=1, batch=1, poll_only=True)
log = logging.getLogger("shop.durable")
log.setLevel(logging.INFO)  # the handler's INFO lines are kept (a logger's level lets them)


def journal(engine: Engine, job_id: int) -> JobJournalView:
    with engine.connect() as conn:
        return admin.job_journal(conn, job_id)


def lines(view: JobJournalView, attempt: int) -> list[str]:
    return [str(x["message"]) for rec in view.logs if rec.attempt == attempt for x in rec.lines]


@dataclasses.dataclass
class Batch:
    size: int


def test_a_sleeping_or_waiting_job_shows_the_progress_it_reported_before_it_parked(
    engine: Engine,
) -> None:
    registry = Registry()

    @registry.task(name="parks", pass_context=True)
    def parks(ctx: JobContext, how: str) -> None:
        ctx.progress(0.5, f"half way, then {how}")
        log.info("before the %s", how)
        if how == "sleep":
            ctx.sleep(dt.timedelta(hours=1))
        else:
            ctx.wait_for_signal(f"go:{ctx.job_id}", timeout=dt.timedelta(days=1))
        ctx.progress(1.0, "done")

    with Session(engine) as session, session.begin():
        jobs = [parks.defer(session, how=h) for h in ("sleep", "wait")]
        session.flush()
        sleeper, waiter = (j.id for j in jobs)
    keep_jobs(engine)
    run_until_empty(engine, registry, BURST)
    assert statuses(engine, [sleeper, waiter]) == {sleeper: "waiting", waiter: "waiting"}
    for job_id, how in ((sleeper, "sleep"), (waiter, "wait")):
        view = journal(engine, job_id)
        assert view.progress is not None
        assert (view.progress.fraction, view.progress.message) == (0.5, f"half way, then {how}")
        assert lines(view, 1) == [f"before the {how}"]
    end_sleeps(engine)
    make_due(engine)
    assert signal_now(engine, f"go:{waiter}") == 1
    run_until_empty(engine, registry, BURST)
    for job_id in (sleeper, waiter):
        view = journal(engine, job_id)
        assert view.progress is not None
        assert (view.progress.fraction, view.progress.attempt) == (1.0, 2)


def test_a_retry_that_replays_its_steps_reports_its_own_progress_and_lines(
    engine: Engine,
) -> None:
    charged: list[int] = []
    registry = Registry()

    @registry.task(name="charge", pass_context=True, retry=RetryPolicy(base=0, jitter=0))
    def charge(ctx: JobContext, batch: Batch) -> None:
        ctx.step("charge", charged.append, batch.size)
        ctx.progress(ctx.attempt / 2, f"attempt {ctx.attempt}")
        log.info("attempt %s of a batch of %s", ctx.attempt, batch.size)
        if ctx.attempt == 1:
            raise RuntimeError("the receipt failed")

    with Session(engine) as session, session.begin():
        job = charge.defer(session, Batch(3))
        session.flush()
        job_id = job.id
    keep_jobs(engine)
    run_until_empty(engine, registry, BURST)
    make_due(engine)
    run_until_empty(engine, registry, BURST)
    assert charged == [3]
    view = journal(engine, job_id)
    assert view.progress is not None
    assert (view.progress.fraction, view.progress.attempt) == (1.0, 2)
    assert lines(view, 1) == ["attempt 1 of a batch of 3"]
    assert lines(view, 2) == ["attempt 2 of a batch of 3"]


def test_the_apis_job_view_carries_progress_lines_steps_and_waits(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="shown", pass_context=True)
    def shown(ctx: JobContext) -> None:
        ctx.step("first", lambda: 1)
        ctx.progress(0.25, "a quarter")
        log.warning("waiting for the go")
        ctx.wait_for_signal("api:go", timeout=dt.timedelta(days=1))

    with Session(engine) as session, session.begin():
        job = shown.defer(session)
        session.flush()
        job_id = job.id
    run_until_empty(engine, registry, BURST)
    answer = client(engine, api_tokens="meets:admin").get(f"/api/jobs/{job_id}", headers=API_ADMIN)
    assert answer.status_code == 200, answer.text
    view = answer.json()
    assert view["status"] == "waiting"
    assert view["progress"]["fraction"] == 0.25
    assert [line["message"] for line in view["logs"][0]["lines"]] == ["waiting for the go"]
    assert [step["name"] for step in view["steps"]] == ["first"]
    assert [wait["key"] for wait in view["signal_waits"]] == ["api:go"]


def test_a_handler_given_a_row_reports_progress_and_its_missing_row_reports_none(
    engine: Engine,
) -> None:
    shop = make_shop(engine)
    registry = Registry()

    @registry.task(name="pack", pass_context=True)
    def pack(ctx: JobContext, order: Order) -> None:
        ctx.progress(1.0, f"packed order {order.id}")

    with Session(shop) as session, session.begin():
        jobs = [pack.defer(session, order_of(session, n)) for n in (1, 2)]
        session.flush()
        packed, gone = (j.id for j in jobs)
    with Session(shop) as session, session.begin():
        session.delete(order_of(session, 2))
    keep_jobs(shop)
    run_until_empty(shop, registry, BURST)
    view = journal(shop, packed)
    assert view.progress is not None
    assert view.progress.message == "packed order 1"
    assert journal(shop, gone).progress is None  # cancelled before its handler ran
    assert statuses(shop, [packed, gone]) == {packed: "done", gone: "cancelled"}
