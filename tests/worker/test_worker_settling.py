"""How the worker settles a job whatever goes wrong: poison args, spent attempts, error text
PostgreSQL cannot store, a job already archived, a raising retry policy, a cancel before the
start, a retention changed while it runs."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.support import (
    WorkerThread,
    count_hot_where,
    count_where,
    enqueue_jobs,
    jobs_by_id,
    wait_for,
)
from sqlalchemy import Engine, text

from sqla_queue import JobContext, Registry, RetryPolicy, WorkerConfig, admin
from sqla_queue.db import queries
from sqla_queue.testing import run_until_empty


def _insert_raw_job(engine: Engine, args_sql: str) -> int:
    with engine.begin() as conn:
        return int(
            conn.scalar(
                text(
                    "INSERT INTO sqla_queue.jobs (task, args) "
                    f"VALUES ('t', ({args_sql})::jsonb) RETURNING id"
                )
            )
        )


def test_poison_args_fail_only_their_own_job(engine: Engine) -> None:
    """Defect 2: args that cannot be decoded fail that job; the batch's others run."""
    registry = Registry()
    ran: list[int] = []
    registry.task(name="t")(lambda n=0, **_: ran.append(n))
    deep = _insert_raw_job(engine, "'{\"a\": ' || repeat('[', 5000) || repeat(']', 5000) || '}'")
    huge = _insert_raw_job(engine, "'{\"n\": ' || repeat('9', 5000) || '}'")
    good = enqueue_jobs(engine, "t", 3, args={"n": 1})

    stats = run_until_empty(engine, registry, WorkerConfig(batch=10, poll_only=True))

    assert ran == [1, 1, 1]
    assert stats.succeeded == len(good)
    with engine.connect() as conn:  # not through Job: the ORM would decode the args too
        rows = conn.execute(text("SELECT id, status, last_error FROM sqla_queue.jobs"))
        poison = {row.id: (row.status, row.last_error) for row in rows}
    assert set(poison) == {deep, huge}
    assert poison[deep][0] == poison[huge][0] == "failed"
    assert "args cannot be decoded (RecursionError" in poison[deep][1]
    assert "args cannot be decoded (ValueError" in poison[huge][1]


def test_attempts_beyond_max_attempts_are_failed_by_the_claim_itself(engine: Engine) -> None:
    """Defect 2: a queued job already at its max_attempts never runs again."""
    (job_id,) = enqueue_jobs(engine, "t", 1, max_attempts=2)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET attempts = 2"))
        rows = conn.execute(queries.claim_jobs(None), {"limit": 5, "worker_id": "w"}).all()
    assert [row.status for row in rows] == ["failed"]
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts) == ("failed", 3)
    assert "attempt 3 exceeds max_attempts 2" in (job.last_error or "")


def test_an_error_text_postgres_cannot_store_is_cleaned_not_fatal(engine: Engine) -> None:
    """Defect 3: a NUL or a lone surrogate in an exception's text."""
    registry = Registry()

    @registry.task(name="nul", max_attempts=1)
    def nul() -> None:
        raise ValueError("before\x00after \udc80 end")

    registry.task(name="ok")(lambda: None)
    (bad,) = enqueue_jobs(engine, "nul", 1)
    enqueue_jobs(engine, "ok", 2)
    stats = run_until_empty(engine, registry, WorkerConfig(batch=10, poll_only=True))
    assert (stats.succeeded, stats.failed) == (2, 1)
    error = jobs_by_id(engine)[bad].last_error or ""
    assert "before\\x00after \\udc80 end" in error


def test_a_job_already_in_the_history_is_finished_without_a_duplicate_key(engine: Engine) -> None:
    """Defect 3: moving an id the history already holds (at another finish time) to the
    history crashes nothing: the history's key is (id, finished_at)."""
    registry = Registry()
    registry.task(name="ok")(lambda: None)
    with engine.begin() as conn:
        admin.create_queue(conn, "arch", "archive")
    ids = enqueue_jobs(engine, "ok", 3, queue="arch")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs_history (id, queue, task, args, status, priority, "
                "run_at, attempts, created_at, finished_at) "
                "VALUES (:id, 'arch', 'old', '{}', 'done', 0, now(), 1, now(), "
                "now() - interval '1 hour')"
            ),
            {"id": ids[0]},
        )
    stats = run_until_empty(engine, registry, WorkerConfig(batch=10, poll_only=True))
    assert stats.succeeded == 3
    assert count_hot_where(engine, "true") == 0
    with engine.connect() as conn:
        tasks = conn.execute(
            text("SELECT id, task FROM sqla_queue.jobs_history ORDER BY id, finished_at")
        )
        assert tasks.all() == [(ids[0], "old"), (ids[0], "ok"), (ids[1], "ok"), (ids[2], "ok")]


def test_a_raising_retry_policy_still_settles_the_job(engine: Engine) -> None:
    """Defect 5: the backoff computation raises; the job is retried, not wedged."""

    class Broken(RetryPolicy):
        def delay(self, attempt: int) -> float:
            raise ZeroDivisionError("bad policy")

    registry = Registry()

    @registry.task(name="flaky", retry=Broken())
    def flaky() -> None:
        raise RuntimeError("handler failed")

    (job_id,) = enqueue_jobs(engine, "flaky", 1)
    stats = run_until_empty(engine, registry)
    job = jobs_by_id(engine)[job_id]
    assert stats.retried == 1
    assert (job.status, job.attempts) == ("queued", 1)  # with the default backoff
    assert "handler failed" in (job.last_error or "")


@pytest.mark.parametrize("poll_only", [False, True])
def test_a_cancelled_job_that_was_claimed_but_not_started_never_runs(
    engine: Engine, poll_only: bool
) -> None:
    """Defect 7: NOTIFY tells the worker at once; without it, a check before starting."""
    registry = Registry()
    gate = threading.Event()
    ran: list[int] = []

    @registry.task(name="g", pass_context=True)
    def g(ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        gate.wait(60)

    first, *waiting = enqueue_jobs(engine, "g", 4)
    with WorkerThread(engine, registry, concurrency=1, batch=4, poll_only=poll_only) as w:
        wait_for(lambda: ran == [first])
        wait_for(lambda: count_where(engine, "status = 'running'") == 4)  # all held here
        with engine.begin() as conn:
            assert admin.cancel_jobs(conn, waiting[:2]) == dict.fromkeys(waiting[:2], "running")
        if poll_only:  # past RECHECK_AFTER (1 s): they are re-read before they start
            time.sleep(1.2)
        else:  # the NOTIFY has reached the held jobs' contexts, however late on a loaded box
            held = w.worker.board.find
            wait_for(lambda: [j.ctx.cancelled for i in waiting[:2] for j in held(i)] == [True] * 2)
        gate.set()
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0)
    assert ran == [first, waiting[2]]
    assert {jobs_by_id(engine)[i].status for i in waiting[:2]} == {"cancelled"}


def test_a_retention_change_is_honoured_at_once(engine: Engine) -> None:
    """Defect 9: no cached map of queue retention."""
    registry = Registry()
    registry.task(name="ok")(lambda: None)
    with engine.begin() as conn:
        admin.create_queue(conn, "q")
    with WorkerThread(engine, registry, poll_interval=0.1):
        time.sleep(0.5)  # the worker is running before the change (if slower, no matter)
        with engine.begin() as conn:
            admin.set_retention(conn, "q", "keep")
        (job_id,) = enqueue_jobs(engine, "ok", 1, queue="q")
        wait_for(lambda: count_where(engine, "status = 'done'") == 1, timeout=60)
    assert jobs_by_id(engine)[job_id].status == "done"
