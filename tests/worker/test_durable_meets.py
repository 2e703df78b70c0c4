"""Where durable steps and sleeps meet signals and waits (issue 36): a job that ran steps
and then parks for a signal replays its steps when the signal wakes it, and a job may sleep
and wait in either order, each run picking up where the last one ended."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from helpers.support import end_sleeps, enqueue_jobs, signal_now, statuses
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Registry, WorkerConfig
from sqla_queue.testing import run_until_empty

BURST = WorkerConfig(concurrency=1, batch=1, poll_only=True)


def test_steps_before_a_wait_run_once_and_replay_after_the_signal(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.ledger (job_id bigint, what text)"))
    outside: list[int] = []
    got: list[Any] = []
    registry = Registry()

    def save(session: Session, job_id: int) -> str:
        session.execute(text("INSERT INTO public.ledger VALUES (:j, 'saved')"), {"j": job_id})
        return "saved"

    @registry.task(name="order_flow", pass_context=True)
    def order_flow(ctx: JobContext) -> None:
        charged = ctx.step("charge", lambda: outside.append(ctx.job_id) or "ch_1")
        saved = ctx.step("save", save, ctx.job_id, session=True)
        payload = ctx.wait_for_signal(f"paid:{ctx.job_id}", timeout=timedelta(days=3))
        got.append((charged, saved, payload))

    (job_id,) = enqueue_jobs(engine, "order_flow", 1)
    run_until_empty(engine, registry, BURST)
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    assert outside == [job_id]
    assert got == []
    assert signal_now(engine, f"paid:{job_id}", {"amount": 5}) == 1
    run_until_empty(engine, registry, BURST)
    assert got == [("ch_1", "saved", {"amount": 5})]
    assert outside == [job_id]  # the outside step was replayed, not run again
    with engine.connect() as conn:
        saved_rows = [
            tuple(r) for r in conn.execute(text("SELECT job_id, what FROM public.ledger"))
        ]
    assert saved_rows == [(job_id, "saved")]  # the database step's write exists once
    assert statuses(engine, [job_id]) == {}  # done (deleted by the default retention)


def test_a_job_sleeps_then_waits_then_sleeps_and_ends_once(engine: Engine) -> None:
    runs: list[str] = []
    registry = Registry()

    @registry.task(name="slow_flow", pass_context=True)
    def slow_flow(ctx: JobContext) -> None:
        runs.append("run")
        ctx.sleep(timedelta(hours=1), name="cool-off")
        payload = ctx.wait_for_signal(f"go:{ctx.job_id}", timeout=timedelta(days=1))
        ctx.sleep(timedelta(hours=1), name="after-signal")
        runs.append(f"end {payload}")

    (job_id,) = enqueue_jobs(engine, "slow_flow", 1)
    run_until_empty(engine, registry, BURST)  # sleeps
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    end_sleeps(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET run_at = now() WHERE id = :j"), {"j": job_id})
    run_until_empty(engine, registry, BURST)  # past the first sleep, parks for the signal
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    assert signal_now(engine, f"go:{job_id}", 7) == 1
    run_until_empty(engine, registry, BURST)  # the signal read, then the second sleep
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    end_sleeps(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET run_at = now() WHERE id = :j"), {"j": job_id})
    run_until_empty(engine, registry, BURST)
    assert runs == ["run", "run", "run", "run", "end 7"]
    assert statuses(engine, [job_id]) == {}
    with engine.connect() as conn:
        attempts = conn.execute(text("SELECT count(*) FROM sqla_queue.job_steps")).scalar()
    assert attempts == 0  # removed with the job
