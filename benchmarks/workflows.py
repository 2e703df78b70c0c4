"""Workflows (issue 23): what dependencies cost, measured with real worker processes.

    python -m benchmarks.workflows --database-url postgresql://postgres@127.0.0.1:55433/postgres

creates a database of its own on that server, starts `sqla-queue worker --processes 2 -c 4
--batch 50` on the registry of `benchmarks/tasks.py` (start-up is not timed) and measures:

1. `fan`: one root -> `width` parents -> one child. The graph is inserted in one transaction
   (`enqueue_many` of every job, then one `link_jobs`); timed from the return of its COMMIT
   to the child's end (its `finished_at`). The fan-in latency runs from the last parent's
   finish (the largest `finished_at` of the parents: the `now()` of the transaction that
   finished it, so its own statement and commit are inside the figure) to the child's
   handler start (`time.time()` written by the `mark` task). For reference, `plain` drains
   the same number of jobs without dependencies in the same run, timed the same way.
2. `chain`: `length` jobs, each depending on the one before. Total from COMMIT to the last
   job's `finished_at`; per link, from a job's `finished_at` to its child's handler start
   (p50, p99, max).
3. `pairs`: `pairs` independent parent -> child pairs against 2 x `pairs` jobs without
   dependencies, drained in turn (the order alternating), timed from COMMIT until none is
   queued, running or waiting: jobs/s and the ratio, pair by pair.

1 and 2 run on a queue with retention `keep` (the finished rows stay, with `finished_at`);
3 on the default `delete` (the parents' DELETE fires the trigger, as a user meets it). Each
table is measured as it was just filled: TRUNCATEd before, no ANALYZE. Timestamps of the
database and of the worker processes come from the same machine clock.

The cost of the triggers for jobs without dependencies (the WHEN test on each finishing
row) is measured with `benchmarks/before_after.py` run from two source trees (see
BENCHMARKS.md, "Issue 23: workflows").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from sqla_queue import enqueue_many
from sqla_queue.enqueue.inserts.links import Link, link_jobs

from . import tasks
from .database import LOCAL_URL, BenchDatabase
from .processes import supervised_workers
from .stats import latency_summary, summary

Say = Callable[[str], None]

UNFINISHED = "SELECT count(*) FROM sqla_queue.jobs WHERE status IN ('queued', 'running', 'waiting')"
PROCESSES, CONCURRENCY, BATCH = 2, 4, 50


def _summaries(runs: list[dict[str, Any]], *keys: str) -> dict[str, Any]:
    """key -> median, min, max and spread of that figure over the runs."""
    return {key: summary([r[key] for r in runs]) for key in keys}


FINISHED_JOBS = "sqla_queue.all_jobs AS j"
"""Every job with its end, wherever the queue's retention put it: the jobs table or the
partitioned history (`jobs_history`), where a kept job moves as it finishes."""


def _reset(db: BenchDatabase, retention: str) -> None:
    db.sql("TRUNCATE sqla_queue.jobs, sqla_queue.job_deps, sqla_queue.jobs_history")
    db.set_retention(retention)


def _insert_graph(
    db: BenchDatabase, names: list[str], parents: list[list[int]], timed: list[float] | None = None
) -> list[int]:
    """Insert one job per task of `names`, job i depending on the jobs at `parents[i]`, in
    one transaction (`enqueue_many`, then one `link_jobs`); their ids. `timed` gets the
    seconds from the start to the return of COMMIT."""
    assert db.engine is not None
    started = time.perf_counter()
    with Session(db.engine) as session, session.begin():
        rows = [{"task": name, "args": {}} for name in names]
        ids = list(enqueue_many(session, rows, registry=tasks.registry))
        links = [
            Link(ids[i], names[i], [(ids[p], "cancel") for p in ps])
            for i, ps in enumerate(parents)
            if ps
        ]
        if links:
            link_jobs(session.connection(), links)
    if timed is not None:
        timed.append(time.perf_counter() - started)
    return ids


def _wait_done(db: BenchDatabase, job_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = db.sql(f"SELECT status FROM {FINISHED_JOBS} WHERE id = %s", (job_id,))
        if row and row[0][0] in ("done", "failed", "cancelled"):
            if row[0][0] != "done":
                raise RuntimeError(f"job {job_id} ended {row[0][0]}")
            return
        time.sleep(0.02)
    raise RuntimeError(f"job {job_id} did not end within {timeout:.0f} s")


def _wait_empty(db: BenchDatabase, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.sql(UNFINISHED)[0][0] == 0:
            return
        time.sleep(0.005)
    raise RuntimeError(f"{db.sql(UNFINISHED)[0][0]} jobs left after {timeout:.0f} s")


def _finished(db: BenchDatabase, first: int, last: int) -> dict[int, float]:
    """id -> epoch of `finished_at` of the kept jobs with ids in [first, last]."""
    rows = db.sql(
        f"SELECT id, extract(epoch FROM finished_at)::float8 FROM {FINISHED_JOBS} "
        "WHERE id BETWEEN %s AND %s AND status = 'done'",
        (first, last),
    )
    return {int(i): float(t) for i, t in rows}


class Marks:
    """The `mark` task's start times, read back from its per-process files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def read(self) -> dict[int, float]:
        started: dict[int, float] = {}
        for path in self.folder.iterdir():
            for line in path.read_text().splitlines():
                job_id, at = line.split()
                started[int(job_id)] = float(at)
        return started


