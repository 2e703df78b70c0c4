"""Fault injection against real `sqla-queue worker` processes: nothing committed is ever lost.

Each test kills, pauses, disconnects or starves real worker processes while they drain jobs
whose handlers (tests/helpers/apps/fault_app.py) record every execution (job id, attempt) in a
table of the test's own, then checks the accounting: every job finished, every job ran at
least once, and re-runs stay within what the faults can explain.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.fault_kit import (
    FaultDatabase,
    PrivateCluster,
    WorkerProcess,
    executions,
    fill_kept_queue,
    holding_workers,
    run_cli,
    wait_until,
)
from sqlalchemy import create_engine

from sqla_queue import admin
from sqla_queue.cli import WORKER_APPLICATION_NAME
from sqla_queue.db.migrate import upgrade

pytestmark = pytest.mark.slow

StartWorker = Callable[..., WorkerProcess]

# Sizes, scaled to keep the whole fault suite within a few minutes on a 2-core machine.
KILL_JOBS = 6000
KILL_WORKERS = 4
CONCURRENCY = 4
BATCH = 10
LEASE = "2"
FAULT_WINDOW = 40.0  # seconds of faults at most (a loaded machine drains slower); then drain
DRAIN_DEADLINE = 240.0


def assert_nothing_lost(db: FaultDatabase, ids: list[int], faults: int) -> dict[str, int]:
    """Every job done, each ran at least once, and re-runs are bounded by the faults."""
    assert db.status_counts() == {"done": len(ids)}
    runs = executions(db)
    never_ran = set(ids) - set(runs)
    assert not never_ran, f"{len(never_ran)} jobs marked done never ran"
    assert set(runs) <= set(ids)
    duplicates = sum(count - 1 for count in runs.values())
    assert duplicates <= faults * (BATCH + CONCURRENCY)
    return {
        "jobs": len(ids),
        "executions": sum(runs.values()),
        "duplicates": duplicates,
        "faults": faults,
        "lost": len(ids) - db.status_counts().get("done", 0),
    }


def worker_options(queue: str, lease: str = LEASE) -> list[str]:
    return [
        "-q",
        queue,
        "-c",
        str(CONCURRENCY),
        "--batch",
        str(BATCH),
        "--lease",
        lease,
        "--poll-interval",
        "0.5",
    ]


def test_sigkilled_workers_lose_no_job(
    fault_db: FaultDatabase, workers: StartWorker, record_property: Callable[[str, Any], None]
) -> None:
    ids = fill_kept_queue(
        fault_db.url, "kills", "record", [{"n": n, "work": 0.002} for n in range(KILL_JOBS)]
    )
    pool = [workers(fault_db.url, *worker_options("kills")) for _ in range(KILL_WORKERS)]
    rng = random.Random(5)
    kills = 0
    start = time.monotonic()
    while fault_db.unfinished():
        elapsed = time.monotonic() - start
        assert elapsed < DRAIN_DEADLINE, f"not drained: {fault_db.status_counts()}"
        time.sleep(0.5)
        if elapsed < FAULT_WINDOW:
            # a worker that holds jobs right now: a kill of one still starting up (a loaded
            # machine takes seconds) would orphan nothing and exercise nothing
            holders = holding_workers(fault_db, pool) or pool
            victim = rng.choice(holders)
            victim.kill()
            kills += 1
            victim.start()
    for worker in pool:
        worker.wait_started()
        assert worker.stop() == 0

    figures = assert_nothing_lost(fault_db, ids, kills)
    reaped = fault_db.value(
        "SELECT count(*) FROM sqla_queue.all_jobs WHERE last_error LIKE 'lease expired%%'"
    )
    assert reaped > 0, "no kill orphaned a job: the test did not exercise the reaper"
    record_property("figures", {**figures, "reaped": reaped})
    print(f"\nworker kills: {figures} reaped={reaped}")


def test_terminated_connections_are_reopened_and_lose_no_job(
    fault_db: FaultDatabase, workers: StartWorker, record_property: Callable[[str, Any], None]
) -> None:
    ids = fill_kept_queue(
        fault_db.url, "cuts", "record", [{"n": n, "work": 0.002} for n in range(KILL_JOBS)]
    )
    pool = [workers(fault_db.url, *worker_options("cuts")) for _ in range(KILL_WORKERS)]
    rounds = terminated = 0
    start = time.monotonic()
    while fault_db.unfinished():
        elapsed = time.monotonic() - start
        assert elapsed < DRAIN_DEADLINE, f"not drained: {fault_db.status_counts()}"
        time.sleep(0.3)
        if elapsed > FAULT_WINDOW:
            continue
        rounds += 1
        terminated += fault_db.value(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND application_name = %s",
            fault_db.name,
            WORKER_APPLICATION_NAME,
        )
    assert all(worker.alive() for worker in pool), "a worker died of a lost connection"
    for worker in pool:
        assert worker.stop() == 0

    figures = assert_nothing_lost(fault_db, ids, rounds * KILL_WORKERS)
    assert terminated > rounds, "the test terminated too few worker connections"
    assert any("reconnecting" in worker.log() for worker in pool)
    record_property("figures", {**figures, "connections_terminated": terminated})
    print(f"\nconnection kills: {figures} terminated={terminated} rounds={rounds}")


def job_row(db: FaultDatabase, job_id: int) -> tuple[Any, ...]:
    row = db.rows(
        "SELECT status, attempts, locked_by, finished_at, last_error FROM sqla_queue.all_jobs "
        "WHERE id = %s",
        job_id,
    )
    return row[0] if row else ()


def test_paused_worker_past_its_lease_changes_nothing_when_it_wakes(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    (job_id,) = fill_kept_queue(
        fault_db.url, "fence", "fenced_write", [{"key": "k", "first_attempt_sleeps": 3.0}]
    )
    sleeper = workers(fault_db.url, *worker_options("fence", lease="1"))
    wait_until(lambda: fault_db.events(job_id), 60, what="attempt 1 to start")
    sleeper.signal(signal.SIGSTOP)

    # The paused worker stops heartbeating: another worker reaps the job and runs attempt 2.
    rescuer = workers(fault_db.url, *worker_options("fence", lease="1"))
    wait_until(lambda: job_row(fault_db, job_id)[0] == "done", 60, what="attempt 2 to finish")
    finished = job_row(fault_db, job_id)
    assert finished[1] == 2
    assert rescuer.stop() == 0

    # Resumed, attempt 1 finishes its sleep, writes with a stale token, then reports success.
    sleeper.signal(signal.SIGCONT)
    wait_until(lambda: len(fault_db.events(job_id)) == 4, 60, what="attempt 1 to write")
    assert sleeper.stop() == 0

    assert fault_db.events(job_id) == [
        (1, "started"),
        (2, "started"),
        (2, "write accepted"),
        (1, "write rejected"),
    ]
    assert job_row(fault_db, job_id) == finished, "the late finish changed the job"
    assert fault_db.rows("SELECT value, fence FROM public.fault_ledger") == [
        ("written by attempt 2", 2)
    ]


def test_sigterm_lets_in_flight_jobs_finish_and_requeues_the_rest(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    # Long enough that none finishes (freeing a slot for a waiting job) before the SIGTERM.
    quick = fill_kept_queue(fault_db.url, "drain", "sleep", [{"seconds": 3.0}] * 64)
    waiting = fill_kept_queue(fault_db.url, "drain", "sleep", [{"seconds": 3.0}] * 20)
    worker = workers(
        fault_db.url, "-q", "drain", "-c", "64", "--batch", "20", "--shutdown-timeout", "20"
    )
    wait_until(
        lambda: fault_db.value("SELECT count(*) FROM public.fault_runs") >= 64,
        60,
        what="64 jobs in flight",
    )
    worker.signal(signal.SIGTERM)
    assert worker.proc is not None
    assert worker.proc.wait(60) == 0

    counts = dict(
        fault_db.rows(
            "SELECT status, count(*) FROM sqla_queue.all_jobs WHERE id = ANY(%s) GROUP BY 1",
            quick,
        )
    )
    assert counts == {"done": 64}, counts
    assert "running" not in fault_db.status_counts()
    # Claimed but never started: back to queued with the attempt refunded.
    unstarted = fault_db.rows(
        "SELECT status, attempts FROM sqla_queue.all_jobs WHERE id = ANY(%s)", waiting
    )
    assert set(unstarted) == {("queued", 0)}


def test_sigterm_requeues_jobs_still_running_after_the_shutdown_timeout(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    ids = fill_kept_queue(fault_db.url, "stuck", "sleep", [{"seconds": 600.0}] * 64)
    worker = workers(fault_db.url, "-q", "stuck", "-c", "64", "--shutdown-timeout", "1")
    wait_until(
        lambda: fault_db.value("SELECT count(*) FROM public.fault_runs") >= 64,
        60,
        what="64 jobs in flight",
    )
    worker.signal(signal.SIGTERM)
    assert worker.proc is not None
    # The handlers sleep ten minutes: a worker that waited for them would not exit before
    # this deadline (a guard against a hang, not a measure); its log says it gave up on them.
    assert worker.proc.wait(120) == 0, "the worker waited for its handlers to return"

    rows = fault_db.rows("SELECT status, attempts FROM sqla_queue.all_jobs WHERE id = ANY(%s)", ids)
    # Interrupted mid-run: queued again, the attempt kept (a job that always hangs still fails).
    assert set(rows) == {("queued", 1)}
    assert "still running after the 1.0s shutdown timeout" in worker.log()


def test_worker_waits_for_the_database_at_start_and_survives_a_restart_mid_run(
    cluster: PrivateCluster, workers: StartWorker
) -> None:
    cluster.start()
    cluster.create_database()
    upgrade(create_engine(cluster.url))
    db = FaultDatabase(cluster.url)
    before = fill_kept_queue(cluster.url, "outage", "record", [{"n": n} for n in range(20)])
    db.close()
    cluster.stop()

    # Nothing listens on the port: the worker says so and keeps trying.
    worker = workers(cluster.url, *worker_options("outage"))
    wait_until(lambda: "database unavailable" in worker.log(), 60, what="a retry log line")
    assert worker.alive()
    assert "retrying in" in worker.log()

    cluster.start()
    db = FaultDatabase(cluster.url)
    try:
        wait_until(lambda: not db.unfinished(), 60, what="the first jobs to run")
        # Mid-run: a fast shutdown terminates every session while handlers are running.
        during = fill_kept_queue(
            cluster.url, "outage", "record", [{"n": n, "work": 0.02} for n in range(400)]
        )
        wait_until(lambda: executions(db), 60, what="the second batch to start")
        db.close()
        cluster.stop()
        time.sleep(1)
        cluster.start()
        db = FaultDatabase(cluster.url)
        wait_until(lambda: not db.unfinished(), 90, what="the second batch to run")
        assert worker.alive()
        assert db.status_counts() == {"done": len(before) + len(during)}
        assert set(executions(db)) == set(before) | set(during)
        assert "database connection lost" in worker.log()
        worker.wait_started()
        assert worker.stop() == 0
    finally:
        db.close()


def final_status(db: FaultDatabase, ids: list[int]) -> dict[int, tuple[str, int]]:
    return {
        job_id: (status, attempts)
        for job_id, status, attempts in db.rows(
            "SELECT id, status, attempts FROM sqla_queue.all_jobs WHERE id = ANY(%s)", ids
        )
    }


def test_overrunning_handlers_time_out_and_follow_the_retry_rules(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    # Each task has timeout=0.5 and max_attempts=2 (fault_app).
    sync_fails, sync_retried = fill_kept_queue(
        fault_db.url,
        "timeouts",
        "sync_overrun",
        # at most 60 s: each returns once told of its timeout (not told: late, cancelled=False)
        [{"seconds": 60}, {"seconds": 60, "succeed_on_attempt": 2}],
    )
    async_fails, async_retried = fill_kept_queue(
        fault_db.url,
        "timeouts",
        "async_overrun",
        [{"seconds": 30}, {"seconds": 30, "succeed_on_attempt": 2}],
    )
    ids = [sync_fails, sync_retried, async_fails, async_retried]
    worker = workers(fault_db.url, "-q", "timeouts", "-c", "4")
    late = "returned late, cancelled=True"
    wait_until(
        lambda: (
            not fault_db.unfinished()
            and [e for _, e in fault_db.events(sync_fails)].count(late) == 2
            and (1, late) in fault_db.events(sync_retried)
        ),
        60,
        what="every job to finish and the sync handlers to return",
    )
    assert worker.stop() == 0

    assert final_status(fault_db, ids) == {
        sync_fails: ("failed", 2),
        sync_retried: ("done", 2),
        async_fails: ("failed", 2),
        async_retried: ("done", 2),
    }
    # Sync: cannot be interrupted; told through ctx.cancelled, its late return is discarded.
    assert sorted(fault_db.events(sync_fails)) == [
        (1, late),
        (1, "started"),
        (2, late),
        (2, "started"),
    ]
    assert sorted(fault_db.events(sync_retried)) == [
        (1, late),
        (1, "started"),
        (2, "returned in time"),
        (2, "started"),
    ]
    # Async: cancelled at the timeout, so it never returns late.
    assert fault_db.events(async_fails) == [
        (1, "started"),
        (1, "cancelled"),
        (2, "started"),
        (2, "cancelled"),
    ]
    assert fault_db.events(async_retried) == [
        (1, "started"),
        (1, "cancelled"),
        (2, "started"),
        (2, "returned in time"),
    ]
    errors = fault_db.rows(
        "SELECT last_error FROM sqla_queue.all_jobs WHERE id = ANY(%s)", [sync_fails, async_fails]
    )
    assert all("ran longer than its timeout of 0.5 s" in error for (error,) in errors)


def test_cancelled_jobs_never_run_and_running_ones_see_it(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    by_cli, by_api, *others = fill_kept_queue(
        fault_db.url, "cancels", "record", [{"n": n} for n in range(6)]
    )
    running_cli, running_api = fill_kept_queue(
        fault_db.url, "cancels", "cooperative", [{"seconds": 60}] * 2
    )
    engine = create_engine(fault_db.url)

    def cancel_by_api(job_id: int) -> dict[int, str]:
        with engine.begin() as conn:
            return admin.cancel_jobs(conn, [job_id])

    try:
        # Queued: cancelled before any worker runs.
        result = run_cli(["jobs", "cancel", str(by_cli)], fault_db.url)
        assert result.returncode == 0, result.stderr
        assert f"job {by_cli}: cancelled (was queued)" in result.stdout
        assert cancel_by_api(by_api) == {by_api: "queued"}

        worker = workers(fault_db.url, *worker_options("cancels", lease="1"))
        wait_until(
            lambda: fault_db.events(running_cli) and fault_db.events(running_api),
            60,
            what="both long jobs to start",
        )
        result = run_cli(["jobs", "cancel", str(running_cli)], fault_db.url)
        assert result.returncode == 0, result.stderr
        assert f"job {running_cli}: cancelled (was running)" in result.stdout
        assert cancel_by_api(running_api) == {running_api: "running"}
        wait_until(
            lambda: all(
                (1, "saw cancelled") in fault_db.events(i) for i in (running_cli, running_api)
            ),
            60,
            what="the handlers to see the cancellation",
        )
        time.sleep(2.5)  # more than two leases: a cancelled job must not be reaped and rerun
        worker.wait_started()
        assert worker.stop() == 0

        # Finished jobs cannot be cancelled: a clear line and exit status 1.
        result = run_cli(["jobs", "cancel", str(others[0])], fault_db.url)
        assert result.returncode == 1
        assert "not cancelled, it already finished" in result.stdout
        assert cancel_by_api(others[0]) == {}
    finally:
        engine.dispose()

    assert fault_db.events(by_cli) == fault_db.events(by_api) == []
    for job_id in (running_cli, running_api):
        assert fault_db.events(job_id) == [(1, "started"), (1, "saw cancelled")]
    statuses = final_status(fault_db, [by_cli, by_api, running_cli, running_api, *others])
    assert statuses == {
        by_cli: ("cancelled", 0),
        by_api: ("cancelled", 0),
        running_cli: ("cancelled", 1),
        running_api: ("cancelled", 1),
        **dict.fromkeys(others, ("done", 1)),
    }
