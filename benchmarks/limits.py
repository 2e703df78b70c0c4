"""What a queue concurrency limit costs the claim, and how close a binding limit drains.

    python -m benchmarks.limits [SERVER_URL]

1. `limit_cost`: the same no-op jobs drained from an unlimited queue and from a queue with
   a concurrency limit that never binds (ten times the worker's concurrency), alternating,
   in one run on one database: the ratio of the medians is what the limited claim path
   (`claim_slots`, its advisory lock, the rate bookkeeping) costs.
2. `binding_limit`: jobs of `job_seconds` on a queue limited to `limit`, drained by several
   worker threads with room for more: the rate reached against `limit` jobs per job length.

Self-contained: it creates its own database on the server (benchmarks.database) and runs
`Worker`s in threads of this process. `main` prints one line per measurement and returns
the results as a dict (for the benchmark report).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, Worker, WorkerConfig, admin, enqueue_many

from .database import LOCAL_URL, BenchDatabase

registry = Registry()


@registry.task(name="limits.noop")
def noop() -> None:
    """Nothing: what is measured is the queue's own cost."""


@registry.task(name="limits.sleep")
def sleep(seconds: float) -> None:
    """A job of a known length."""
    time.sleep(seconds)


def _fill(engine: Engine, queue: str, task: str, count: int, args: dict[str, Any]) -> None:
    with Session(engine) as session, session.begin():
        enqueue_many(session, [{"task": task, "queue": queue, "args": args}] * count)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE sqla_queue.jobs"))


def _drain(url: str, queue: str, workers: int, concurrency: int, batch: int) -> float:
    """Seconds for `workers` burst workers (threads) to empty `queue`."""
    config = WorkerConfig(
        concurrency=concurrency, batch=batch, burst=True, queues=[queue], poll_interval=0.05
    )
    runners = [Worker(url, registry, config) for _ in range(workers)]
    threads = [threading.Thread(target=runner.run, daemon=True) for runner in runners]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def limit_cost(
    db: BenchDatabase, jobs: int = 20_000, concurrency: int = 16, batch: int = 50, repeat: int = 4
) -> dict[str, Any]:
    """Drain rate (jobs/s) of an unlimited and a limited-but-not-binding queue; the ratio."""
    assert db.engine is not None
    with db.engine.begin() as conn:
        admin.create_queue(conn, "unlimited")
        admin.create_queue(conn, "limited")
        admin.set_max_running(conn, "limited", concurrency * 10)
    rates: dict[str, list[float]] = {"unlimited": [], "limited": []}
    for run in range(repeat):
        # each in turn goes first, each on a vacuumed table: no order or bloat favours one
        for queue in ("unlimited", "limited")[:: 1 if run % 2 == 0 else -1]:
            db.sql("VACUUM sqla_queue.jobs")
            _fill(db.engine, queue, "limits.noop", jobs, {})
            rates[queue].append(jobs / _drain(db.url, queue, 1, concurrency, batch))
    unlimited = statistics.median(rates["unlimited"])
    limited = statistics.median(rates["limited"])
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "batch": batch,
        "unlimited_jobs_per_s": unlimited,
        "limited_jobs_per_s": limited,
        "ratio": limited / unlimited,
        "samples": rates,
    }


def binding_limit(
    db: BenchDatabase, limit: int = 3, jobs: int = 300, job_seconds: float = 0.05, workers: int = 3
) -> dict[str, Any]:
    """Drain of `jobs` jobs of `job_seconds` at concurrency `limit` by `workers` workers at
    -c 8: the rate reached as a share of `limit / job_seconds`."""
    assert db.engine is not None
    with db.engine.begin() as conn:
        admin.create_queue(conn, "binding")
        admin.set_max_running(conn, "binding", limit)
    _fill(db.engine, "binding", "limits.sleep", jobs, {"seconds": job_seconds})
    # not burst: a burst worker that finds the queue full would take it for empty and stop
    config = WorkerConfig(concurrency=8, batch=8, queues=["binding"], poll_interval=0.05)
    runners = [Worker(db.url, registry, config) for _ in range(workers)]
    threads = [threading.Thread(target=runner.run, daemon=True) for runner in runners]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    with db.engine.connect() as conn:
        while conn.scalar(text("SELECT count(*) FROM sqla_queue.jobs WHERE queue = 'binding'")):
            conn.rollback()
            time.sleep(0.02)
    elapsed = time.perf_counter() - started
    for runner in runners:
        runner.stop()
    for thread in threads:
        thread.join(30)
    ideal = limit / job_seconds
    return {
        "limit": limit,
        "jobs": jobs,
        "job_seconds": job_seconds,
        "workers": workers,
        "jobs_per_s": jobs / elapsed,
        "share_of_limit": jobs / elapsed / ideal,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = sys.argv[1:] if argv is None else argv
    db = BenchDatabase(args[0] if args else LOCAL_URL)
    db.create()
    try:
        cost = limit_cost(db)
        print(
            f"limit cost: unlimited {cost['unlimited_jobs_per_s']:,.0f} jobs/s, limited "
            f"(not binding) {cost['limited_jobs_per_s']:,.0f} jobs/s: ratio {cost['ratio']:.2f}"
        )
        bound = binding_limit(db)
        print(
            f"binding limit {bound['limit']}: {bound['jobs_per_s']:.1f} jobs/s of "
            f"{bound['job_seconds'] * 1000:.0f} ms = {bound['share_of_limit']:.2f}x of the limit"
        )
    finally:
        db.drop()
    results = {"limit_cost": cost, "binding_limit": bound}
    print(json.dumps(results, default=str))
    return results


if __name__ == "__main__":
    main()