@contextmanager
def workers(db: BenchDatabase) -> Iterator[Marks]:
    with tempfile.TemporaryDirectory(prefix="sqlaq_wf_marks_") as folder:
        env = {tasks.MARKS_ENV: folder}
        with supervised_workers(db, PROCESSES, BATCH, CONCURRENCY, extra_env=env):
            yield Marks(Path(folder))


# -- 1. fan-out / fan-in -----------------------------------------------------------------------


def fan_once(db: BenchDatabase, marks: Marks, width: int) -> dict[str, float]:
    _reset(db, "keep")
    names = ["noop"] + ["noop"] * width + ["mark"]
    parents = [[]] + [[0]] * width + [list(range(1, width + 1))]
    enqueued: list[float] = []
    ids = _insert_graph(db, names, parents, enqueued)
    committed = time.time()
    child = ids[-1]
    _wait_done(db, child, timeout=600)
    finished = _finished(db, ids[0], child)
    last_parent = max(finished[i] for i in ids[1:-1])
    started = marks.read()[child]
    return {
        "enqueue_s": enqueued[0],
        "total_s": finished[child] - committed,
        "fan_in_ms": (started - last_parent) * 1e3,
        "parents_per_s": width / (last_parent - finished[ids[0]]),
    }


def plain_once(db: BenchDatabase, jobs: int) -> float:
    """Seconds from the COMMIT of `jobs` jobs without dependencies to the last one's end."""
    _reset(db, "keep")
    ids = _insert_graph(db, ["noop"] * jobs, [[]] * jobs)
    committed = time.time()
    _wait_empty(db, timeout=600)
    return max(_finished(db, ids[0], ids[-1]).values()) - committed


