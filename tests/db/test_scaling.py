"""The autoscaling signal (`sqla_queue.db.scaling`): ready jobs and the oldest one's age,
running jobs, live workers' free slots, arrival and completion rates, per queue."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.support import WorkerThread, database_clock, enqueue_jobs, make_queue, wait_for
from sqlalchemy import Engine, text

from sqla_queue import Registry
from sqla_queue.db import scaling
from sqla_queue.db.scaling import QueueScaling, scaling_signal


def signal(engine: Engine, queue: str | None = None) -> dict[str, QueueScaling]:
    with engine.begin() as conn:
        return {row.queue: row for row in scaling_signal(conn, queue)}


def test_ready_counts_only_due_queued_jobs_and_ages_the_oldest(engine: Engine) -> None:
    make_queue(engine, "scale_a")
    due = enqueue_jobs(engine, "t", 3, queue="scale_a")
    enqueue_jobs(engine, "t", 2, queue="scale_a", delay=3600)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET run_at = now() - interval '90 seconds', "
                "priority = CASE WHEN id = :first THEN 5 ELSE 0 END WHERE id = ANY(:ids)"
            ),
            {"ids": due, "first": due[0]},
        )
        conn.execute(
            text("UPDATE sqla_queue.jobs SET run_at = now() - interval '10 minutes' WHERE id = :i"),
            {"i": due[0]},
        )
    found = signal(engine)["scale_a"]
    assert found.ready == 3
    assert not found.ready_estimated
    # the oldest is at the lowest-urgency priority: every priority's first job is looked at
    assert 600 <= found.oldest_ready_age < 3600
    assert found.running == 0
    assert found.workers == 0
    assert found.free_slots == 0


def test_a_queue_with_nothing_due_reads_zero(engine: Engine) -> None:
    make_queue(engine, "scale_idle")
    enqueue_jobs(engine, "t", 1, queue="scale_idle", delay=3600)
    found = signal(engine, "scale_idle")
    assert list(found) == ["scale_idle"]
    assert found["scale_idle"].ready == 0
    assert found["scale_idle"].oldest_ready_age == 0.0


def test_past_the_cap_ready_is_the_planners_estimate(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_queue(engine, "scale_big")
    enqueue_jobs(engine, "t", 30, queue="scale_big")
    with engine.begin() as conn:
        conn.execute(text("ANALYZE sqla_queue.jobs"))
    monkeypatch.setattr(scaling, "READY_CAP", 10)
    found = signal(engine, "scale_big")["scale_big"]
    assert found.ready_estimated
    assert found.ready >= 10


def test_a_worker_counts_from_its_start_and_not_after_its_stop(engine: Engine) -> None:
    make_queue(engine, "scale_w")
    make_queue(engine, "scale_other")
    registry = Registry()
    seen: list[dict[str, QueueScaling]] = []

    @registry.on_worker_started
    def started(worker: Any) -> None:
        seen.append(signal(engine))

    with WorkerThread(engine, registry, queues=["scale_w"], concurrency=3, heartbeat=1) as w:
        wait_for(lambda: seen, timeout=30)
    assert w.stats is not None
    # when the worker's start hooks run, it already counts: registered before it claims
    assert seen[0]["scale_w"].workers == 1
    assert seen[0]["scale_w"].free_slots == 3
    assert seen[0]["scale_other"].workers == 0  # it does not serve that queue
    # once it stopped gracefully, it is gone from the signal at once (deregistered)
    after = signal(engine)
    assert after["scale_w"].workers == 0
    assert after["scale_w"].free_slots == 0


def test_running_jobs_take_their_workers_free_slots(engine: Engine) -> None:
    make_queue(engine, "scale_r")
    ids = enqueue_jobs(engine, "t", 2, queue="scale_r")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.workers (id, hostname, pid, queues, concurrency, "
                "expires_at) VALUES ('w-live', 'h', 1, NULL, 4, now() + interval '1 minute'), "
                "('w-expired', 'h', 2, NULL, 8, now() - interval '1 second')"
            )
        )
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'running', attempts = 1, "
                "locked_by = 'w-live', locked_at = now(), heartbeat_at = now(), "
                "lease_expires_at = now() + interval '1 minute' WHERE id = ANY(:ids)"
            ),
            {"ids": ids},
        )
        # one handler's start reported; the other job waits in the worker's buffer
        conn.execute(
            text("UPDATE sqla_queue.jobs SET started_at = now() WHERE id = :id"), {"id": ids[0]}
        )
    found = signal(engine, "scale_r")["scale_r"]
    assert (found.running, found.claimed) == (1, 1)
    assert found.workers == 1  # the expired registration is not live
    assert found.free_slots == 2


def test_rates_come_from_whole_minutes_of_arrivals_and_the_rollup(engine: Engine) -> None:
    make_queue(engine, "scale_rate")
    ids = enqueue_jobs(engine, "t", 6, queue="scale_rate")
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET created_at = date_trunc('minute', now()) "
                "- interval '2 minutes' WHERE id = ANY(:ids)"
            ),
            {"ids": ids},
        )
        conn.execute(
            text(
                "INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed, "
                "retried, run_seconds) VALUES "
                "(date_trunc('minute', now()) - interval '3 minutes', 'scale_rate', 't', 50, 10, "
                "0, 1.0), "
                "(date_trunc('minute', now()) - interval '30 minutes', 'scale_rate', 't', 999, "
                "0, 0, 1.0)"
            )
        )
    before = database_clock(engine)
    found = signal(engine, "scale_rate")["scale_rate"]
    after = database_clock(engine)
    if before.replace(second=0, microsecond=0) != after.replace(second=0, microsecond=0):
        pytest.skip("a minute turned during the read")
    assert found.completion_rate == round(60 / scaling.RATE_SECONDS, 3)
    # six still in the table, and 50 that succeeded and were deleted (retention delete)
    assert found.arrival_rate == round(56 / scaling.RATE_SECONDS, 3)
    assert found.arrival_rate_complete


def test_a_worker_whose_session_is_gone_is_not_live(engine: Engine) -> None:
    make_queue(engine, "scale_s")
    with engine.connect() as held:  # a session that is there while the signal reads
        live_pid = held.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as gone:  # one that has ended
            dead_pid = gone.execute(text("SELECT pg_backend_pid()")).scalar_one()
            gone.invalidate()  # closed, not returned to the pool: its backend ends
        wait_for(lambda: count_backends(engine, dead_pid) == 0, timeout=60)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO sqla_queue.workers (id, hostname, pid, queues, concurrency, "
                    "expires_at, session_pid) VALUES "
                    "('w-session', 'h', 1, NULL, 2, now() + interval '1 minute', :live), "
                    "('w-killed', 'h', 2, NULL, 4, now() + interval '1 minute', :dead), "
                    "('w-no-session', 'h', 3, NULL, 8, now() + interval '1 minute', NULL)"
                ),
                {"live": live_pid, "dead": dead_pid},
            )
        found = signal(engine, "scale_s")["scale_s"]
    assert found.workers == 2  # the killed one's registration has not expired: not counted
    assert found.free_slots == 2 + 8


def count_backends(engine: Engine, pid: int) -> int:
    with engine.begin() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one()
        )
