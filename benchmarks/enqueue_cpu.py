"""The Python an enqueue costs the caller, per call, by process CPU (issue 39, item 3).

    python -m benchmarks.enqueue_cpu --database-url URL [--calls 2000] [--rounds 5]
        [--profile PATH] [--json OUT]

URL names a server: a scratch database is created, migrated, measured in and dropped
(`enqueue_paths.scratch_database`). Process CPU (`time.process_time`), not wall time: the
figures hold on a loaded machine, where wall time is the load's. Each round measures every
path once, in an order rotating from round to round, after one warm-up round; each figure
is the median over the rounds, in microseconds per job:

- `enqueue`: `enqueue(session, task, {"n": n})` (no registry), split into the call itself
  (`enqueue_call`: what it does before the flush) and `session.flush()` of the calls'
  jobs (`enqueue_flush`: 50 jobs a flush, the database's time included only as the client's
  CPU waiting costs nothing);
- `task_enqueue`: `Task.enqueue(session, {...})` of a registered task, the call only;
- `defer`: `Task.defer(session, n=n)` of a task whose handler takes `n: int`, the call only;
- `enqueue_many`: the Python of `enqueue_many(session, rows)` for 1,000 plain rows (the
  rows prepared and validated, and the COPY written), per row.

`--profile PATH`: also writes a cProfile (by process CPU) of `enqueue` + flush to PATH.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue, enqueue_many, normalize_url
from sqla_queue.db.migrate import upgrade

from .enqueue_paths import scratch_database

FLUSH_EVERY = 50
BULK_ROWS = 1_000


def _paths(url: str, calls: int) -> tuple[dict[str, Callable[[], dict[str, float]]], Any]:
    engine = create_engine(normalize_url(url), pool_size=2)
    upgrade(engine)
    registry = Registry()

    @registry.task(name="shop.receipt")
    def receipt(n: int) -> None:
        """A task whose handler takes `n`."""

    def reset() -> None:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE sqla_queue.jobs"))

    def plain() -> dict[str, float]:
        reset()
        call = flush = 0.0
        with Session(engine) as session, session.begin():
            for start in range(0, calls, FLUSH_EVERY):
                t0 = time.process_time()
                for n in range(start, start + FLUSH_EVERY):
                    enqueue(session, "shop.receipt", {"n": n})
                t1 = time.process_time()
                session.flush()
                t2 = time.process_time()
                call += t1 - t0
                flush += t2 - t1
        return {"enqueue_call": call / calls * 1e6, "enqueue_flush": flush / calls * 1e6}

    def task_enqueue() -> dict[str, float]:
        reset()
        spent = 0.0
        with Session(engine) as session, session.begin():
            for start in range(0, calls, FLUSH_EVERY):
                t0 = time.process_time()
                for n in range(start, start + FLUSH_EVERY):
                    receipt.enqueue(session, {"n": n})
                spent += time.process_time() - t0
                session.flush()
        return {"task_enqueue_call": spent / calls * 1e6}

    def defer() -> dict[str, float]:
        reset()
        spent = 0.0
        with Session(engine) as session, session.begin():
            for start in range(0, calls, FLUSH_EVERY):
                t0 = time.process_time()
                for n in range(start, start + FLUSH_EVERY):
                    receipt.defer(session, n=n)
                spent += time.process_time() - t0
                session.flush()
        return {"defer_call": spent / calls * 1e6}

    def bulk() -> dict[str, float]:
        reset()
        rows = [{"task": "shop.receipt", "args": {"n": n}} for n in range(BULK_ROWS)]
        with Session(engine) as session, session.begin():
            t0 = time.process_time()
            enqueue_many(session, rows)
            spent = time.process_time() - t0
        return {"enqueue_many_row": spent / BULK_ROWS * 1e6}

    paths = {"enqueue": plain, "task_enqueue": task_enqueue, "defer": defer, "bulk": bulk}
    return paths, engine


def measure(url: str, calls: int = 2000, rounds: int = 5, profile: str | None = None) -> dict:
    """Median CPU µs per job of each path over `rounds` (see the module doc)."""
    paths, engine = _paths(url, calls)
    try:
        names = list(paths)
        for name in names:  # warm-up
            paths[name]()
        runs: dict[str, list[float]] = {}
        for i in range(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                for key, value in paths[name]().items():
                    runs.setdefault(key, []).append(value)
        if profile:
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            paths["enqueue"]()
            profiler.disable()
            profiler.dump_stats(profile)
    finally:
        engine.dispose()
    return {
        "median_us": {key: round(statistics.median(v), 1) for key, v in runs.items()},
        "runs_us": {key: [round(x, 1) for x in v] for key, v in runs.items()},
        "calls": calls,
        "rounds": rounds,
        "load_average": list(os.getloadavg()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.enqueue_cpu")
    parser.add_argument("--database-url", required=True, help="a server (any database on it)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", help="write a cProfile of enqueue + flush here")
    parser.add_argument("--json", help="append the result as one JSON line to this file")
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    with scratch_database(args.database_url) as url:
        result = measure(url, args.calls, args.rounds, args.profile)
    result["label"] = args.label
    print(json.dumps(result))
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
