"""A job's lease while it runs: heartbeats that keep it, a reclaim that takes it over."""

from __future__ import annotations

import threading
import time

from helpers.support import WorkerThread, count_where, enqueue_jobs, jobs_by_id, wait_for
from sqlalchemy import Connection, Engine, text

from sqla_queue import JobContext, Registry, RetryPolicy, admin
from sqla_queue.db import queries

NO_WAIT = RetryPolicy(base=0, jitter=0)


def test_a_job_reclaimed_by_the_same_worker_keeps_its_new_attempt_alive(engine: Engine) -> None:
    """Defect 1: the old attempt's late finish must not drop the new attempt's entry."""
    registry = Registry()
    started: list[int] = []

    @registry.task(name="slow", pass_context=True, retry=NO_WAIT)
    def slow(ctx: JobContext) -> None:
        started.append(ctx.attempt)
        time.sleep(3 if ctx.attempt == 1 else 4)  # each longer than the 1 s lease

    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (job_id,) = enqueue_jobs(engine, "slow", 1)
    with WorkerThread(engine, registry, lease=1, concurrency=2, poll_only=False) as runner:
        wait_for(lambda: started == [1])
        with engine.begin() as conn:  # reaped from outside while attempt 1 runs
            conn.execute(
                text(
                    "UPDATE sqla_queue.jobs SET started_at = now(), "
                    "lease_expires_at = now() - interval '1 second'"
                )
            )
            assert len(conn.execute(queries.reap_stale_jobs()).all()) == 1
        # The same worker claims attempt 2; attempt 1 finishes (fenced off) meanwhile.
        wait_for(lambda: count_where(engine, "status = 'done'") == 1, timeout=60)
        reaped_by_worker = runner.worker.stats.reaped
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts) == ("done", 2)
    assert started == [1, 2]
    assert reaped_by_worker == 0  # attempt 2 kept its heartbeats


def test_one_locked_row_does_not_stop_the_heartbeats_of_the_others(engine: Engine) -> None:
    """Defect 4: a cancel left open in another transaction for longer than the lease."""
    registry = Registry()
    runs: list[tuple[int, int]] = []

    @registry.task(name="work", pass_context=True, retry=NO_WAIT)
    def work(ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and not ctx.cancelled:
            time.sleep(0.05)

    locked, *healthy = enqueue_jobs(engine, "work", 4)
    with WorkerThread(engine, registry, lease=1, concurrency=4) as runner:
        wait_for(lambda: len(runs) == 4)
        with engine.begin() as conn:  # a cancel, left open for three leases
            admin.cancel_jobs(conn, [locked])
            time.sleep(3)
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0, timeout=60)
        reaped = runner.worker.stats.reaped
    assert sorted(runs) == sorted([(locked, 1)] + [(job_id, 1) for job_id in healthy])
    assert reaped == 0
    assert jobs_by_id(engine)[locked].status == "cancelled"


def test_a_handlers_own_heartbeat_on_a_row_locked_elsewhere_is_not_a_lost_job(
    engine: Engine,
) -> None:
    """The handler's `ctx.heartbeat()` meets its row locked at that instant (the keeper's
    own beat, a cancel being decided): the job is still its own, not lost."""
    registry = Registry()
    beats: list[bool] = []
    started = threading.Event()
    locked = threading.Event()

    @registry.task(name="beat", pass_context=True)
    def beat(ctx: JobContext) -> None:
        started.set()
        assert locked.wait(60)
        beats.append(ctx.heartbeat())
        beats.append(ctx.cancelled)

    (job_id,) = enqueue_jobs(engine, "beat", 1)
    with WorkerThread(engine, registry, lease=60, concurrency=1) as runner:
        assert started.wait(60)
        with engine.begin() as conn:  # another session holds the row while the handler beats
            conn.execute(
                text("SELECT id FROM sqla_queue.jobs WHERE id = :id FOR UPDATE"), {"id": job_id}
            )
            locked.set()
            wait_for(lambda: len(beats) == 2)
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0)
        # The worker counts a success once its statement has returned: wait for the count.
        succeeded = wait_for(lambda: runner.worker.stats.succeeded or None)
    assert beats == [True, False]  # still ours, and not cancelled
    assert succeeded == 1


def _register(conn: Connection, worker_id: str, session_pid: int | None) -> None:
    """A registration that expired a second ago, recording `session_pid` as its session."""
    conn.execute(
        text(
            "INSERT INTO sqla_queue.workers (id, hostname, pid, concurrency, started_at, "
            "heartbeat_at, expires_at, session_pid) VALUES (:id, 'box', 1, 1, now(), "
            "now() - interval '7 seconds', now() - interval '1 second', :session_pid)"
        ),
        {"id": worker_id, "session_pid": session_pid},
    )


def _claim_as(conn: Connection, worker_id: str) -> None:
    (claimed,) = conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": worker_id})
    conn.execute(
        text(
            "UPDATE sqla_queue.jobs SET lease_expires_at = now() + interval '1 hour' WHERE id = :id"
        ),
        {"id": claimed[0]},
    )


def test_a_worker_past_its_registration_but_still_connected_keeps_its_jobs(engine: Engine) -> None:
    """Found under a load of 30 on 2 cores: a worker whose heartbeat thread was starved past
    `dead_after` was taken for dead, its jobs reaped and run a second time beside it. A late
    registration now counts as dead only once the worker's session is gone too; until then
    its jobs wait for their own leases."""
    (job_id,) = enqueue_jobs(engine, "t", 1)
    with engine.connect() as session:  # the slow worker's connection (its LISTEN's)
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        session.commit()
        with engine.begin() as conn:
            _register(conn, "slow", pid)
            _claim_as(conn, "slow")
        with engine.begin() as conn:
            assert conn.execute(queries.reap_stale_jobs(), {"lease": 60}).all() == []
            assert conn.execute(queries.delete_expired_workers()).all() == []  # not lost
    # its connection closed (the process died): the server ends the backend, the worker is gone
    engine.dispose()

    def backend_gone() -> bool:
        with engine.connect() as conn:
            return not conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one()

    wait_for(backend_gone, timeout=60)
    with engine.begin() as conn:
        reaped = conn.execute(queries.reap_stale_jobs(), {"lease": 60}).all()
        assert [row.id for row in reaped] == [job_id]
        assert conn.execute(queries.delete_expired_workers()).all() == [("slow", "box", 1)]


def test_a_late_worker_that_records_no_session_is_judged_by_its_registration(
    engine: Engine,
) -> None:
    (job_id,) = enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        _register(conn, "poll-only", None)  # --poll-only: no session held, none recorded
        _claim_as(conn, "poll-only")
    # its own reaper knows better: a worker that is reaping is alive (a starved keeper let
    # its registration lapse, then reaped before it beat again)
    with engine.begin() as conn:
        own = {"lease": 60, "reaper_id": "poll-only"}
        assert conn.execute(queries.reap_stale_jobs(), own).all() == []
        assert conn.execute(queries.delete_expired_workers(), own).all() == []
    with engine.begin() as conn:
        reaped = conn.execute(queries.reap_stale_jobs(), {"reaper_id": "another"}).all()
    assert [row.id for row in reaped] == [job_id]
