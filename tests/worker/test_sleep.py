"""Durable sleep (`ctx.sleep`, `ctx.sleep_until`): the run ends, the slot is freed, no
attempt is spent, and the job runs again at the sleep's end (database clock), replaying its
finished steps; what `jobs show` says meanwhile; where sleep meets workflows, sequences,
unique jobs, timeouts, retries and cancels."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from helpers.support import (
    Bounds,
    WorkerThread,
    cli,
    count_where,
    database_clock,
    end_sleeps,
    enqueue_jobs,
    keep_jobs,
    seq_jobs,
    statuses,
    wait_for,
)
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import (
    JobContext,
    Registry,
    ResultTimeoutError,
    RetryPolicy,
    Snooze,
    admin,
    enqueue,
)
from sqla_queue import wait_for as wait_for_result
from sqla_queue.admin.filters import JobFilter, bulk_cancel
from sqla_queue.db.queries import steps as step_queries
from sqla_queue.doctor import DoctorOptions, Severity
from sqla_queue.doctor.checks import check_waiting_jobs
from sqla_queue.job.options import DEFAULT_MAX_ATTEMPTS

HOUR = timedelta(hours=1)
SLEEPING = "status = 'waiting' AND signal_key IS NULL AND deps_left IS NULL"
"""A job parked by its sleep (the predicate of `ix_jobs_sleep_end`)."""


def nap_registry(log: list[str], fail_after_wake: bool = False) -> Registry:
    """Task `nap`: step `before`, a one-hour sleep, step `after` (which fails once after the
    wake if `fail_after_wake`). Task `quick` does nothing; task `t` (a sequence's) sleeps
    when its `n` is 0."""
    registry = Registry()

    @registry.task(name="nap", pass_context=True, timeout=30, retry=RetryPolicy(base=0, jitter=0))
    def nap(ctx: JobContext) -> None:
        ctx.step("before", lambda: log.append("before") or "b")
        ctx.sleep(HOUR)
        if fail_after_wake and "failed" not in log:
            log.append("failed")
            raise RuntimeError("once")
        ctx.step("after", lambda: log.append("after") or "a")

    @registry.task(name="quick")
    def quick() -> None:
        log.append("quick")

    @registry.task(name="t", pass_context=True)
    def t(ctx: JobContext, n: int) -> None:
        if n == 0:
            ctx.sleep(HOUR, name="pause")
        log.append(f"t{n}")

    return registry


def run_what_is_due(engine: Engine, registry: Registry, **config: Any) -> None:
    """A worker that runs what is due, then stops."""
    with WorkerThread(engine, registry, burst=True, **config):
        pass


def run_until(engine: Engine, registry: Registry, condition: str) -> None:
    with WorkerThread(engine, registry, burst=True, burst_wait=5):
        wait_for(lambda: count_where(engine, condition) > 0)


def wake(engine: Engine) -> None:
    """Time passes: every recorded sleep is over, and the sleeping jobs are due and queued
    by the keeper's statement."""
    end_sleeps(engine)
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE sqla_queue.jobs SET run_at = now() WHERE status = 'queued' OR {SLEEPING}")
        )
        conn.execute(step_queries.wake_sleeping_jobs(), {"ahead": 0.0})


def sleeper_row(engine: Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM sqla_queue.all_jobs WHERE id = :id"), {"id": job_id}
        ).one()


def sleep_end(engine: Engine, job_id: int) -> datetime:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT (result->>'until')::timestamptz FROM sqla_queue.job_steps "
                "WHERE job_id = :id AND kind = 'sleep'"
            ),
            {"id": job_id},
        ).scalar_one()


