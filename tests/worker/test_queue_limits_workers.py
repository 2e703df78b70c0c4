"""Queue limits with real worker processes: the limit holds across all of them.

Slow: each drains hundreds of jobs through six `sqla-queue worker` processes. The drain
rate is printed (speed is for benchmarks/limits.py); what is asserted is that the limit
was never exceeded and every job ran once.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from helpers.support import (
    count_where,
    create_task_log,
    enqueue_jobs,
    start_worker_process,
    wait_for,
)
from sqlalchemy import Engine, text

from sqla_queue import admin

WORKERS = 6


def start_logs(engine: Engine) -> list[tuple[int, float]]:
    """(job id, handler start as epoch seconds) of every attempt the handlers recorded."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_id, extract(epoch FROM at) FROM public.task_log ORDER BY 2")
        ).all()
    return [(int(job_id), float(at)) for job_id, at in rows]


def run_workers(
    database_url: str, engine: Engine, queue: str, enqueue: Callable[[], list[int]]
) -> list[int]:
    """Six workers at -c 8; once all are up, `enqueue` (a handler's first start is not
    delayed by its process still starting); then SIGTERM (clean stop) once the queue is
    empty. Returns the ids enqueued."""
    processes = [start_worker_process(database_url, "-q", queue, "-c", "8") for _ in range(WORKERS)]
    try:
        wait_for(lambda: count_rows(engine, "sqla_queue.workers") == WORKERS, timeout=180)
        ids = enqueue()
        wait_for(lambda: count_where(engine, f"queue = '{queue}'") == 0, timeout=120, interval=0.2)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        outputs = [process.communicate(timeout=120) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr
    return ids


def count_rows(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text(f"SELECT count(*) FROM {table}")))


@pytest.mark.slow
def test_six_workers_at_c8_never_run_more_than_the_queue_concurrency(
    database_url: str, engine: Engine
) -> None:
    limit, jobs, seconds = 3, 500, 0.05
    create_task_log(engine)
    with engine.begin() as conn:
        admin.create_queue(conn, "limited")
        admin.set_max_running(conn, "limited", limit)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with engine.connect() as conn:
            while not stop.is_set():
                samples.append(
                    int(
                        conn.scalar(
                            text(
                                "SELECT count(*) FROM sqla_queue.jobs "
                                "WHERE queue = 'limited' AND status = 'running'"
                            )
                        )
                    )
                )
                conn.rollback()
                time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        ids = run_workers(
            database_url,
            engine,
            "limited",
            lambda: enqueue_jobs(engine, "stamp", jobs, queue="limited", args={"seconds": seconds}),
        )
    finally:
        stop.set()
        sampler.join(10)

    log = start_logs(engine)
    assert Counter(job_id for job_id, _ in log) == Counter(ids), "every job ran exactly once"
    assert len(samples) > 200, "the running rows were sampled many times"
    assert max(samples) <= limit, Counter(samples)
    assert max(samples) == limit, "the limit was reached (the workers did contend)"
    # Handler starts: in no instant more than `limit` jobs began within one job's length.
    starts = sorted(at for _, at in log)
    elapsed = starts[-1] - starts[0] + seconds
    ideal = jobs * seconds / limit
    # A figure, not a bound (a loaded machine drains slower): benchmarks/limits.py measures
    # how close a binding limit drains.
    print(
        f"\ndrained {jobs} jobs of {seconds * 1000:.0f} ms at concurrency {limit} in "
        f"{elapsed:.2f} s: {ideal / elapsed:.2f}x of {limit} jobs per {seconds * 1000:.0f} ms"
    )


# Every start the claims recorded for the rate limit (`queue_starts`, whose old rows the next
# claim deletes), kept: the clock the limit decided on.
START_LOG_DDL = (
    "CREATE TABLE public.start_log (started_at timestamptz NOT NULL, jobs int NOT NULL)",
    "CREATE FUNCTION public.keep_start() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN INSERT INTO public.start_log VALUES (NEW.started_at, NEW.jobs); RETURN NULL; END $$",
    "CREATE TRIGGER keep_start AFTER INSERT ON sqla_queue.queue_starts"
    " FOR EACH ROW EXECUTE FUNCTION public.keep_start()",
)


@pytest.mark.slow
def test_a_rate_limited_queue_starts_no_more_than_its_rate_in_any_window(
    database_url: str, engine: Engine
) -> None:
    rate, window, jobs = 10, 1.0, 45
    create_task_log(engine)
    with engine.begin() as conn:
        admin.create_queue(conn, "api")
        admin.set_rate(conn, "api", (rate, window))
        for statement in START_LOG_DDL:
            conn.execute(text(statement))
    ids = run_workers(
        database_url, engine, "api", lambda: enqueue_jobs(engine, "stamp", jobs, queue="api")
    )

    log = start_logs(engine)
    assert sorted(job_id for job_id, _ in log) == sorted(ids)
    # The times the claims counted on, after each took the queue's lock: not a job's
    # locked_at (the claim statement's start, which a loaded machine can hold back from the
    # lock by half a second: CI once saw 15 locked_at in one second), nor the handlers'
    # starts, which can bunch up after a claim that waited its turn.
    with engine.connect() as conn:
        starts = [
            (float(at), int(n))
            for at, n in conn.execute(
                text("SELECT extract(epoch FROM started_at), jobs FROM public.start_log ORDER BY 1")
            )
        ]
    assert sum(n for _, n in starts) == jobs, "every claim of the queue recorded its starts"
    # Every window of `window` seconds that begins at a claim holds at most `rate` starts.
    busiest = max(
        sum(n for other, n in starts[i:] if other < begin + window)
        for i, (begin, _) in enumerate(starts)
    )
    assert busiest <= rate, starts
    span = starts[-1][0] - starts[0][0]
    print(f"\n{jobs} starts at {rate}/{window:g}s took {span:.2f} s; busiest window {busiest}")
    assert span >= (jobs // rate - 1) * window * 0.9, "the windows really held jobs back"
