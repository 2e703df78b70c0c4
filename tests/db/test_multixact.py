"""The essay's MultiXact sources, measured on a real cluster: our paths mint none.

A MultiXact count is the change in `next_multixact_id` of `pg_control_checkpoint()`, with
a CHECKPOINT before each reading. The counter is cluster-wide, so these tests run on a
private cluster (see `multixact_support`).
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers.multixact_support import (
    add_queue_fk,
    count_multixacts,
    enqueue_concurrently,
    run_naive_savepoint_worker,
    tagged_engine,
)
from helpers.support import enqueue_jobs
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from sqla_queue import HistoryJob, Job, JobContext, Registry, RetryPolicy
from sqla_queue.admin import create_queue
from sqla_queue.worker import Worker, WorkerConfig

pytestmark = pytest.mark.slow

WORKERS = 8
TOTAL_JOBS = 20_000
FLAKY = 2_000
DOOMED = 500
SLOW = 40
STALE = 60


def _mixed_registry(heartbeats: list[bool]) -> Registry:
    """Tasks that exercise every finishing path: success, retry, failure, heartbeat."""
    registry = Registry()
    no_wait = RetryPolicy(base=0, jitter=0)

    @registry.task(name="noop")
    def noop() -> None:
        pass

    @registry.task(name="flaky", retry=no_wait, pass_context=True)
    def flaky(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    @registry.task(name="doomed", retry=no_wait, max_attempts=2)
    def doomed() -> None:
        raise RuntimeError("always fails")

    @registry.task(name="slow", pass_context=True)
    def slow(ctx: JobContext) -> None:
        time.sleep(0.3)
        heartbeats.append(ctx.heartbeat())
        time.sleep(0.3)

    return registry


def _insert_stale_running_jobs(engine: Engine, count: int) -> None:
    """Jobs a crashed worker left running an hour ago: only the reaper brings them back."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs (task, status, attempts, locked_by, locked_at,"
                " heartbeat_at) SELECT 'noop', 'running', 1, 'crashed', now() - interval '1 hour',"
                " now() - interval '1 hour' FROM generate_series(1, :n)"
            ),
            {"n": count},
        )


def _unfinished(engine: Engine) -> int:
    with Session(engine) as session:
        return int(
            session.scalar(select(func.count()).where(Job.status.in_(["queued", "running"]))) or 0
        )


def test_worker_claim_heartbeat_finish_retry_and_reap_mint_no_multixacts(
    private_queue_engine: Engine, private_admin: Engine
) -> None:
    with private_queue_engine.begin() as conn:
        create_queue(conn, "kept", "keep")
        create_queue(conn, "archived", "archive")
    plain = TOTAL_JOBS - FLAKY - DOOMED - SLOW - STALE
    for queue in ("default", "kept", "archived"):
        enqueue_jobs(private_queue_engine, "noop", plain // 3, queue=queue)
    enqueue_jobs(private_queue_engine, "noop", plain - 3 * (plain // 3))
    enqueue_jobs(private_queue_engine, "flaky", FLAKY)
    enqueue_jobs(private_queue_engine, "doomed", DOOMED)
    enqueue_jobs(private_queue_engine, "slow", SLOW)
    _insert_stale_running_jobs(private_queue_engine, STALE)
    heartbeats: list[bool] = []
    registry = _mixed_registry(heartbeats)
    workers = [
        Worker(
            private_queue_engine,
            registry,
            WorkerConfig(concurrency=4, batch=50, lease=2.0, poll_interval=0.2),
        )
        for _ in range(WORKERS)
    ]

    def run_all() -> None:
        threads = [
            threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
            for worker in workers
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while _unfinished(private_queue_engine) and time.monotonic() < deadline:
            time.sleep(0.2)
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(30)

    minted = count_multixacts(private_admin, run_all)

    assert _unfinished(private_queue_engine) == 0
    with Session(private_queue_engine) as session:
        kept = session.scalar(select(func.count()).where(HistoryJob.queue == "kept"))
        failed = session.scalar(select(func.count()).where(Job.status == "failed"))
        archived = session.scalar(select(func.count()).where(HistoryJob.queue == "archived"))
    assert kept == plain // 3
    assert archived == plain // 3
    assert failed == DOOMED
    reaped = sum(w.stats.reaped for w in workers)
    retried = sum(w.stats.retried for w in workers)
    assert reaped >= STALE
    # Each flaky or doomed job failed an attempt (a retry) or, on a loaded machine, lost
    # its unstarted lease to the reaper, which gives the attempt back (a reap, no retry).
    assert retried > 0
    assert retried + reaped >= FLAKY + DOOMED + STALE
    assert heartbeats
    assert all(heartbeats)
    assert minted == 0


def test_concurrent_enqueue_mints_multixacts_with_the_fk_and_none_with_the_queue_check(
    private_queue_engine: Engine, private_admin: Engine
) -> None:
    checked = count_multixacts(
        private_admin, lambda: enqueue_concurrently(private_queue_engine, 8, 20)
    )
    add_queue_fk(private_queue_engine)  # as a schema before sqlaq_0031 had it
    with_fk = count_multixacts(
        private_admin, lambda: enqueue_concurrently(private_queue_engine, 8, 20)
    )

    # The foreign key KEY SHARE-locked the queue's row per insert; its triggers lock nothing.
    assert with_fk > 0
    assert checked == 0


def test_naive_savepoint_worker_mints_a_multixact_per_job(
    private_queue_engine: Engine, private_admin: Engine
) -> None:
    enqueue_jobs(private_queue_engine, "noop", 200)

    minted = count_multixacts(
        private_admin, lambda: run_naive_savepoint_worker(private_queue_engine)
    )

    assert _unfinished(private_queue_engine) == 0
    assert minted >= 200


def test_worker_holds_no_transaction_open_while_a_handler_runs(
    private_url: str, private_admin: Engine
) -> None:
    engine, app_name = tagged_engine(private_url)
    started = threading.Event()
    release = threading.Event()
    registry = Registry()

    @registry.task(name="slow")
    def slow() -> None:
        started.set()
        release.wait(30)

    enqueue_jobs(engine, "slow", 2)
    worker = Worker(engine, registry, WorkerConfig(concurrency=2, batch=2, lease=60))
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        assert started.wait(30)
        time.sleep(0.3)  # both handlers are sleeping; nothing else is due for 15 s
        with private_admin.connect() as conn:
            ours = conn.execute(
                text(
                    "SELECT state, backend_xmin::text, backend_xid::text FROM pg_stat_activity"
                    " WHERE application_name = :name"
                ),
                {"name": app_name},
            ).all()
    finally:
        release.set()
        worker.stop()
        thread.join(30)
        engine.dispose()

    assert ours, "the worker's connections should be visible under its application_name"
    assert all(state != "idle in transaction" for state, _, _ in ours)
    assert [(xmin, xid) for _, xmin, xid in ours] == [(None, None)] * len(ours)
    assert worker.stats.succeeded == 2