def fan(db: BenchDatabase, marks: Marks, width: int, repeat: int, say: Say) -> dict[str, Any]:
    fan_once(db, marks, max(100, width // 10))  # warm-up
    plain_once(db, max(100, width // 10))
    runs, plain = [], []
    for _ in range(repeat):
        runs.append(fan_once(db, marks, width))
        plain.append(plain_once(db, width + 2))
        say(
            f"fan {width:,}: total {runs[-1]['total_s']:.2f} s, fan-in "
            f"{runs[-1]['fan_in_ms']:.1f} ms; the same jobs without dependencies {plain[-1]:.2f} s"
        )
    return {
        "width": width,
        **_summaries(runs, "enqueue_s", "total_s", "fan_in_ms", "parents_per_s"),
        "plain_total_s": summary(plain),
        "ratio_to_plain": summary([r["total_s"] / p for r, p in zip(runs, plain, strict=True)]),
    }


# -- 2. chain ----------------------------------------------------------------------------------


def chain_once(db: BenchDatabase, marks: Marks, length: int) -> dict[str, Any]:
    _reset(db, "keep")
    enqueued: list[float] = []
    parents = [[]] + [[i - 1] for i in range(1, length)]
    ids = _insert_graph(db, ["mark"] * length, parents, enqueued)
    committed = time.time()
    _wait_done(db, ids[-1], timeout=max(600, length * 0.2))
    finished = _finished(db, ids[0], ids[-1])
    started = marks.read()
    links = [(started[ids[i]] - finished[ids[i - 1]]) * 1e3 for i in range(1, length)]
    handler_to_handler = [(started[ids[i]] - started[ids[i - 1]]) * 1e3 for i in range(1, length)]
    return {
        "enqueue_s": enqueued[0],
        "total_s": finished[ids[-1]] - committed,
        "link": latency_summary(links),
        "start_to_start_p50_ms": statistics.median(handler_to_handler),
        "first_start_ms": (started[ids[0]] - committed) * 1e3,
    }


def wake_once(db: BenchDatabase, marks: Marks, probes: int) -> list[float]:
    """Milliseconds from the COMMIT of one job without dependencies to its handler's start,
    one job at a time: the NOTIFY wake-up the chain's links are compared with."""
    _reset(db, "keep")
    committed = {}
    for _ in range(probes):
        (job_id,) = _insert_graph(db, ["mark"], [[]])
        committed[job_id] = time.time()
        _wait_done(db, job_id, timeout=60)
    started = marks.read()
    return [(started[i] - at) * 1e3 for i, at in committed.items()]


def chain(db: BenchDatabase, marks: Marks, length: int, repeat: int, say: Say) -> dict[str, Any]:
    chain_once(db, marks, max(20, length // 20))  # warm-up
    runs = []
    for _ in range(repeat):
        runs.append(chain_once(db, marks, length))
        r = runs[-1]
        r["wake"] = latency_summary(wake_once(db, marks, max(20, min(200, length // 10))))
        say(
            f"chain {length:,}: total {r['total_s']:.1f} s, per link p50 {r['link']['p50']:.1f} "
            f"ms, p99 {r['link']['p99']:.1f} ms, max {r['link']['max']:.1f} ms; a lone job's "
            f"commit to start p50 {r['wake']['p50']:.1f} ms, p99 {r['wake']['p99']:.1f} ms"
        )
    for r in runs:
        r["links_per_s"] = (length - 1) / r["total_s"]
        for key in ("p50", "p99", "max"):
            r[f"link_{key}_ms"] = r["link"][key]
        for key in ("p50", "p99"):
            r[f"wake_{key}_ms"] = r["wake"][key]
    return {
        "length": length,
        **_summaries(
            runs,
            "enqueue_s",
            "total_s",
            "links_per_s",
            "link_p50_ms",
            "link_p99_ms",
            "link_max_ms",
            "start_to_start_p50_ms",
            "first_start_ms",
            "wake_p50_ms",
            "wake_p99_ms",
        ),
    }


# -- 3. pairs against independent jobs ---------------------------------------------------------


def drain_once(db: BenchDatabase, pairs: int, linked: bool) -> float:
    """Jobs/s of 2 x `pairs` no-op jobs, each of the second half depending on one of the
    first (`linked`) or none, from their COMMIT until none is queued, running or waiting."""
    _reset(db, "delete")
    jobs = 2 * pairs
    parents = [[]] * pairs + ([[i] for i in range(pairs)] if linked else [[]] * pairs)
    _insert_graph(db, ["noop"] * jobs, parents)
    started = time.monotonic()
    _wait_empty(db, timeout=600)
    return jobs / (time.monotonic() - started)


def pairs_vs_plain(db: BenchDatabase, pairs: int, repeat: int, say: Say) -> dict[str, Any]:
    drain_once(db, max(100, pairs // 5), True)  # warm-up
    drain_once(db, max(100, pairs // 5), False)
    linked: list[float] = []
    plain: list[float] = []
    for r in range(repeat):
        for is_linked in (True, False) if r % 2 == 0 else (False, True):
            (linked if is_linked else plain).append(drain_once(db, pairs, is_linked))
        say(
            f"{pairs:,} pairs: {linked[-1]:,.0f} jobs/s; {2 * pairs:,} independent jobs: "
            f"{plain[-1]:,.0f} jobs/s ({linked[-1] / plain[-1]:.2f}x)"
        )
    ratios = [a / b for a, b in zip(linked, plain, strict=True)]
    return {
        "pairs": pairs,
        "linked": summary(linked),
        "plain": summary(plain),
        "ratio": summary(ratios),
    }


# -- 4. the triggers' cost for jobs without dependencies ---------------------------------------

WORKFLOW_TRIGGERS = (
    "SELECT tgname FROM pg_trigger WHERE tgrelid = 'sqla_queue.jobs'::regclass "
    "AND NOT tgisinternal AND tgname LIKE 'job%%'"
)
"""The workflow triggers on the jobs table (job_ended_*, jobs_ended_*, job_retried): by
name, so that any revision's set is found."""
FINISH = {
    # the worker's finishing statement returns the rows it ends (for its hooks and archive)
    "delete": "DELETE FROM sqla_queue.jobs WHERE id = ANY(%s) RETURNING *",
    "keep": "UPDATE sqla_queue.jobs SET status = 'done', finished_at = now() WHERE id = ANY(%s) "
    "RETURNING *",
}


def _set_triggers(db: BenchDatabase, enabled: bool) -> None:
    verb = "ENABLE" if enabled else "DISABLE"
    for (name,) in db.sql(WORKFLOW_TRIGGERS):
        db.sql(f"ALTER TABLE sqla_queue.jobs {verb} TRIGGER {name}")


def _running_jobs(db: BenchDatabase, jobs: int) -> list[int]:
    """A jobs table of `jobs` running jobs without dependencies (just filled); their ids."""
    db.sql("TRUNCATE sqla_queue.jobs")
    db.sql(
        "INSERT INTO sqla_queue.jobs (task, args, status, attempts, locked_at) "
        "SELECT 'noop', '{}', 'running', 1, now() FROM generate_series(1, %s)",
        (jobs,),
    )
    return [int(r[0]) for r in db.sql("SELECT id FROM sqla_queue.jobs ORDER BY id")]


def finish_blocks(
    db: BenchDatabase, jobs: int, batch: int, finish: str, block: int = 1_000
) -> tuple[float, float, list[float]]:
    """Finish `jobs` running jobs without dependencies, `batch` per statement in autocommit
    transactions (the worker's finishing write alone, asynchronous commit as the worker's),
    in blocks of `block` jobs with the workflow triggers enabled and disabled in turn (each
    pair of blocks in alternating order, so that the machine's load falls on both alike).
    Microseconds per job with and without them, and the ratio of each pair of blocks."""
    ids = _running_jobs(db, jobs)
    spent = {True: 0.0, False: 0.0}
    ratios: list[float] = []
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        blocks = [ids[k : k + block] for k in range(0, jobs - 2 * block + 1, block)]
        for pair in range(len(blocks) // 2):
            took = {}
            order = (True, False) if pair % 2 == 0 else (False, True)
            for enabled, chunk in zip(order, blocks[2 * pair : 2 * pair + 2], strict=True):
                _set_triggers(db, enabled)
                started = time.perf_counter()
                for k in range(0, len(chunk), batch):
                    conn.execute(FINISH[finish], (chunk[k : k + batch],))
                took[enabled] = time.perf_counter() - started
                spent[enabled] += took[enabled]
            ratios.append(took[True] / took[False])
    half = len(ratios) * block
    return spent[True] / half * 1e6, spent[False] / half * 1e6, ratios


def finish_cost(
    db: BenchDatabase, jobs: int, repeat: int, say: Say, batch: int = 50
) -> dict[str, Any]:
    """The finishing statements of jobs without dependencies with the workflow triggers
    enabled and disabled, interleaved block by block on one database: the WHEN test's cost,
    server and round trip included, without the worker's own work around it."""
    result: dict[str, Any] = {"jobs": jobs, "batch": batch, "block": min(1_000, jobs // 4)}
    try:
        for finish in ("delete", "keep"):
            finish_blocks(db, max(1_000, jobs // 5), batch, finish, result["block"] // 2)
            runs = [finish_blocks(db, jobs, batch, finish, result["block"]) for _ in range(repeat)]
            result[finish] = {
                "with_triggers_us": summary([r[0] for r in runs]),
                "without_triggers_us": summary([r[1] for r in runs]),
                "ratio": summary([r[0] / r[1] for r in runs]),
                "block_ratio": summary([x for r in runs for x in r[2]]),
            }
            res = result[finish]
            say(
                f"finish by {finish}, {batch} a statement: {res['with_triggers_us']['median']:.1f}"
                f" us/job with the triggers, {res['without_triggers_us']['median']:.1f} without "
                f"({res['ratio']['median']:.3f}x; block pairs {res['block_ratio']['median']:.3f}x)"
            )
    finally:
        _set_triggers(db, True)
        db.sql("TRUNCATE sqla_queue.jobs")
    return result


# -- the harness's optional section, and the command -------------------------------------------


def measure(
    db: BenchDatabase,
    width: int,
    length: int,
    pairs: int,
    repeat: int,
    say: Say = print,
    finish_jobs: int = 40_000,
) -> dict[str, Any]:
    with workers(db) as marks:
        result: dict[str, Any] = {
            "workers": f"sqla-queue worker --processes {PROCESSES} -c {CONCURRENCY} "
            f"--batch {BATCH} --poll-interval 0.1",
            "fan": fan(db, marks, width, repeat, say),
            "chain": chain(db, marks, length, repeat, say),
            "pairs": pairs_vs_plain(db, pairs, max(repeat, 3), say),
        }
    _reset(db, "delete")
    if finish_jobs:
        result["finish_cost"] = finish_cost(db, finish_jobs, max(repeat, 3), say)
    return result


def run(db: BenchDatabase, plan: Any, say: Say) -> dict[str, Any]:
    """The harness's section: 10,000 wide and long in a full run, smaller when quick."""
    size = min(10_000 if not plan.is_quick else 2_000, plan.drain_jobs)
    return measure(db, size, size, max(50, size // 2), plan.repeat, say, max(500, size))


def _range(s: dict[str, Any], fmt: str) -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def markdown(result: dict[str, Any]) -> str:
    fan, chain_, pairs = result["fan"], result["chain"], result["pairs"]
    repeat = len(fan["total_s"]["samples"])
    lines = [
        f"Medians (min-max) of {repeat} runs; `{result['workers']}`, no-op handlers.",
        "",
        "| measurement | figure |",
        "|---|---:|",
        f"| fan-out/fan-in 1 -> {fan['width']:,} -> 1: commit to the child's end, s "
        f"| {_range(fan['total_s'], '.2f')} |",
        f"| its enqueue (enqueue_many + link_jobs, one transaction), s "
        f"| {_range(fan['enqueue_s'], '.2f')} |",
        f"| the same {fan['width'] + 2:,} jobs without dependencies: commit to the last end, s "
        f"| {_range(fan['plain_total_s'], '.2f')} |",
        f"| fan-out/fan-in against them, run by run | {_range(fan['ratio_to_plain'], '.2f')}x |",
        "| fan: parents finished a second (the root's finish to the last parent's) "
        f"| {_range(fan['parents_per_s'], ',.0f')} |",
        "| fan-in: the last parent's finish to the child's handler start, ms "
        f"| {_range(fan['fan_in_ms'], '.1f')} |",
        f"| chain of {chain_['length']:,}: commit to the last job's end, s "
        f"| {_range(chain_['total_s'], '.1f')} |",
        f"| its enqueue, s | {_range(chain_['enqueue_s'], '.2f')} |",
        f"| chain: links/s | {_range(chain_['links_per_s'], ',.0f')} |",
        f"| chain, per link, a job's finish to its child's handler start: p50, ms "
        f"| {_range(chain_['link_p50_ms'], '.1f')} |",
        f"| chain, per link: p99, ms | {_range(chain_['link_p99_ms'], '.1f')} |",
        f"| chain, per link: max, ms | {_range(chain_['link_max_ms'], '.1f')} |",
        "| chain: a job's handler start to its child's, p50, ms "
        f"| {_range(chain_['start_to_start_p50_ms'], '.1f')} |",
        "| a lone job without dependencies, commit to handler start (after each chain, "
        f"one at a time): p50, ms | {_range(chain_['wake_p50_ms'], '.1f')} |",
        f"| the same: p99, ms | {_range(chain_['wake_p99_ms'], '.1f')} |",
        f"| {pairs['pairs']:,} parent -> child pairs: jobs/s | {_range(pairs['linked'], ',.0f')} |",
        f"| {2 * pairs['pairs']:,} independent jobs: jobs/s | {_range(pairs['plain'], ',.0f')} |",
        f"| pairs / independent, pair by pair ({len(pairs['ratio']['samples'])} pairs) "
        f"| {_range(pairs['ratio'], '.2f')}x |",
    ]
    cost = result.get("finish_cost")
    for finish in ("delete", "keep") if cost else ():
        c = cost[finish]
        lines += [
            f"| finishing {cost['jobs']:,} jobs without dependencies ({finish}, "
            f"{cost['batch']} a statement), triggers on / off, interleaved in blocks of "
            f"{cost['block']:,} ({len(c['ratio']['samples'])} runs) "
            f"| {_range(c['ratio'], '.3f')}x |",
            f"| the same, block pair by block pair | {_range(c['block_ratio'], '.3f')}x |",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("SQLA_QUEUE_BENCH_URL", LOCAL_URL))
    parser.add_argument("--width", type=int, default=10_000, help="parents of the fan-out")
    parser.add_argument("--length", type=int, default=10_000, help="jobs of the chain")
    parser.add_argument("--pairs", type=int, default=5_000, help="parent -> child pairs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--finish-jobs",
        type=int,
        default=40_000,
        help="jobs per finishing run, half with and half without the triggers (0: skip it)",
    )
    parser.add_argument("--output", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    db = BenchDatabase(args.database_url)
    db.create()
    try:
        result = measure(
            db, args.width, args.length, args.pairs, args.repeat, finish_jobs=args.finish_jobs
        )
    finally:
        db.drop()
    result["at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["cpus"] = os.cpu_count()
    print(markdown(result))
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
