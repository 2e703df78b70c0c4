"""Finish-to-wake-up latency of `sqla_queue.wait_for`: 100 jobs waited for from 10 threads.

    python -m benchmarks.results_wait [SERVER_URL]

Ten threads each wait for ten jobs in turn (`wait_for`, woken by NOTIFY; the fallback
look at the row is set to 10 minutes, so every wake-up is a notification's). A finisher
claims the jobs and finishes them one statement each, a few milliseconds apart, as a
worker's completer does, keeping a result. The latency of a job is the wall clock when
its waiter returned minus the commit of the statement that finished it (on the same host's
clock; `pg_xact_commit_timestamp`, when the server has `track_commit_timestamp = on`, else
the job's `finished_at`, the finishing transaction's start, which adds the statement and
its commit's WAL flush): it covers the NOTIFY, the listener thread and the waiter's own
look at the row. Prints and returns the median, p95, p99 and max.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from sqla_queue import enqueue_many, wait_for
from sqla_queue.db import queries

from .database import LOCAL_URL, BenchDatabase
from .stats import latency_summary

JOBS = 100
THREADS = 10


def measure(db: BenchDatabase, jobs: int = JOBS, threads: int = THREADS) -> dict[str, Any]:
    engine = db.engine
    assert engine is not None
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, [{"task": "wait.me", "args": {"n": n}} for n in range(jobs)])
    woke: dict[int, float] = {}
    errors: list[BaseException] = []

    def waiter(mine: list[int]) -> None:
        try:
            for job_id in mine:
                wait_for(engine, job_id, timeout=60, recheck=600)
                woke[job_id] = time.time()
        except BaseException as exc:
            errors.append(exc)

    runners = [threading.Thread(target=waiter, args=(ids[i::threads],)) for i in range(threads)]
    for runner in runners:
        runner.start()
    time.sleep(0.5)  # every waiter is listening
    with engine.begin() as conn:
        claimed = conn.execute(
            queries.claim_jobs(None), {"limit": jobs, "worker_id": "bench"}
        ).all()
    attempts = {row.id: row.attempts for row in claimed}
    # in id order: each waiter's next job (ids[i::threads]) is the one it is waiting for
    for job_id in sorted(attempts):
        params = {
            "job_ids": [job_id],
            "job_attempts": [attempts[job_id]],
            "job_results": [json.dumps({"id": job_id})],
        }
        with engine.begin() as conn:
            conn.execute(queries.complete_jobs(), params)
        time.sleep(random.uniform(0.002, 0.01))
    for runner in runners:
        runner.join(60)
    if errors:
        raise errors[0]
    with engine.connect() as conn:
        commits = conn.scalar(text("SELECT current_setting('track_commit_timestamp')")) == "on"
        # the commit's own time when the server records it, else the finishing statement's
        finish = "pg_xact_commit_timestamp(xmin)" if commits else "finished_at"
        finished = dict(
            conn.execute(
                text(f"SELECT id, extract(epoch FROM {finish}) FROM sqla_queue.jobs")
            ).all()
        )
    latencies_ms = [(woke[i] - float(finished[i])) * 1000 for i in ids]
    result: dict[str, Any] = {"jobs": jobs, "threads": threads, **latency_summary(latencies_ms)}
    result["from"] = "commit" if commits else "finished_at (the finishing transaction's start)"
    result["max"] = max(latencies_ms)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = sys.argv[1:] if argv is None else argv
    db = BenchDatabase(args[0] if args else LOCAL_URL)
    db.create()
    try:
        result = measure(db)
    finally:
        db.drop()
    print(
        f"wait_for, {result['jobs']} jobs from {result['threads']} threads, finish to wake-up: "
        f"p50 {result['p50']:.1f} ms, p95 {result['p95']:.1f} ms, p99 {result['p99']:.1f} ms, "
        f"max {result['max']:.1f} ms (from the {result['from']})"
    )
    return result


if __name__ == "__main__":
    main()
