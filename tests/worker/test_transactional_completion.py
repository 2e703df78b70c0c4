"""`ctx.session()`: the handler's writes, its follow-up jobs and the job's completion commit
in one transaction, fenced on the job's id, attempt and status."""

from __future__ import annotations

import functools
import signal
import threading
import time
from typing import Any

import pytest
from helpers.support import (
    WorkerThread,
    count_where,
    create_task_log,
    enqueue_jobs,
    start_worker_process,
    task_log,
    until_told,
    wait_for,
)
from sqlalchemy import Engine, text

from sqla_queue import (
    JobContext,
    JobFailedError,
    JobLostError,
    Registry,
    ResultTimeoutError,
    admin,
    enqueue,
)
from sqla_queue.db import queries
from sqla_queue.enqueue import results
from sqla_queue.errors import ConfigurationError
from sqla_queue.testing import run_until_empty
from sqla_queue.worker.transactional import job_session


@pytest.fixture
def receipts(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.receipts (job_id bigint, attempt int)"))
    return engine


def claimed_context(engine: Engine, attempt_offset: int = 0) -> JobContext:
    enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        (row,) = conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w"}).all()
    return JobContext(
        row.id,
        "t",
        "default",
        row.attempts + attempt_offset,
        session_factory=functools.partial(job_session, engine),
    )


def receipt_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT job_id, attempt FROM public.receipts")).all())


def test_commit_writes_the_rows_the_follow_up_job_and_finishes_the_job(receipts: Engine) -> None:
    ctx = claimed_context(receipts)
    with ctx.session() as session:
        session.execute(
            text("INSERT INTO public.receipts VALUES (:j, :a)"), {"j": ctx.job_id, "a": ctx.attempt}
        )
        follow_up = enqueue(session, "shop.ship", {"order": 7}, flush=True).id
        session.commit()
    assert ctx.committed
    assert receipt_rows(receipts) == [(ctx.job_id, ctx.attempt)]
    assert count_where(receipts, f"id = {ctx.job_id}") == 0  # finished: deleted by retention
    assert count_where(receipts, f"id = {follow_up} AND status = 'queued'") == 1


def test_a_queue_that_keeps_jobs_marks_it_done_in_that_commit(receipts: Engine) -> None:
    with receipts.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    ctx = claimed_context(receipts)
    with ctx.session() as session:
        session.execute(text("INSERT INTO public.receipts VALUES (1, 1)"))
        session.commit()
    assert count_where(receipts, f"id = {ctx.job_id} AND status = 'done'") == 1


def test_a_stale_attempt_cannot_commit_and_its_writes_roll_back(receipts: Engine) -> None:
    ctx = claimed_context(receipts, attempt_offset=-1)  # an earlier attempt, reaped since
    with ctx.session() as session:
        session.execute(text("INSERT INTO public.receipts VALUES (1, 1)"))
        enqueue(session, "shop.ship", {"order": 7})
        with pytest.raises(JobLostError, match=f"Job {ctx.job_id} is no longer held"):
            session.commit()
    assert not ctx.committed
    assert receipt_rows(receipts) == []
    assert count_where(receipts, "task = 'shop.ship'") == 0
    assert count_where(receipts, f"id = {ctx.job_id} AND status = 'running'") == 1


def test_a_session_that_is_not_committed_leaves_the_job_running(receipts: Engine) -> None:
    ctx = claimed_context(receipts)
    with ctx.session() as session:
        session.execute(text("INSERT INTO public.receipts VALUES (1, 1)"))
    assert not ctx.committed
    assert receipt_rows(receipts) == []
    assert count_where(receipts, f"id = {ctx.job_id} AND status = 'running'") == 1


def test_a_released_savepoint_does_not_finish_the_job_its_transaction_does(
    receipts: Engine,
) -> None:
    ctx = claimed_context(receipts)
    with ctx.session() as session:
        with session.begin_nested():  # released: not the commit of the transaction
            session.execute(text("INSERT INTO public.receipts VALUES (1, 1)"))
        assert not ctx.committed
        session.rollback()  # the transaction, and the savepoint in it, come to nothing
    assert not ctx.committed  # the worker writes the job's outcome itself
    assert receipt_rows(receipts) == []
    assert count_where(receipts, f"id = {ctx.job_id} AND status = 'running'") == 1

    with ctx.session() as session:
        with session.begin_nested():
            session.execute(text("INSERT INTO public.receipts VALUES (2, 1)"))
        session.commit()  # the transaction's commit finishes the job, once
    assert ctx.committed
    assert receipt_rows(receipts) == [(2, 1)]
    assert count_where(receipts, f"id = {ctx.job_id}") == 0


def test_a_context_without_a_database_says_where_session_works() -> None:
    ctx = JobContext(1, "t", "default", 1)
    with pytest.raises(ConfigurationError, match=r"ctx.session\(\) needs a job run by a worker"):
        ctx.session()


# -- with worker processes ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_killed_right_after_the_commit_leaves_the_row_once_and_the_job_finished(
    database_url: str, receipts: Engine
) -> None:
    (job_id,) = enqueue_jobs(receipts, "commit_then_die", 1)
    killed = start_worker_process(database_url, "--burst")
    killed.communicate(timeout=180)
    assert killed.returncode == -signal.SIGKILL
    assert receipt_rows(receipts) == [(job_id, 1)]
    assert count_where(receipts, f"id = {job_id}") == 0  # finished by the handler's commit

    with receipts.begin() as conn:  # the dead worker's registration: its jobs are reapable
        conn.execute(text("UPDATE sqla_queue.workers SET expires_at = now() - interval '1 s'"))
    again = start_worker_process(database_url, "--burst")
    _, stderr = again.communicate(timeout=180)
    assert again.returncode == 0, stderr
    assert receipt_rows(receipts) == [(job_id, 1)], "the job did not run again"