def test_a_sleeping_job_is_parked_until_its_end_and_spends_no_attempt(engine: Engine) -> None:
    log: list[str] = []
    registry = nap_registry(log)
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "nap", 1)
    before = database_clock(engine)
    run_until(engine, registry, SLEEPING)
    after = database_clock(engine)
    row = sleeper_row(engine, job_id)
    assert (row.status, row.attempts, row.max_attempts) == ("waiting", 1, DEFAULT_MAX_ATTEMPTS + 1)
    assert (row.locked_by, row.signal_key, row.deps_left, row.last_error) == (None,) * 4
    end = sleep_end(engine, job_id)
    assert before + HOUR <= end <= after + HOUR  # measured by the database's clock
    assert row.run_at >= end  # never claimed before its end
    # parked at its end: later by no more than the park came after the read of the sleep
    # (both within the step, by the database clock), however slow the machine
    assert (row.run_at - end).total_seconds() in Bounds(0, (after - before).total_seconds())
    assert log == ["before"]
    wake(engine)
    run_until(engine, registry, "status = 'done'")
    assert log == ["before", "after"]
    assert [(s.name, s.kind, s.attempt) for s in admin_steps(engine, job_id)] == [
        ("before", "step", 1),
        ("sleep#1", "sleep", 1),
        ("after", "step", 2),
    ]


def admin_steps(engine: Engine, job_id: int) -> list[admin.JobStepInfo]:
    with engine.connect() as conn:
        return admin.job_steps(conn, job_id)


def test_a_retry_after_the_wake_neither_sleeps_again_nor_repeats_a_step(engine: Engine) -> None:
    log: list[str] = []
    registry = nap_registry(log, fail_after_wake=True)
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "nap", 1)
    run_until(engine, registry, SLEEPING)
    wake(engine)
    run_until(engine, registry, "status = 'done'")
    assert log == ["before", "failed", "after"]
    assert sleeper_row(engine, job_id).attempts == 3


def test_jobs_show_says_sleeping_until_and_lists_the_steps(
    engine: Engine, database_url: str
) -> None:
    log: list[str] = []
    (job_id,) = enqueue_jobs(engine, "nap", 1)
    run_until(engine, nap_registry(log), SLEEPING)
    run_at = sleeper_row(engine, job_id).run_at
    shown = cli("jobs", "show", str(job_id), url=database_url)
    assert shown.exit_code == 0, shown.output
    assert f"sleeping until {run_at.isoformat()}" in shown.output
    assert "steps (2):" in shown.output
    assert "  before  attempt 1" in shown.output
    assert "  sleep#1 (sleep)  attempt 1" in shown.output
    as_json = json.loads(cli("jobs", "show", str(job_id), "--json", url=database_url).output)
    assert as_json["sleeping_until"] == run_at.isoformat()
    first = as_json["steps"][0]
    assert (first["name"], first["status"], first["result"]) == ("before", "done", "b")


def test_a_sleeping_job_holds_no_slot_and_others_run_meanwhile(engine: Engine) -> None:
    log: list[str] = []
    registry = nap_registry(log)
    enqueue_jobs(engine, "nap", 1)
    enqueue_jobs(engine, "quick", 3)
    with WorkerThread(engine, registry, concurrency=1) as worker:
        wait_for(lambda: log.count("quick") == 3, 30)
        wait_for(lambda: count_where(engine, SLEEPING) == 1, 30)
        assert worker.worker.board.held_jobs() == []
        assert count_where(engine, "status = 'running'") == 0


def test_sleep_until_a_time_passed_returns_at_once(engine: Engine) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="late", pass_context=True)
    def late(ctx: JobContext) -> None:
        ctx.sleep_until(datetime.now(timezone.utc) - timedelta(minutes=1))
        ran.append(ctx.attempt)

    keep_jobs(engine)
    enqueue_jobs(engine, "late", 1)
    run_until(engine, registry, "status = 'done'")
    assert ran == [1]


def test_sleep_until_refuses_a_naive_datetime(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="naive", pass_context=True, max_attempts=1)
    def naive(ctx: JobContext) -> None:
        ctx.sleep_until(datetime(2030, 1, 1))

    keep_jobs(engine)
    enqueue_jobs(engine, "naive", 1)
    run_until(engine, registry, "status = 'failed'")
    assert count_where(engine, "last_error LIKE '%needs an aware datetime%'") == 1


