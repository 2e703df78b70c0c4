"""What the worker logs: a statement error once with its backoff, retries as warnings, final
failures as errors, a storm summarised."""

from __future__ import annotations

import logging
import time

import pytest
from helpers.support import WorkerThread, enqueue_jobs, wait_for
from sqlalchemy import Engine, create_engine, text

from sqla_queue import Registry, RetryPolicy, WorkerConfig
from sqla_queue.testing import run_until_empty


def test_a_statement_error_is_waited_out_with_backoff_and_logged_once(
    database_url: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 12: a lock timeout is not a lost connection: backoff, one warning."""
    registry = Registry()
    ran: list[int] = []
    registry.task(name="t")(lambda: ran.append(1))
    impatient = create_engine(database_url, connect_args={"options": "-c lock_timeout=50"})
    caplog.set_level(logging.WARNING, "sqla_queue")
    try:
        with engine.connect() as blocker:
            blocker.execute(text("LOCK TABLE sqla_queue.jobs IN ACCESS EXCLUSIVE MODE"))
            runner = WorkerThread(impatient, registry, poll_interval=0.1)
            with runner:
                # the claim loop has hit the lock timeout (waited for), then retries for a
                # while: each retry a chance to log again, which it must not
                wait_for(lambda: "database error" in caplog.text)
                time.sleep(3)
                blocker.rollback()
                enqueue_jobs(engine, "t", 1)
                wait_for(lambda: ran == [1])
    finally:
        impatient.dispose()
    warnings = [r.getMessage() for r in caplog.records if "lock timeout" in r.getMessage()]
    # One from the claim loop, at most one from the keeper and one from its upkeep of the
    # table (on its own thread, SKIP_LOCKED): not one per attempt.
    assert len([w for w in warnings if w.startswith("database error")]) == 1, warnings
    assert len([w for w in warnings if w.startswith("upkeep of the jobs table")]) <= 1, warnings
    assert len(warnings) <= 3, warnings
    assert "reconnecting" not in caplog.text
    assert "database reachable again" in caplog.text


def test_each_retry_is_a_warning_and_each_final_failure_an_error_and_a_storm_is_summarised(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.task(name="fails", max_attempts=2, retry=RetryPolicy(base=3600, jitter=0))
    def fails() -> None:
        raise KeyError("missing")

    caplog.set_level(logging.WARNING, "sqla_queue.worker")
    ids = enqueue_jobs(engine, "fails", 25)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET attempts = 1 WHERE id = :id"), {"id": ids[0]})
    run_until_empty(engine, registry, WorkerConfig(batch=25, concurrency=1, poll_only=True))

    failures = [
        r for r in caplog.records if "fails" in r.getMessage() and "attempt" in r.getMessage()
    ]
    final = [r for r in failures if r.levelno == logging.ERROR]
    retries = [r for r in failures if r.levelno == logging.WARNING]
    assert len(final) == 1
    assert f"job {ids[0]} (fails) failed for good on attempt 2 of 2" in final[0].getMessage()
    assert "KeyError: 'missing'" in final[0].getMessage()
    assert "Traceback (most recent call last)" in final[0].getMessage()
    assert len(retries) == 9  # ten per task per window with a traceback, the rest counted
    assert "attempt 1 of 2 failed (KeyError: 'missing'); retrying in 3600.0 s" in (
        retries[0].getMessage()
    )
