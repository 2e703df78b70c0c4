"""How cleanly real worker processes recover: a SIGKILLed worker's jobs run elsewhere once
its registration expires (long before their lease ends), a crash refunds the attempts of
jobs that never started, a second SIGTERM exits without waiting for the handlers, the
worker reconnects after a database restart (retrying at most a second apart), and a burst
worker gives up on an unreachable database. No test measures how long these take (the
suite runs on loaded machines): each asserts what the worker decided, by the database's
clock where a time matters, under a deadline that only guards against a hang."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.fault_kit import (
    FaultDatabase,
    PrivateCluster,
    WorkerProcess,
    free_port,
    run_cli,
    wait_until,
)
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from sqla_queue import admin, enqueue_many
from sqla_queue.db.migrate import upgrade
from sqla_queue.worker.connection import MAX_BACKOFF, backoff_delays

pytestmark = pytest.mark.slow

StartWorker = Callable[..., WorkerProcess]


def enqueue(url: str, queue: str, jobs: list[dict[str, Any]]) -> list[int]:
    engine = create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            admin.create_queue(session, queue, "keep")
            return enqueue_many(session, [{"queue": queue, **job} for job in jobs])
    finally:
        engine.dispose()


def started_at(db: FaultDatabase, job_id: int, attempt: int) -> float | None:
    """When (epoch seconds, database clock) this attempt of the job recorded 'started'."""
    return db.value(
        "SELECT extract(epoch FROM at) FROM public.fault_runs "
        "WHERE job_id = %s AND attempt = %s AND event = 'started'",
        job_id,
        attempt,
    )


def test_a_sigkilled_workers_jobs_run_elsewhere_once_its_registration_expires(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    """The reaper takes the job back because its worker stopped beating (`dead_after`, 6 s),
    not because the job's own lease (60 s) ran out: attempt 2 starts, by the database's
    clock, before the lease attempt 1 held when its worker died. A load that slows the
    rescuer by seconds cannot fail this; a reaper that waited for the lease would."""
    # Attempt 1 sleeps for ten minutes; attempt 2 writes at once.
    (job_id,) = enqueue(
        fault_db.url,
        "kill",
        [{"task": "fenced_write", "args": {"key": "k", "first_attempt_sleeps": 600}}],
    )
    victim = workers(fault_db.url, "-q", "kill", "--lease", "60")
    wait_until(lambda: started_at(fault_db, job_id, 1), 180, what="attempt 1 to start")
    rescuer = workers(fault_db.url, "-q", "kill", "--lease", "60")
    rescuer.wait_started(180)
    wait_until(  # the victim's keeper has reported the job started
        lambda: fault_db.value("SELECT started_at FROM sqla_queue.all_jobs WHERE id = %s", job_id),
        60,
        what="the victim's keeper to report attempt 1 started",
    )
    victim.kill()
    # No keeper extends it any more: the lease attempt 1 holds from here on.
    lease_end = fault_db.value(
        "SELECT extract(epoch FROM lease_expires_at) FROM sqla_queue.all_jobs WHERE id = %s", job_id
    )
    assert lease_end is not None

    wait_until(lambda: started_at(fault_db, job_id, 2), 120, what="attempt 2 to start")
    restarted = float(started_at(fault_db, job_id, 2))
    assert restarted < float(lease_end), "the job waited for its lease, not its worker's"
    lost = fault_db.value(
        "SELECT errors -> 0 ->> 'message' FROM sqla_queue.all_jobs WHERE id = %s", job_id
    )
    assert "stopped heartbeating" in str(lost)  # the reaper ended attempt 1
    wait_until(lambda: not fault_db.unfinished(), 180, what="attempt 2 to finish")
    assert rescuer.stop() == 0
    assert fault_db.status_counts() == {"done": 1}


def test_a_crash_refunds_the_attempts_of_claimed_jobs_that_never_started(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    """Defect 10: batch 10, max_attempts 1, one SIGKILL: only the started job is used up."""
    (long,) = enqueue(
        fault_db.url,
        "crash",
        [{"task": "sleep", "args": {"seconds": 600}, "max_attempts": 1, "priority": 0}],
    )
    waiting = enqueue(
        fault_db.url,
        "crash",
        [{"task": "record", "args": {"n": n}, "max_attempts": 1, "priority": 1} for n in range(9)],
    )
    victim = workers(fault_db.url, "-q", "crash", "-c", "1", "--batch", "10")
    wait_until(lambda: started_at(fault_db, long, 1), 180, what="the long job to start")
    wait_until(
        lambda: (
            fault_db.value("SELECT count(*) FROM sqla_queue.all_jobs WHERE status = 'running'")
            == 10
        ),
        120,
        what="the whole batch to be held",
    )
    wait_until(  # its keeper has reported which held job started (the heartbeat writes it)
        lambda: fault_db.value(
            "SELECT started_at IS NOT NULL FROM sqla_queue.jobs WHERE id = %s", long
        ),
        120,
        what="the heartbeat to report the long job started",
    )
    victim.kill()
    rescuer = workers(fault_db.url, "-q", "crash", "-c", "4")
    wait_until(lambda: not fault_db.unfinished(), 180, what="every job to be settled")
    assert rescuer.stop() == 0

    rows = dict(
        fault_db.rows("SELECT id, status FROM sqla_queue.all_jobs WHERE id = ANY(%s)", waiting)
    )
    assert set(rows.values()) == {"done"}, rows
    status, error = fault_db.rows(
        "SELECT status, last_error FROM sqla_queue.all_jobs WHERE id = %s", long
    )[0]
    assert status == "failed"
    assert "during attempt 1, the last of 1" in error


def test_a_second_sigterm_exits_without_waiting_and_requeues_held_jobs(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    """Defect 8: released on a fresh connection with a timeout, then always exit. The
    handlers sleep ten minutes and the shutdown timeout is ten minutes: a worker that
    waited for either would not exit before the deadline (a guard against a hang, not a
    measure); exit status 1 says it took the second signal's path, the rows that it released
    its jobs."""
    ids = enqueue(fault_db.url, "term", [{"task": "sleep", "args": {"seconds": 600}}] * 3)
    worker = workers(fault_db.url, "-q", "term", "-c", "2", "--shutdown-timeout", "600")
    wait_until(
        lambda: fault_db.value("SELECT count(*) FROM public.fault_runs") == 2,
        180,
        what="two jobs in flight",
    )
    worker.wait_started(180)
    worker.signal(signal.SIGTERM)
    wait_until(  # the first SIGTERM was taken: the worker is draining
        lambda: "finishing in-flight jobs" in worker.log(), 180, what="the first SIGTERM's line"
    )
    worker.signal(signal.SIGTERM)
    assert worker.proc is not None
    assert worker.proc.wait(120) == 1
    rows = fault_db.rows("SELECT status, attempts FROM sqla_queue.all_jobs WHERE id = ANY(%s)", ids)
    assert sorted(rows) == [("queued", 0), ("queued", 1), ("queued", 1)]


def test_reconnection_attempts_double_from_50_ms_to_at_most_a_second_apart() -> None:
    """What keeps a worker within about a second of a database that comes back: the delays
    it chooses between attempts (each jittered to between half and all of its step). The
    decision itself, so no clock: how soon a loaded machine runs the next attempt is not
    the worker's to decide."""
    delays = list(itertools.islice(backoff_delays(), 40))
    for n, delay in enumerate(delays):
        step = min(0.05 * 2**n, MAX_BACKOFF)
        assert step / 2 <= delay <= step, (n, delay)
    assert MAX_BACKOFF == 1.0