def test_a_dependent_waits_for_the_sleeping_job_to_end_not_its_run(engine: Engine) -> None:
    log: list[str] = []
    registry = nap_registry(log)
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "nap", {}, flush=True).id
        child = enqueue(session, "quick", {}, depends_on=[parent], flush=True).id
    run_until(engine, registry, SLEEPING)
    assert statuses(engine, [child]) == {child: "waiting"}
    assert "quick" not in log
    wake(engine)
    run_until(engine, registry, f"id = {child}")  # the child's row is there until it runs
    with WorkerThread(engine, registry, burst=True, burst_wait=5):
        wait_for(lambda: "quick" in log, 30)
    assert log == ["before", "after", "quick"]


def test_a_sleeping_job_keeps_its_sequence(engine: Engine) -> None:
    log: list[str] = []
    registry = nap_registry(log)
    ids = seq_jobs(engine, "customer-1", 3)
    run_until(engine, registry, SLEEPING)
    run_what_is_due(engine, registry)
    assert log == []
    assert statuses(engine, ids) == {ids[0]: "waiting", ids[1]: "queued", ids[2]: "queued"}
    wake(engine)
    with WorkerThread(engine, registry, burst=True, burst_wait=5):
        wait_for(lambda: len(log) == 3, 30)
    assert log == ["t0", "t1", "t2"]


def test_a_sleeping_unique_job_still_blocks_its_duplicate(engine: Engine) -> None:
    log: list[str] = []
    with Session(engine) as session, session.begin():
        first = enqueue(session, "nap", {}, unique=True, flush=True).id
    run_until(engine, nap_registry(log), SLEEPING)
    with Session(engine) as session, session.begin():
        again = enqueue(session, "nap", {}, unique=True, flush=True)
    assert again.id == first
    assert count_where(engine, "task = 'nap'") == 1


def test_cancelling_a_sleeping_job_ends_it_for_good(engine: Engine) -> None:
    log: list[str] = []
    registry = nap_registry(log)
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "nap", 1)
    run_until(engine, registry, SLEEPING)
    with engine.begin() as conn:
        assert admin.cancel_jobs(conn, [job_id]) == {job_id: "waiting"}
    wake(engine)
    run_what_is_due(engine, registry)
    assert statuses(engine, [job_id]) == {job_id: "cancelled"}
    assert log == ["before"]


@pytest.mark.parametrize("name", ["before", "pause"])
def test_a_name_is_a_step_or_a_sleep_not_both(engine: Engine, name: str) -> None:
    registry = Registry()

    @registry.task(name="mixed", pass_context=True, max_attempts=1)
    def mixed(ctx: JobContext) -> None:
        if name == "before":
            ctx.step(name, lambda: 1)
            ctx.sleep(HOUR, name=name)
        else:
            ctx.sleep(timedelta(0), name=name)
            ctx.step(name, lambda: 1)

    keep_jobs(engine)
    enqueue_jobs(engine, "mixed", 1)
    run_until(engine, registry, "status = 'failed'")
    assert count_where(engine, "last_error LIKE '%give each step and each sleep a name%'") == 1


def test_a_snooze_after_the_wake_does_not_sleep_again(engine: Engine) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task(name="snoozy", pass_context=True)
    def snoozy(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        ctx.sleep(HOUR)
        if len(runs) == 2:
            raise Snooze(0)

    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "snoozy", 1)
    run_until(engine, registry, SLEEPING)
    wake(engine)
    run_until(engine, registry, "status = 'done'")
    assert runs == [1, 2, 3]
    assert sleeper_row(engine, job_id).max_attempts == DEFAULT_MAX_ATTEMPTS + 2  # two refunds


def test_the_kept_result_is_the_one_of_the_run_after_the_wake(engine: Engine) -> None:
    registry = Registry()
    values = iter(range(100))

    @registry.task(name="kept", pass_context=True, keep_result=True)
    def kept(ctx: JobContext) -> dict[str, Any]:
        v = ctx.step("v", lambda: next(values))
        ctx.sleep(HOUR)
        return {"v": v, "attempt": ctx.attempt}

    (job_id,) = enqueue_jobs(engine, "kept", 1)
    run_until(engine, registry, SLEEPING)
    with pytest.raises(ResultTimeoutError):
        wait_for_result(engine, job_id, timeout=0)
    wake(engine)
    with WorkerThread(engine, registry, burst=True, burst_wait=5):
        assert wait_for_result(engine, job_id, timeout=30) == {"v": 0, "attempt": 2}


