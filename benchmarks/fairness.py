"""Fair queues and sequences (issue 24): the noisy neighbour, and what `--fair`, partition
limits and sequences cost the claim.

    python -m benchmarks.fairness [--database-url URL] [--big 100000] [--repeat 4]

Without `--database-url` it starts a private cluster (stock settings, autovacuum on).

1. **Noisy neighbour**: tenant A enqueues `--big` jobs of 5 ms, then tenants B..K 100
   each; worker threads (2 workers x `-c 32`) drain them all. Each run has a database of its
   own, just filled and never analyzed (a cold table, as a user meets it). Three runs: the
   queue FIFO (today), the queue `--fair`, and B..K alone in the same fair queue (their wait
   with A absent: the one thing that differs from the fair run is A). For
   each: how many of A's jobs were done when the last of B..K finished, B..K's p50/p99 wait
   (from the workers' first claim to the job's start), the whole drain's rate, and the
   MultiXacts the cluster minted during the drain.
2. **Claim cost, paired**: 20,000 no-op jobs drained by one worker (`-c 16`, batch 50; timed
   to the poll that finds the queue empty) from a
   plain queue (A) and from the same jobs in (B) a fair queue over 10 partitions, a queue
   with a partition limit that never binds, and a plain queue whose jobs are in 1,000
   sequences (interleaved, so heads are due together); A and B alternate (A B B A ...)
   in one database, each fill into a vacuumed, never analyzed table. The ratio of the
   medians is what the feature costs the claim path.

Prints one JSON object with everything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, Worker, WorkerConfig, admin, enqueue_many
from sqla_queue.admin import partitions

from .cluster import PrivateCluster
from .database import BenchDatabase

registry = Registry()


@registry.task(name="fair.sleep")
def sleep(seconds: float) -> None:
    """A job of a known length."""
    time.sleep(seconds)


@registry.task(name="fair.noop")
def noop() -> None:
    """Nothing: what is measured is the queue's own cost."""


SMALL_TENANTS = [chr(c) for c in range(ord("B"), ord("K") + 1)]


def _fresh(server: str) -> BenchDatabase:
    db = BenchDatabase(server)
    db.create()
    assert db.engine is not None
    return db


