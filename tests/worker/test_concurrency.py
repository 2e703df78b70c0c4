"""Many workers at once: every job done exactly once, claims bounded, reapers and fencing safe."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from helpers.support import (
    WorkerThread,
    create_task_log,
    enqueue_jobs,
    jobs_by_id,
    record_attempt,
    stall_and_reap,
    start_worker_process,
    task_log,
)
from sqlalchemy import Connection, Engine, text

from sqla_queue import JobContext, Registry, admin
from sqla_queue.db import queries

JOBS = 10_000
WORKERS = 8


@pytest.fixture
def ten_thousand_jobs(engine: Engine) -> list[int]:
    """10,000 `record` jobs on the default queue, which keeps finished rows to check them."""
    create_task_log(engine)
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    return enqueue_jobs(engine, "record", JOBS)


def assert_each_done_exactly_once(engine: Engine, ids: list[int]) -> None:
    log = task_log(engine)
    runs = Counter(job_id for job_id, _ in log)
    assert len(log) == len(ids), f"{len(log) - len(ids)} extra runs"
    assert set(runs) == set(ids), "some jobs never ran"
    assert max(runs.values()) == 1, [job for job, n in runs.items() if n > 1][:10]
    assert {attempt for _, attempt in log} == {1}
    jobs = jobs_by_id(engine)
    assert Counter(job.status for job in jobs.values()) == {"done": len(ids)}
    assert {job.attempts for job in jobs.values()} == {1}


def on_connections(engine: Engine, count: int, work: Callable[[Connection], Any]) -> list[Any]:
    """Run `work` on `count` autocommit connections at once (released by a barrier)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("SELECT 1"))
                barrier.wait(60)
                results[index] = work(conn)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


# -- draining ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_eight_worker_threads_drain_10000_jobs_each_exactly_once(
    database_url: str, engine: Engine, ten_thousand_jobs: list[int]
) -> None:
    registry = Registry()

    @registry.task(name="record", pass_context=True)
    def record(ctx: JobContext) -> None:
        record_attempt(database_url, ctx.job_id, ctx.attempt)

    workers = [
        WorkerThread(engine, registry, burst=True, concurrency=2, batch=20) for _ in range(WORKERS)
    ]
    for worker in workers:
        worker.thread.start()
    for worker in workers:
        worker.thread.join(120)
    stats = [worker.stop() for worker in workers]

    assert_each_done_exactly_once(engine, ten_thousand_jobs)
    assert sum(s.succeeded for s in stats) == JOBS
    assert sum(s.claimed for s in stats) == JOBS
    assert all(s.claimed > 0 for s in stats), "every worker got a share"


@pytest.mark.slow
def test_eight_worker_processes_drain_10000_jobs_each_exactly_once(
    database_url: str, engine: Engine, ten_thousand_jobs: list[int]
) -> None:
    processes = [
        start_worker_process(database_url, "--burst", "-c", "2", "--batch", "20")
        for _ in range(WORKERS)
    ]
    outputs = [process.communicate(timeout=150) for process in processes]

    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr
    assert_each_done_exactly_once(engine, ten_thousand_jobs)
    with engine.connect() as conn:
        pids = conn.scalar(text("SELECT count(DISTINCT pid) FROM public.task_log"))
    assert pids is not None
    assert pids > 1, "the jobs were shared between processes"


# -- claiming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 7])
def test_claim_with_limit_never_returns_more_than_limit_under_contention(
    engine: Engine, limit: int
) -> None:
    ids = enqueue_jobs(engine, "t", 1500)
    claim = queries.claim_jobs(None)

    def claim_until_empty(conn: Connection) -> list[list[int]]:
        batches = []
        while True:
            rows = conn.execute(claim, {"limit": limit, "worker_id": "w"}).all()
            if not rows:
                return batches
            batches.append([row[0] for row in rows])

    per_connection = on_connections(engine, WORKERS, claim_until_empty)
    batches = [batch for batches in per_connection for batch in batches]
    # A claim may come up empty while others hold the last rows: collect any leftovers.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        batches.extend(claim_until_empty(conn))
    claimed = [job_id for batch in batches for job_id in batch]

    assert max(len(batch) for batch in batches) <= limit
    assert len(claimed) == len(set(claimed)) == len(ids), "a job was claimed twice or lost"
    assert set(claimed) == set(ids)
    assert sum(1 for batches in per_connection if batches) > 1, "the claims really contended"


