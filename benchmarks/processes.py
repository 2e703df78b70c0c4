"""Drain rate of `sqla-queue worker --processes N` (issue 13, target 4): no-op jobs, batch 50.

    python -m benchmarks.processes --database-url postgresql://postgres@127.0.0.1:5432/postgres

creates a database of its own on that server and, for each `--processes` value, starts the
real command on the no-op registry of `benchmarks/tasks.py`, waits until its N children
have registered (start-up is not timed), then inserts M jobs in one transaction and times
from their commit until none is left: one warm-up drain, then `--repeat` measured ones,
whose median `drain_rate` returns in jobs/s. The harness (`python -m benchmarks`) compares
that figure with the pgbench ceiling lines of the same run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .database import LOCAL_URL, BenchDatabase
from .stats import summary

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def supervised_workers(
    db: BenchDatabase,
    processes: int,
    batch: int,
    concurrency: int,
    extra_env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`sqla-queue worker --processes N` on `db`, from its children's registration until
    SIGTERM (each child finishes or releases its jobs; the parent exits once they have).
    `extra_env`: more environment variables for it (the `mark` task's folder)."""
    command = [
        sys.executable, "-m", "sqla_queue", "worker", "--app", "benchmarks.tasks:registry",
        "--processes", str(processes), "--batch", str(batch), "-c", str(concurrency),
        "--poll-interval", "0.1", "--log-level", "warning",
    ]  # fmt: skip
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, SQLA_QUEUE_DATABASE_URL=db.url, PYTHONPATH=pythonpath)
    env.update(extra_env or {})
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while db.sql("SELECT count(*) FROM sqla_queue.workers")[0][0] < processes:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not start (exit status {proc.poll()})")
            time.sleep(0.1)
        yield proc
    finally:
        stop_process(proc, timeout=60)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM `proc` (if it still runs), wait up to `timeout` s for it, then SIGKILL it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _drain_once(db: BenchDatabase, jobs: int, warm: bool = False) -> float:
    """Insert `jobs` (planner statistics taken first if `warm`; cold by default); jobs/s
    from their commit to empty."""
    db.reset_jobs()
    db.insert_noop_jobs(jobs, analyze=warm)
    started = time.monotonic()
    if not db.wait_until_empty(timeout=600):
        raise RuntimeError(f"{db.count_jobs()} of {jobs} jobs were left after 600 s")
    return jobs / (time.monotonic() - started)


def drain_rate(db: BenchDatabase, jobs: int = 20_000, processes: int = 2, batch: int = 50) -> float:
    """Jobs/s of `sqla-queue worker --processes {processes} --batch {batch}` draining `jobs`
    no-op jobs (the median of three drains after a warm-up)."""
    return float(drain_summary(db, jobs, processes, batch)["median"])


def drain_summary(
    db: BenchDatabase,
    jobs: int = 20_000,
    processes: int = 2,
    batch: int = 50,
    concurrency: int = 4,
    repeat: int = 3,
    warm: bool = False,
) -> dict[str, Any]:
    """Median, spread and samples (jobs/s) of `repeat` drains of `jobs` no-op jobs by
    `sqla-queue worker --processes {processes} --batch {batch} -c {concurrency}`."""
    with supervised_workers(db, processes, batch, concurrency):
        _drain_once(db, max(1_000, jobs // 5), warm)  # warm-up: caches, plans, pools
        rates = [_drain_once(db, jobs, warm) for _ in range(repeat)]
    db.reset_jobs()
    result = summary(rates)
    result.update(jobs=jobs, processes=processes, batch=batch, concurrency=concurrency)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.processes", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("SQLA_QUEUE_BENCH_URL", LOCAL_URL))
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per measured drain")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4, help="-c of each process")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warm", action="store_true", help="ANALYZE each backlog first")
    args = parser.parse_args(argv)
    db = BenchDatabase(args.database_url)
    db.create()
    try:
        for processes in args.processes:
            row = drain_summary(
                db,
                args.jobs,
                processes,
                args.batch,
                args.concurrency,
                repeat=args.repeat,
                warm=args.warm,
            )
            print(
                f"drain --processes {processes} -c {args.concurrency} --batch {args.batch}: "
                f"{row['median']:,.0f} jobs/s (spread {row['spread']:.0%}, samples "
                f"{', '.join(f'{r:,.0f}' for r in row['samples'])})",
                flush=True,
            )
    finally:
        db.drop()


if __name__ == "__main__":
    main()
