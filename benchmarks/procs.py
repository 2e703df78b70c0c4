"""Entry points of the processes the harness starts: `python -m benchmarks.procs KIND ...`.

- worker URL CONCURRENCY BATCH: one sqla-queue worker until SIGTERM.
- produce orm|raw URL SECONDS REPEAT: one job per transaction in a loop. Prints "ready", reads
  the epoch START from stdin, then prints the number committed in each window
  [START + k*SECONDS, START + (k+1)*SECONDS) as JSON. Before START is the warm-up, not counted.
- enqueue URL COUNT: COUNT jobs, one per transaction, with `enqueue()`; then exits.
- steady URL RATE [BATCH]: prints "ready", reads the epoch UNTIL from stdin, then enqueues at
  RATE jobs/s until UNTIL, one job per transaction (`enqueue()`), or BATCH jobs per
  transaction (`enqueue_many()`); prints the number enqueued and the seconds.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from sqla_queue import enqueue, enqueue_many
from sqla_queue.worker import Worker, WorkerConfig

from .tasks import registry

RAW_INSERT = "INSERT INTO sqla_queue.jobs (task, args, queue) VALUES (%s, %s, %s)"


def run_worker(url: str, concurrency: int, batch: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    config = WorkerConfig(concurrency=concurrency, batch=batch, poll_interval=0.1)
    stats = Worker(url, registry, config).run(install_signal_handlers=True)
    print(json.dumps(stats.__dict__), flush=True)


def produce(kind: str, url: str, seconds: float, repeat: int) -> None:
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    counts = [0] * repeat
    end = start + seconds * repeat
    n = 0
    if kind == "raw":
        conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1))
        while (now := time.time()) < end:
            conn.execute(RAW_INSERT, ("noop", Jsonb({"n": n}), "default"))
            conn.commit()
            n += 1
            if now >= start and (k := int((time.time() - start) / seconds)) < repeat:
                counts[k] += 1
        conn.close()
    else:
        engine = create_engine(url, pool_size=1)
        while (now := time.time()) < end:
            with Session(engine) as session, session.begin():
                enqueue(session, "noop", {"n": n})
            n += 1
            if now >= start and (k := int((time.time() - start) / seconds)) < repeat:
                counts[k] += 1
        engine.dispose()
    print(json.dumps(counts), flush=True)


def enqueue_count(url: str, count: int) -> None:
    engine = create_engine(url, pool_size=1)
    for n in range(count):
        with Session(engine) as session, session.begin():
            enqueue(session, "noop", {"n": n})
    engine.dispose()


def steady(url: str, rate: float, batch: int = 1) -> None:
    engine = create_engine(url, pool_size=1)
    with engine.connect():
        pass  # connected before the clock starts
    print("ready", flush=True)
    until = float(sys.stdin.readline())
    start = time.time()
    interval = batch / rate
    due = time.monotonic()
    n = 0
    while time.time() < until:
        with Session(engine) as session, session.begin():
            if batch == 1:
                enqueue(session, "noop", {"n": n})
            else:
                rows = [{"task": "noop", "args": {"n": n + k}} for k in range(batch)]
                enqueue_many(session, rows)
        n += batch
        due += interval
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    engine.dispose()
    print(json.dumps({"jobs": n, "seconds": time.time() - start}), flush=True)


def main(argv: list[str]) -> None:
    kind, *rest = argv
    if kind == "worker":
        run_worker(rest[0], int(rest[1]), int(rest[2]))
    elif kind == "produce":
        produce(rest[0], rest[1], float(rest[2]), int(rest[3]))
    elif kind == "enqueue":
        enqueue_count(rest[0], int(rest[1]))
    elif kind == "steady":
        steady(rest[0], float(rest[1]), int(rest[2]) if len(rest) > 2 else 1)
    else:
        raise SystemExit(f"unknown process kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
