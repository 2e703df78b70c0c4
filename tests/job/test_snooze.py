"""Snooze: a handler or a middleware says "not now"; the job is queued again after the delay
without spending an attempt, on the worker and in `drain` alike."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from helpers.support import (
    count_where,
    database_clock,
    delay_chosen,
    enqueue_jobs,
    jobs_by_id,
    make_due,
)
from sqlalchemy import Engine

from sqla_queue import JobContext, Outcome, OutcomeKind, Registry, Snooze, WorkerConfig
from sqla_queue.testing import DrainResult, drain, run_until_empty

BURST = WorkerConfig(concurrency=1, batch=1, poll_only=True)


def test_job_snoozed_ten_times_with_max_attempts_one_still_runs_and_succeeds(
    engine: Engine,
) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task(name="patient", max_attempts=1, pass_context=True)
    def patient(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) <= 10:
            raise Snooze(0.01, reason="rate limited")

    (job_id,) = enqueue_jobs(engine, "patient", 1, max_attempts=1)
    snoozed = 0
    for _ in range(11):
        make_due(engine)
        stats = run_until_empty(engine, registry, BURST)
        snoozed += stats.snoozed
        if stats.succeeded:
            break
    assert snoozed == 10
    assert runs == list(range(1, 12))  # the attempt number (the fencing token) keeps growing
    assert count_where(engine, f"id = {job_id}") == 0  # succeeded: deleted by the retention


def test_snooze_moves_run_at_by_its_delay_refunds_the_attempt_and_records_why(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.task(name="later", max_attempts=3)
    def later() -> None:
        raise Snooze(timedelta(minutes=5), reason="upstream busy")

    (job_id,) = enqueue_jobs(engine, "later", 1)
    before = database_clock(engine)
    with caplog.at_level(logging.INFO, logger="sqla_queue.worker"):
        stats = run_until_empty(engine, registry, BURST)
    after = database_clock(engine)
    assert (stats.snoozed, stats.retried, stats.failed, stats.succeeded) == (1, 0, 0, 0)
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 1, 4)
    assert job.last_error == "snoozed for 300 s: upstream busy"
    assert job.locked_by is None
    assert 300 in delay_chosen(engine, job_id, before, after)
    records = [r for r in caplog.records if "snoozed for 300 s" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.INFO]


def test_a_middleware_can_snooze_and_the_handler_does_not_run(engine: Engine) -> None:
    def rate_limit(ctx: JobContext, call_next: Any) -> Any:
        raise Snooze(60, reason="over the rate limit")

    registry = Registry(middleware=[rate_limit])
    ran: list[str] = []
    registry.task(name="limited")(lambda: ran.append("handler"))

    (job_id,) = enqueue_jobs(engine, "limited", 1)
    stats = run_until_empty(engine, registry, BURST)
    assert stats.snoozed == 1
    assert ran == []
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.last_error) == ("queued", "snoozed for 60 s: over the rate limit")


def test_on_job_finished_sees_snoozed_with_the_delay(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="sleepy")(lambda: Snooze(30))  # returning it works as raising it does
    seen: list[tuple[OutcomeKind, float | None]] = []

    @registry.on_job_finished
    def record(ctx: JobContext, outcome: Outcome) -> None:
        seen.append((outcome.kind, outcome.retry_in))

    enqueue_jobs(engine, "sleepy", 1)
    run_until_empty(engine, registry, BURST)
    assert seen == [(OutcomeKind.snoozed, 30.0)]


def test_drain_snoozes_without_spending_an_attempt(engine: Engine) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.task(name="twice", max_attempts=1, pass_context=True)
    def twice(ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise Snooze(3600, reason="not yet")

    (job_id,) = enqueue_jobs(engine, "twice", 1, max_attempts=1)
    assert drain(engine, registry) == DrainResult(snoozed=1)
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 1, 2)
    assert job.last_error == "snoozed for 3600 s: not yet"
    assert drain(engine, registry) == DrainResult()  # the delay is honoured
    assert drain(engine, registry, include_scheduled=True) == DrainResult(succeeded=1)
    assert calls == [1, 2]


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), timedelta(days=-1), 1e12])
def test_a_bad_snooze_delay_is_a_clear_error_that_fails_the_attempt_visibly(
    engine: Engine, delay: Any
) -> None:
    with pytest.raises(ValueError, match="Snooze delay must be between 0 and"):
        Snooze(delay)
    registry = Registry()

    @registry.task(name="bad_delay", max_attempts=1)
    def bad_delay() -> None:
        raise Snooze(delay)

    (job_id,) = enqueue_jobs(engine, "bad_delay", 1)
    result = drain(engine, registry)
    assert (result.failed, result.snoozed) == (1, 0)
    job = jobs_by_id(engine)[job_id]
    assert job.status == "failed"
    assert "Snooze delay must be between 0 and" in (job.last_error or "")


def test_snooze_rejects_a_delay_that_is_not_a_number() -> None:
    with pytest.raises(TypeError, match="Snooze needs a number of seconds or a timedelta"):
        Snooze("60")  # type: ignore[arg-type]


def test_an_async_handler_snoozes_like_a_sync_one(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="async_wait", max_attempts=1)
    async def async_wait() -> None:
        raise Snooze(90, reason="async upstream busy")

    (job_id,) = enqueue_jobs(engine, "async_wait", 1, max_attempts=1)
    stats = run_until_empty(engine, registry, BURST)
    assert (stats.snoozed, stats.failed) == (1, 0)
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 1, 2)
    assert job.last_error == "snoozed for 90 s: async upstream busy"