def test_a_handler_that_commits_its_session_after_the_wake_finishes_the_job(
    engine: Engine,
) -> None:
    registry = Registry()

    @registry.task(name="commits", pass_context=True)
    def commits(ctx: JobContext) -> None:
        ctx.sleep(HOUR)
        with ctx.session() as session:
            session.execute(text("SELECT 1"))
            session.commit()

    keep_jobs(engine)
    enqueue_jobs(engine, "commits", 1)
    run_until(engine, registry, SLEEPING)
    assert count_where(engine, SLEEPING) == 1
    wake(engine)
    run_until(engine, registry, "status = 'done'")


def test_a_sleep_after_the_session_committed_the_job_leaves_it_done(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="late_sleep", pass_context=True)
    def late_sleep(ctx: JobContext) -> None:
        with ctx.session() as session:
            session.commit()
        ctx.sleep(HOUR)

    keep_jobs(engine)
    enqueue_jobs(engine, "late_sleep", 1)
    run_until(engine, registry, "status = 'done'")
    assert count_where(engine, "status = 'queued'") == 0


def test_a_bulk_cancel_by_filter_takes_a_sleeping_job(engine: Engine) -> None:
    log: list[str] = []
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "nap", 1)
    run_until(engine, nap_registry(log), SLEEPING)
    result = bulk_cancel(engine, JobFilter(task="nap", status="waiting"))
    assert result.acted == 1
    assert statuses(engine, [job_id]) == {job_id: "cancelled"}


def test_the_keeper_wakes_a_sleeper_at_its_end_and_it_held_nothing_meanwhile(
    engine: Engine,
) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task(name="short", pass_context=True)
    def short(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        ctx.sleep(timedelta(seconds=3))

    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "short", 1)
    with WorkerThread(engine, registry, heartbeat=0.5) as worker:
        wait_for(lambda: count_where(engine, SLEEPING) == 1, 30)
        assert worker.worker.board.held_jobs() == []
        wait_for(lambda: statuses(engine, [job_id]) == {job_id: "done"}, 30)
    assert runs == [1, 2]
    steps = admin_steps(engine, job_id)
    assert [(s.name, s.kind) for s in steps] == [("sleep#1", "sleep")]
    with engine.connect() as conn:
        finished = conn.execute(
            text("SELECT finished_at FROM sqla_queue.all_jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    assert finished >= sleep_end(engine, job_id)  # not run before its end


@pytest.mark.parametrize("catch", ["Exception", "BaseException"])
def test_a_handler_that_catches_around_its_sleep_still_sleeps(engine: Engine, catch: str) -> None:
    """`Sleeping` is a `Suspended` (a BaseException, as `WaitingForSignal` is): `except
    Exception` does not see it, and a handler that swallows it with `except BaseException`
    ends parked all the same."""
    registry = Registry()
    after: list[int] = []
    caught = {"Exception": Exception, "BaseException": BaseException}[catch]

    @registry.task(name="careless", pass_context=True)
    def careless(ctx: JobContext) -> None:
        try:  # noqa: SIM105 (the handler the rule is about, as users write it)
            ctx.sleep(HOUR)
        except caught:
            pass
        after.append(ctx.attempt)

    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "careless", 1)
    run_until(engine, registry, SLEEPING)
    assert after == ([1] if catch == "BaseException" else [])
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    wake(engine)
    run_until(engine, registry, "status = 'done'")
    assert after[-1] == 2


def test_doctor_counts_no_sleeper_as_a_job_that_can_never_run(engine: Engine) -> None:
    log: list[str] = []
    enqueue_jobs(engine, "nap", 2)
    run_until(engine, nap_registry(log), SLEEPING)
    wait_for(lambda: count_where(engine, SLEEPING) == 2, 30)
    with engine.connect() as conn:
        finding = check_waiting_jobs(conn, DoctorOptions())
    assert finding.details == {"waiting": 0, "held": 0, "orphaned": 0}
    assert finding.severity is Severity.ok