def _enqueue(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with Session(engine) as session, session.begin():
        enqueue_many(session, rows)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _run_workers(url: str, queue: str, until: Any, workers: int, concurrency: int) -> float:
    config = WorkerConfig(concurrency=concurrency, batch=16, queues=[queue], poll_interval=0.05)
    runners = [Worker(url, registry, config) for _ in range(workers)]
    threads = [threading.Thread(target=r.run, daemon=True) for r in runners]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    while not until():
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    for runner in runners:
        runner.stop()
    for thread in threads:
        thread.join(60)
    return elapsed


def noisy_neighbour(
    server: str, mode: str, big: int, small: int, job_seconds: float, workers: int, concurrency: int
) -> dict[str, Any]:
    """One run: `mode` "fifo", "fair" or "alone" (B..K without A, in the fair queue)."""
    db = _fresh(server)
    try:
        engine = db.engine
        assert engine is not None
        with engine.begin() as conn:
            admin.create_queue(conn, "tenants", "keep")
            if mode in ("fair", "alone"):  # alone: the same fair queue, A absent
                partitions.set_fair(conn, "tenants", True)
        args = {"seconds": job_seconds}
        rows = [{"task": "fair.sleep", "queue": "tenants", "args": args, "partition": "A"}]
        if mode != "alone":
            _enqueue(engine, rows * big)
        _enqueue(
            engine,
            [
                {"task": "fair.sleep", "queue": "tenants", "args": args, "partition": t}
                for t in SMALL_TENANTS
                for _ in range(small)
            ],
        )
        total = (0 if mode == "alone" else big) + small * len(SMALL_TENANTS)

        def done() -> bool:
            with engine.connect() as conn:
                left = conn.scalar(
                    text("SELECT count(*) FROM sqla_queue.jobs WHERE status <> 'done'")
                )
            return left == 0

        before = db.next_multixact_id()
        elapsed = _run_workers(db.url, "tenants", done, workers, concurrency)
        multixacts = (db.next_multixact_id() - before) % 2**32
        with engine.connect() as conn:
            first = conn.scalar(text("SELECT min(started_at) FROM sqla_queue.all_jobs"))
            waits = [
                float(w)
                for (w,) in conn.execute(
                    text(
                        "SELECT extract(epoch FROM started_at - :first) FROM sqla_queue.all_jobs "
                        "WHERE partition <> 'A'"
                    ),
                    {"first": first},
                )
            ]
            last_small = conn.scalar(
                text("SELECT max(finished_at) FROM sqla_queue.all_jobs WHERE partition <> 'A'")
            )
            a_done = conn.scalar(
                text(
                    "SELECT count(*) FROM sqla_queue.all_jobs WHERE partition = 'A' "
                    "AND finished_at <= :t"
                ),
                {"t": last_small},
            )
        return {
            "mode": mode,
            "jobs": total,
            "seconds": round(elapsed, 2),
            "jobs_per_s": round(total / elapsed, 1),
            "a_done_when_small_finished": int(a_done or 0),
            "a_share_done": round(int(a_done or 0) / big, 4) if mode != "alone" else None,
            "small_wait_p50_s": round(_percentile(waits, 0.50), 3),
            "small_wait_p99_s": round(_percentile(waits, 0.99), 3),
            "multixacts": multixacts,
        }
    finally:
        db.drop()


def _drain(db: BenchDatabase, queue: str, jobs: int) -> float:
    """Jobs per second for one worker (`-c 16`, batch 50) to empty `queue`: from its start
    to the moment a poll (every 10 ms) finds no job of the queue left. Not a burst worker,
    whose way of making sure the queue is empty (its idle polls) would be timed too."""
    assert db.engine is not None
    engine = db.engine

    def empty() -> bool:
        with engine.connect() as conn:
            left = conn.scalar(
                text("SELECT count(*) FROM sqla_queue.jobs WHERE queue = :q"), {"q": queue}
            )
        return left == 0

    config = WorkerConfig(concurrency=16, batch=50, queues=[queue], poll_interval=0.05)
    runner = Worker(db.url, registry, config)
    thread = threading.Thread(target=runner.run, daemon=True)
    started = time.perf_counter()
    thread.start()
    while not empty():
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    runner.stop()
    thread.join(60)
    return jobs / elapsed


def claim_cost(server: str, jobs: int, repeat: int) -> dict[str, Any]:
    """Drain rates of a plain queue against each feature's, paired in alternating order."""
    db = _fresh(server)
    try:
        engine = db.engine
        assert engine is not None
        with engine.begin() as conn:
            for name in ("plain", "fair", "limited", "sequences"):
                admin.create_queue(conn, name)
            partitions.set_fair(conn, "fair", True)
            partitions.set_partition_limit(conn, "limited", 10_000)

        def rows(queue: str) -> list[dict[str, Any]]:
            made: list[dict[str, Any]] = []
            for n in range(jobs):
                row: dict[str, Any] = {"task": "fair.noop", "queue": queue}
                if queue in ("fair", "limited"):
                    row["partition"] = f"p{n % 10}"
                if queue == "sequences":
                    row["sequence"] = f"s{n % 1000}"
                made.append(row)
            return made

        results: dict[str, Any] = {}
        for feature in ("fair", "limited", "sequences"):
            rates: dict[str, list[float]] = {"plain": [], feature: []}
            multixacts = 0
            for run in range(repeat):
                for queue in ("plain", feature)[:: 1 if run % 2 == 0 else -1]:
                    db.sql("VACUUM sqla_queue.jobs")
                    _enqueue(engine, rows(queue))
                    before = db.next_multixact_id()
                    rates[queue].append(_drain(db, queue, jobs))
                    multixacts += (db.next_multixact_id() - before) % 2**32
            plain, other = statistics.median(rates["plain"]), statistics.median(rates[feature])
            results[feature] = {
                "plain_jobs_per_s": round(plain, 1),
                f"{feature}_jobs_per_s": round(other, 1),
                "ratio": round(other / plain, 3),
                "samples": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
                "multixacts": multixacts,
            }
        return results
    finally:
        db.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--job-ms", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--cost-jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--skip-noisy", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    options = parser.parse_args()
    cluster = None
    server = options.database_url
    if server is None:
        cluster = PrivateCluster()
        server = cluster.start()
    try:
        report: dict[str, Any] = {}
        if not options.skip_noisy:
            report["noisy_neighbour"] = [
                noisy_neighbour(
                    server,
                    mode,
                    options.big,
                    options.small,
                    options.job_ms / 1000,
                    options.workers,
                    options.concurrency,
                )
                for mode in ("fifo", "fair", "alone")
            ]
            print(json.dumps(report["noisy_neighbour"]), flush=True)
        if not options.skip_cost:
            report["claim_cost"] = claim_cost(server, options.cost_jobs, options.repeat)
        print(json.dumps(report, indent=2))
    finally:
        if cluster is not None:
            cluster.stop()
            cluster.remove()


if __name__ == "__main__":
    main()
