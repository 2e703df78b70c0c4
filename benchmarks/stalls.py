"""Stalls at a sustained rate, two checkouts side by side: `python -m benchmarks.stalls ...`.

    python -m benchmarks.stalls --tree main=/path/to/old/checkout --tree new=. \
        [--rate 1500] [--seconds 600] [--rounds 1] [--database-url URL]

One private cluster with stock settings (unless --database-url) serves every run. Each round
runs every tree in turn: a database of its own, migrated by that tree's code; one worker
process of that tree (`python -m benchmarks.sustained worker`, with its self-vacuum on:
`--vacuum-threshold`); and this process enqueuing `--rate` `mark` jobs a second (one
transaction every 20 ms, as `benchmarks.sustained rate`). Every handler appends its job id and
the time it started to a file; at the end the run reports, over the starts after the first
`--warmup` seconds, the longest gap between two consecutive job starts and the worst
1-second window (jobs started in it / the offered rate), the jobs that never started, and
the statements that took a second or more (the server logs them for these databases:
`log_min_duration_statement`, a logging setting only). The goal (issue 40): no gap near
5 s, no second below 0.8x the offered rate. Prints one JSON line per run, then a summary.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine, pool, text

from .cluster import PrivateCluster
from .database import BenchDatabase
from .sustained import TICK
from .tasks import MARKS_ENV

MIGRATE = (
    "import sys; from sqlalchemy import create_engine; from sqla_queue.{module} import upgrade; "
    "upgrade(create_engine(sys.argv[1]))"
)
"""Run in a tree's own interpreter path: its migrations, not this checkout's."""


def migrate_code(tree: Path) -> str:
    """MIGRATE for `tree`: `sqla_queue.db.migrate` since the layout (issue 34), else the flat
    `sqla_queue.migrate` (ab8d9f7 and before)."""
    module = "db.migrate" if (tree / "sqla_queue" / "db" / "migrate.py").exists() else "migrate"
    return MIGRATE.format(module=module)


def tree_env(tree: Path, marks: Path | None = None) -> dict[str, str]:
    """The environment that makes `python` import sqla_queue and benchmarks from `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    if marks is not None:
        env[MARKS_ENV] = str(marks)
    return env


def enqueue_marks(url: str, rate: float, seconds: float) -> int:
    """Enqueue `rate` mark jobs a second for `seconds`; returns how many."""
    engine = create_engine(url, poolclass=pool.NullPool)
    statement = text(
        "INSERT INTO sqla_queue.jobs (task, args) "
        "SELECT 'mark', '{}'::jsonb FROM generate_series(1, :n)"
    )
    enqueued = 0
    start = time.monotonic()
    with engine.connect() as conn:
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(rate * elapsed) - enqueued
            if due > 0:
                conn.execute(statement, {"n": due})
                conn.execute(text("SELECT pg_notify('sqla_queue', 'default')"))
                conn.commit()
                enqueued += due
            time.sleep(max(0.0, TICK - (time.monotonic() - start) % TICK))
    engine.dispose()
    return enqueued


def read_marks(folder: Path) -> list[float]:
    starts: list[float] = []
    for path in folder.iterdir():
        for line in path.read_text().splitlines():
            starts.append(float(line.split()[1]))
    return sorted(starts)


def start_figures(starts: list[float], rate: float, warmup: float, began: float) -> dict[str, Any]:
    """The longest gap between consecutive starts and the worst whole second, after warmup."""
    kept = [t for t in starts if t >= began + warmup]
    if len(kept) < 2:
        return {"started": len(kept), "longest_gap_s": None, "worst_second_ratio": None}
    gaps = [(b - a, a) for a, b in itertools.pairwise(kept)]
    longest, at = max(gaps)
    first, last = int(kept[0] - began), int(kept[-1] - began)
    per_second = dict.fromkeys(range(first, last), 0)  # whole seconds only (the last is cut)
    for t in kept:
        second = int(t - began)
        if second in per_second:
            per_second[second] += 1
    worst_second = min(per_second, key=lambda s: per_second[s]) if per_second else None
    seconds_below = sum(1 for n in per_second.values() if n < 0.8 * rate)
    return {
        "started": len(kept),
        "longest_gap_s": round(longest, 3),
        "longest_gap_at_s": round(at - began, 1),
        "worst_second_ratio": (
            round(per_second[worst_second] / rate, 3) if worst_second is not None else None
        ),
        "worst_second_at_s": worst_second,
        "seconds_below_0_8x": seconds_below,
        "gaps_over_0_5_s": sum(1 for gap, _ in gaps if gap > 0.5),
    }


def log_size(log: Path | None) -> int:
    return log.stat().st_size if log is not None and log.exists() else 0


def slow_statements(log: Path | None, since: int) -> list[str]:
    """The server log's `duration:` lines (a second or more) written after byte `since`,
    shortened: the runs are one at a time, so they are this run's."""
    if log is None or not log.exists():
        return []
    lines = []
    with log.open("rb") as f:
        f.seek(since)
        written = f.read().decode(errors="replace")
    for line in written.splitlines():
        if "duration:" in line:
            lines.append(re.sub(r"\s+", " ", line.split("LOG:", 1)[-1]).strip()[:160])
    return lines


def run_tree(label: str, tree: Path, server: str, args: argparse.Namespace, log: Path | None):
    db = BenchDatabase(server)
    with db._admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db.name}"'))
        conn.execute(text(f'ALTER DATABASE "{db.name}" SET log_min_duration_statement = 1000'))
    marks = Path(tempfile.mkdtemp(prefix="sqlaq_stall_marks_"))
    since = log_size(log)
    worker = None
    try:
        subprocess.run(
            [sys.executable, "-c", migrate_code(tree), db.url],
            cwd=tree,  # first on the path: an editable install would answer before PYTHONPATH
            env=tree_env(tree),
            check=True,
        )
        worker = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.sustained", "worker", db.url,
             str(args.vacuum_threshold), str(args.concurrency), str(args.batch)],
            cwd=tree, env=tree_env(tree, marks),
        )  # fmt: skip
        time.sleep(3)  # the worker starts
        began = time.time()
        enqueued = enqueue_marks(db.url, args.rate, args.seconds)
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            deadline = time.monotonic() + args.drain_timeout
            unfinished = (
                "SELECT count(*) FROM sqla_queue.jobs WHERE status IN ('queued', 'running')"
            )
            while time.monotonic() < deadline:
                if conn.execute(unfinished).fetchone()[0] == 0:  # type: ignore[index]
                    break
                time.sleep(0.2)
            stats = conn.execute(
                "SELECT vacuum_count, autovacuum_count, analyze_count, autoanalyze_count "
                "FROM pg_stat_user_tables WHERE relid = 'sqla_queue.jobs'::regclass"
            ).fetchone()
        starts = read_marks(marks)
        figures = start_figures(starts, args.rate, args.warmup, began)
        result = {
            "tree": label,
            "offered_per_s": args.rate,
            "seconds": args.seconds,
            "enqueued": enqueued,
            "never_started": enqueued - len(starts),
            **figures,
            "vacuums": stats[0] if stats else None,
            "autovacuums": stats[1] if stats else None,
            "analyzes": stats[2] if stats else None,
            "autoanalyzes": stats[3] if stats else None,
            "slow_statements": slow_statements(log, since),
        }
        print(json.dumps(result), flush=True)
        return result
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
        db.drop()
        for path in marks.iterdir():
            path.unlink()
        marks.rmdir()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stalls", description=__doc__)
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--rate", type=float, default=1500.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument("--vacuum-threshold", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args(argv)
    trees = []
    for spec in args.tree:
        label, _, path = spec.partition("=")
        if not path or not (Path(path) / "sqla_queue").is_dir():
            parser.error(f"--tree {spec}: give LABEL=PATH, PATH a checkout with sqla_queue/")
        trees.append((label, Path(path).resolve()))
    cluster = None if args.database_url else PrivateCluster()
    server = args.database_url or cluster.start()  # type: ignore[union-attr]
    log = cluster.folder / "server.log" if cluster is not None and cluster.folder else None
    results = []
    try:
        for _ in range(args.rounds):
            for label, tree in trees:
                results.append(run_tree(label, tree, server, args, log))
    finally:
        if cluster is not None:
            cluster.stop()
    summary = [
        {k: r[k] for k in ("tree", "longest_gap_s", "worst_second_ratio", "never_started")}
        for r in results
    ]
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