def test_two_reapers_at_once_requeue_each_stale_job_exactly_once(engine: Engine) -> None:
    ids = enqueue_jobs(engine, "t", 600)
    with engine.begin() as conn:
        conn.execute(queries.claim_jobs(None), {"limit": 1000, "worker_id": "dead"})
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET started_at = now(), "
                "lease_expires_at = now() - interval '1 hour'"
            )
        )
    reap = queries.reap_stale_jobs()

    def reap_until_empty(conn: Connection) -> list[int]:
        reaped: list[int] = []
        while rows := conn.execute(reap, {"lease": 60}).all():
            reaped.extend(row.id for row in rows)
        return reaped

    first, second = on_connections(engine, 2, reap_until_empty)

    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(ids)
    jobs = jobs_by_id(engine).values()
    assert {(job.status, job.attempts, job.locked_by) for job in jobs} == {("queued", 1, None)}


def test_reaper_leaves_jobs_with_a_fresh_heartbeat(engine: Engine) -> None:
    enqueue_jobs(engine, "t", 3)
    with engine.begin() as conn:
        conn.execute(queries.claim_jobs(None), {"limit": 3, "worker_id": "alive"})
        assert conn.execute(queries.reap_stale_jobs(), {"lease": 60}).all() == []
    assert {job.status for job in jobs_by_id(engine).values()} == {"running"}


# -- fencing ----------------------------------------------------------------------------------


def _ended_claim_statements() -> dict[str, tuple[Any, dict[str, list[Any]]]]:
    """Every statement that ends or extends a claim, with the parameters of one job."""
    return {
        "complete_keep": (queries.complete_keep(), {}),
        "complete_delete": (queries.complete_delete(), {}),
        "complete_archive": (queries.complete_archive(), {}),
        "retry": (queries.retry_jobs(), {"job_delays": [0.0], "job_errors": ["stale"]}),
        "fail": (queries.fail_jobs(), {"job_errors": ["stale"]}),
        "release": (queries.release_jobs(), {"job_refunds": [1]}),
        "heartbeat": (queries.heartbeat_jobs(), {"job_leases": [60.0], "job_started": [True]}),
    }


@pytest.mark.parametrize("statement", sorted(_ended_claim_statements()))
def test_stale_attempt_cannot_finish_fail_retry_release_or_heartbeat(
    engine: Engine, statement: str
) -> None:
    (job_id,) = enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "stale"})
    assert stall_and_reap(engine) == 2
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET heartbeat_at = now() - interval '5 minutes', "
                "lease_expires_at = now() - interval '5 minutes'"
            )
        )
    before = jobs_by_id(engine)[job_id]
    query, extra = _ended_claim_statements()[statement]

    with engine.begin() as conn:
        conn.execute(query, {"job_ids": [job_id], "job_attempts": [1], **extra})

    after = jobs_by_id(engine)[job_id]
    assert (after.status, after.attempts, after.locked_by, after.heartbeat_at) == (
        "running",
        2,
        "successor",
        before.heartbeat_at,
    )
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM sqla_queue.jobs_history")) == 0
    # The current attempt still can: the statement itself works.
    with engine.begin() as conn:
        conn.execute(query, {"job_ids": [job_id], "job_attempts": [2], **extra})
    current = jobs_by_id(engine).get(job_id)
    assert current is None or (current.status, current.heartbeat_at) != (
        "running",
        before.heartbeat_at,
    )


def test_cancelled_running_job_cannot_be_finished_by_its_worker(engine: Engine) -> None:
    (job_id,) = enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w"})
        assert admin.cancel_jobs(conn, [job_id]) == {job_id: "running"}
        params = {"job_ids": [job_id], "job_attempts": [1]}
        assert conn.execute(queries.complete_delete(), params).rowcount == 0
        beat = {**params, "job_leases": [60.0], "job_started": [True]}
        # its handler may still run: the lease (its queue slot) is kept, the worker told
        assert conn.execute(queries.heartbeat_jobs(), beat).all() == [(job_id, "cancelled")]
        assert (
            conn.execute(
                queries.retry_jobs(), {**params, "job_delays": [0.0], "job_errors": ["x"]}
            ).rowcount
            == 0
        )
    assert jobs_by_id(engine)[job_id].status == "cancelled"