def test_after_a_database_restart_the_worker_reconnects_and_takes_new_jobs(
    cluster: PrivateCluster, workers: StartWorker
) -> None:
    """The worker waits out the outage and comes back on its own: with a ten-minute poll
    interval, only a worker whose connections (its LISTEN one too) came back takes the job
    enqueued after the restart before the deadline (a guard against a hang; how soon it
    comes back is the backoff's, asserted above). It logs the outage tersely."""
    cluster.start()
    cluster.create_database()
    upgrade(create_engine(cluster.url))
    db = FaultDatabase(cluster.url)
    enqueue(cluster.url, "restart", [{"task": "record", "args": {"n": 0}}])
    worker = workers(cluster.url, "-q", "restart", "--poll-interval", "600")
    wait_until(lambda: not db.unfinished(), 180, what="the first job")
    db.close()

    cluster.stop()
    time.sleep(5)  # long enough for a doubling backoff to have reached its cap
    cluster.start()
    db = FaultDatabase(cluster.url)
    try:
        enqueue(cluster.url, "restart", [{"task": "record", "args": {"n": 1}}])
        wait_until(lambda: not db.unfinished(), 180, what="the job after the restart")
        wait_until(
            lambda: "database reachable again" in worker.log(), 180, what="the recovery's line"
        )
        log = worker.log()
        # One line per kind of failure, not one per attempt; never a statement.
        assert log.count("database unavailable") <= 1
        assert log.count("LISTEN connection lost") <= 1
        assert "SELECT" not in log
        assert "UPDATE" not in log
        assert worker.stop() == 0
    finally:
        db.close()


def test_a_burst_worker_gives_up_on_an_unreachable_database() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    # The process's own deadline fails the test on a hang (a worker that never gave up);
    # it measures nothing: the interpreter alone may start slowly on a loaded machine.
    result = run_cli(
        ["worker", "--app", "helpers.apps.fault_app:registry", "--burst", "--give-up-after", "1.5"],
        url,
        timeout=180,
    )
    assert result.returncode == 1
    assert "did not answer for 1.5 s" in result.stderr  # it gave up at its own limit
    assert "Traceback" not in result.stderr
