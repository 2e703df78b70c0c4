"""The sustained-rate run and the worker's commit mode: `python -m benchmarks.sustained ...`.

- rate [--rate 400] [--seconds 600] [--self-vacuum on|off] [--database-url URL]: a private
  cluster with stock settings (autovacuum on, naptime 60 s) unless --database-url; one worker
  process (`--concurrency`, `--batch`); this process enqueues `--rate` jobs a second (one
  transaction every 20 ms) and prints, per 10 s window, the jobs completed and their ratio
  to the offered rate, the jobs table's dead rows, and how often it was vacuumed and
  autovacuumed so far, and what the claim's scan costs at that moment (`CLAIM_PROBE`).
  The goal: no window below 0.9x the offered rate.
- drain --database-url URL [--jobs N] [--synchronous-commit on|off]: empty the jobs table,
  insert N no-op jobs and ANALYZE them (warm: this measures the commits, not the claim's
  plan), then time one burst worker draining them; prints {"seconds", "jobs_per_s"}. Run it
  alternately with on and off (paired) to measure what the worker's asynchronous commits win.
- worker URL VACUUM_THRESHOLD CONCURRENCY BATCH: the worker process `rate` starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from sqla_queue import enqueue_many
from sqla_queue.worker import Worker, WorkerConfig

from .cluster import PrivateCluster
from .database import JOBS, BenchDatabase
from .tasks import registry

TICK = 0.02
"""Seconds between two enqueue transactions of the rate run."""

CLAIM_PROBE = (
    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM sqla_queue.jobs "
    "WHERE status = 'queued' ORDER BY priority, run_at, id LIMIT 50"
)
"""The claim's scan without its locks: its buffers and time grow with the dead rows the
claim index still points at (each window reports them)."""

STATS = (
    "SELECT n_dead_tup, vacuum_count, autovacuum_count FROM pg_stat_user_tables "
    "WHERE schemaname = 'sqla_queue' AND relname = 'jobs'"
)


def run_worker(url: str, vacuum_threshold: str, concurrency: int, batch: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    threshold = None if vacuum_threshold == "none" else int(vacuum_threshold)
    config = WorkerConfig(
        concurrency=concurrency, batch=batch, poll_interval=0.1, vacuum_threshold=threshold
    )
    stats = Worker(url, registry, config).run(install_signal_handlers=True)
    print(json.dumps(stats.__dict__), flush=True)


class Producer(threading.Thread):
    """Enqueues `rate` jobs a second, `rate * TICK` per transaction, until stopped."""

    def __init__(self, url: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.engine = create_engine(url, pool_size=1)
        self.rate = rate
        self.enqueued = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stopping.is_set():
            due = int(self.rate * (time.monotonic() - start)) - self.enqueued
            if due > 0:
                with Session(self.engine) as session, session.begin():
                    enqueue_many(session, [{"task": "noop", "args": {}} for _ in range(due)])
                self.enqueued += due
            time.sleep(max(0.0, TICK - (time.monotonic() - start) % TICK))
        self.engine.dispose()


def sustained_rate(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    threshold = str(args.vacuum_threshold) if args.self_vacuum == "on" else "none"
    worker = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.sustained", "worker", url, threshold,
         str(args.concurrency), str(args.batch)],
    )  # fmt: skip
    windows: list[dict[str, Any]] = []
    producer = Producer(url, args.rate)
    try:
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
            time.sleep(2)  # the worker starts
            producer.start()
            unfinished = f"SELECT count(*) FROM {JOBS} WHERE status IN ('queued', 'running')"
            done_before = 0
            next_window = time.monotonic() + args.window
            for k in range(int(args.seconds / args.window)):
                time.sleep(max(0.0, next_window - time.monotonic()))
                next_window += args.window
                enqueued = producer.enqueued
                backlog = int(conn.execute(unfinished).fetchone()[0])  # type: ignore[index]
                dead, vacuums, autovacuums = conn.execute(STATS).fetchone() or (0, 0, 0)
                probe = conn.execute(CLAIM_PROBE).fetchone()[0][0]  # type: ignore[index]
                plan = probe["Plan"]
                done = enqueued - backlog
                window = {
                    "window": k,
                    "end_s": (k + 1) * args.window,
                    "completed_per_s": round((done - done_before) / args.window, 1),
                    "ratio": round((done - done_before) / args.window / args.rate, 3),
                    "backlog": backlog,
                    "dead_rows": int(dead),
                    "vacuums": int(vacuums),
                    "autovacuums": int(autovacuums),
                    "probe_buffers": plan["Shared Hit Blocks"] + plan["Shared Read Blocks"],
                    "probe_ms": round(probe["Execution Time"], 3),
                }
                done_before = done
                windows.append(window)
                print(json.dumps(window), flush=True)
    finally:
        producer.stopping.set()
        producer.join(10)
        worker.terminate()
        worker.wait(60)
    return windows


def drain(url: str, jobs: int, synchronous_commit: bool, concurrency: int, batch: int) -> None:
    db = BenchDatabase.__new__(BenchDatabase)  # an existing database: no create, no drop
    db.dsn = url.replace("+psycopg", "")
    db.reset_jobs()
    db.insert_noop_jobs(jobs, analyze=True)
    config = WorkerConfig(
        burst=True, concurrency=concurrency, batch=batch, synchronous_commit=synchronous_commit
    )
    engine = create_engine(url, pool_size=3, max_overflow=4)
    started = time.perf_counter()
    stats = Worker(engine, registry, config).run(install_signal_handlers=False)
    seconds = time.perf_counter() - started
    engine.dispose()
    assert stats.succeeded == jobs, stats
    print(json.dumps({"seconds": round(seconds, 3), "jobs_per_s": round(jobs / seconds)}))


def main(argv: list[str]) -> None:
    if argv and argv[0] == "worker":
        run_worker(argv[1], argv[2], int(argv[3]), int(argv[4]))
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sustained")
    parser.add_argument("mode", choices=["rate", "drain"])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--self-vacuum", choices=["on", "off"], default="on")
    parser.add_argument("--vacuum-threshold", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="off")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args(argv)
    if args.mode == "drain":
        if args.database_url is None:
            parser.error("drain needs --database-url (a database migrated for the queue)")
        drain(
            args.database_url,
            args.jobs,
            args.synchronous_commit == "on",
            args.concurrency,
            args.batch,
        )
        return
    cluster = None if args.database_url else PrivateCluster()
    server = args.database_url or cluster.start()  # type: ignore[union-attr]
    db = BenchDatabase(server)
    db.create()
    try:
        windows = sustained_rate(db.url, args)
    finally:
        db.drop()
        if cluster is not None:
            cluster.stop()
    worst = min((w["ratio"] for w in windows), default=0.0)
    print(json.dumps({"offered_per_s": args.rate, "self_vacuum": args.self_vacuum,
                      "worst_window_ratio": worst}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
