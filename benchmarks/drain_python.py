"""Issue 39: the worker's own Python per claimed job, without a database (round 7).

    PYTHONPATH=TREE python benchmarks/drain_python.py [--rounds 250] [--claim 400]

Builds a real `Worker` (its engine never connects) for a no-op task and runs, on this
thread, what its threads do for each job of a claim of `--claim` rows shaped as the claim
returns them: the dispatcher's rows -> `ClaimedJob`s (`make`: the args' JSON, the
`JobContext`), the board's lock rounds (`board`: put, take, settle, and the successes taken
for the next claim with their ids), and the handler thread's run (`run`: `Executor.execute`,
`JobRunner.run_job`, the rollup's count). Prints each stage's thread CPU time per job (its
`time.thread_time`, so other processes' load inflates it less than wall time; the clock's
own calls are in the figures, the same for every tree). Run it alternately with two trees
first on `PYTHONPATH` (a `git archive` of each) to pair them; BENCHMARKS.md, issue 39 round 7.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from sqlalchemy import create_engine

from sqla_queue import Registry
from sqla_queue.job.outcome import Outcome
from sqla_queue.worker import Worker, WorkerConfig
from sqla_queue.worker.jobs import ClaimColumns, ClaimedJob

KEYS = [
    "id", "task", "args_json", "attempts", "max_attempts", "queue", "status", "tags",
    "meta_json", "about", "finished",
]  # fmt: skip
"""The claim's columns, in its order (`complete_and_claim`: `finished` last)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=250)
    parser.add_argument("--claim", type=int, default=400)
    opts = parser.parse_args()
    registry = Registry()

    @registry.task(name="noop")
    def noop(**_: object) -> None:
        return None

    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/never")  # not connected
    worker = Worker(engine, registry, WorkerConfig(concurrency=16, batch=50, burst=True))
    board, executor, make = worker.board, worker.executor, worker.producer._make_job
    spent = {"make": 0.0, "run": 0.0, "board": 0.0}
    clock, size, warm = time.thread_time, opts.claim, 20
    gc.collect()
    for round_ in range(opts.rounds + warm):
        base = round_ * size
        rows = [
            (base + i, "noop", json.dumps({"n": base + i}), 1, None, "default", "running",
             None, "{}", None, 0)
            for i in range(size)
        ]  # fmt: skip
        t0 = clock()
        columns = ClaimColumns(KEYS)
        jobs = [make(row, columns) for row in rows]
        t1 = clock()
        board.put(jobs)
        on_board, running = clock() - t1, 0.0
        job: ClaimedJob | None = None
        outcome: Outcome | None = None
        for _ in range(size):  # one handler thread's loop (`Executor.serve`), back to back
            a = clock()
            with board.mutex:
                if job is not None:
                    board._settle(job, outcome)
                board.running += 1
                job = board.ready.popleft()
            b = clock()
            outcome = executor.execute(job)
            assert job.take()  # this loop is the job's only taker
            worker._finished(outcome)
            c = clock()
            on_board += b - a
            running += c - b
        a = clock()
        assert job is not None
        with board.mutex:
            board._settle(job, outcome)
        taken = worker.completer.take_successes() or []
        done = [j for j in taken if not j.ctx.committed]
        _ = ([j.id for j in done], [j.attempt for j in done])
        on_board += clock() - a
        if round_ >= warm:
            spent["make"] += t1 - t0
            spent["run"] += running
            spent["board"] += on_board
    jobs_run = opts.rounds * size
    figures = {k: round(v / jobs_run * 1e6, 2) for k, v in spent.items()}
    figures["total"] = round(sum(spent.values()) / jobs_run * 1e6, 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