@pytest.mark.slow
def test_a_stale_attempt_paused_past_its_reaping_cannot_commit_its_writes(
    database_url: str, receipts: Engine
) -> None:
    create_task_log(receipts)
    (job_id,) = enqueue_jobs(receipts, "commit_after_pause", 1, args={"pause": 3.0})
    paused = start_worker_process(database_url, "--lease", "2")
    try:
        wait_for(lambda: task_log(receipts), timeout=120)  # attempt 1 wrote, not committed
        paused.send_signal(signal.SIGSTOP)

        def reaped() -> bool:
            with receipts.begin() as conn:
                return bool(conn.execute(queries.reap_stale_jobs()).all())

        wait_for(reaped, timeout=120, interval=0.5)
        successor = start_worker_process(database_url, "--burst")
        _, stderr = successor.communicate(timeout=180)
        assert successor.returncode == 0, stderr
        assert receipt_rows(receipts) == [(job_id, 2)]
        paused.send_signal(signal.SIGCONT)
        time.sleep(5)  # attempt 1 wakes, sleeps out its pause and commits: fenced off
    finally:
        paused.send_signal(signal.SIGCONT)
        paused.send_signal(signal.SIGTERM)
        paused.communicate(timeout=30)
    assert receipt_rows(receipts) == [(job_id, 2)], "the stale attempt's writes rolled back"
    assert sorted(task_log(receipts)) == [(job_id, 1), (job_id, 2)]


# -- keep_result with ctx.session(): the result is kept, stored once the handler returns ----


def invoice_registry(after_commit: threading.Event) -> Registry:
    registry = Registry()

    @registry.task(name="invoice", keep_result=True, pass_context=True)
    def invoice(ctx: JobContext, order: int) -> dict[str, int]:
        with ctx.session() as session:
            session.execute(
                text("INSERT INTO public.receipts VALUES (:j, :a)"),
                {"j": ctx.job_id, "a": ctx.attempt},
            )
            session.commit()
        after_commit.wait(120)  # a waiter looks at the row meanwhile: it must not end yet
        return {"order": order, "invoice": order * 10}

    @registry.task(name="broken", keep_result=True, pass_context=True, max_attempts=1)
    def broken(ctx: JobContext) -> None:
        with ctx.session() as session:
            session.commit()
        raise RuntimeError("after the commit")

    return registry


@pytest.mark.parametrize("retention", ["keep", "delete", "archive"])
def test_a_result_returned_after_the_handlers_session_committed_is_kept(
    receipts: Engine, retention: str
) -> None:
    with receipts.begin() as conn:
        admin.set_retention(conn, "default", retention)
    after_commit = threading.Event()
    registry = invoice_registry(after_commit)
    (job_id,) = enqueue_jobs(receipts, "invoice", 1, args={"order": 7})
    (broken_id,) = enqueue_jobs(receipts, "broken", 1)
    worker = threading.Thread(target=run_until_empty, args=(receipts, registry))
    worker.start()
    try:
        wait_for(lambda: receipt_rows(receipts), timeout=60)  # committed, not yet returned
        with pytest.raises(ResultTimeoutError, match="finishing"):
            results.wait_for(receipts, job_id, timeout=0.3, recheck=0.05)
    finally:
        after_commit.set()
        worker.join(60)
    assert results.wait_for(receipts, job_id, timeout=60) == {"order": 7, "invoice": 70}
    with pytest.raises(JobFailedError, match="no result can be kept: it raised"):
        results.wait_for(receipts, broken_id, timeout=60)
    assert receipt_rows(receipts) == [(job_id, 1)]  # ran once


def test_a_result_kept_past_a_session_commit_survives_the_handlers_timeout(
    receipts: Engine,
) -> None:
    # The session commits in time; the handler returns after its deadline: the commit
    # stands and its result is stored (a timeout held for it wrote nothing, for good).
    registry = Registry()

    @registry.task(name="slow_after_commit", keep_result=True, pass_context=True, timeout=2)
    def slow_after_commit(ctx: JobContext) -> str:
        with ctx.session() as session:
            session.commit()
        timed_out.append(until_told(ctx))  # returns once timed out, not after a guess
        return "stored"

    timed_out: list[bool] = []
    (job_id,) = enqueue_jobs(receipts, "slow_after_commit", 1)
    run_until_empty(receipts, registry)
    assert timed_out == [True]  # it returned past its deadline
    assert results.wait_for(receipts, job_id, timeout=60) == "stored"


def test_a_worker_stopping_before_a_committed_handler_returns_leaves_no_pending_result(
    receipts: Engine,
) -> None:
    registry = Registry()
    committed, release = threading.Event(), threading.Event()

    @registry.task(name="commits_then_hangs", keep_result=True, pass_context=True)
    def commits_then_hangs(ctx: JobContext) -> str:
        with ctx.session() as session:
            session.commit()
        committed.set()
        release.wait(10)
        return "too late"

    (job_id,) = enqueue_jobs(receipts, "commits_then_hangs", 1)
    runner = WorkerThread(receipts, registry, concurrency=1, shutdown_timeout=0.2)
    try:
        with runner:
            assert committed.wait(60)
    finally:
        release.set()
    with pytest.raises(JobFailedError, match="worker stopped before the handler returned"):
        results.wait_for(receipts, job_id, timeout=60)
