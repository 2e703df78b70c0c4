"""Durable execution (issue 36): steps, signals and parked jobs, side by side in one run.

    python -m benchmarks.durable [--database-url URL] [--output FILE] [sizes, see --help]

One private cluster with stock settings (unless --database-url) serves three measurements;
within each, the sides alternate (A B .. B A) so a machine whose load drifts weighs on
every side alike:

1. **What a recorded step costs**: jobs of `--steps` steps (`ctx.step`, each calling a
   function that returns a small dict), jobs calling the same function as often without a
   step, no-op jobs, and jobs of `session=True` steps, `--step-jobs` of each, drained by one
   worker process (`sqla-queue worker --processes 1`, `--step-concurrency`, `--step-batch`),
   timed from the fill's commit to the last job's end. A step's cost is (steps - direct) /
   (jobs x steps), in µs of the drain's wall time, and as a share of a no-op job's.
   `--step-synchronous-commit off` sets the database's default, for a diagnosis of what
   the step record's commit (its WAL flush) costs.
2. **Signal commit -> handler start**: signal probes (jobs parked by `ctx.wait_for_signal`
   beforehand) and plain probes (enqueue commit -> handler start, `tasks.probe`), sent in
   turn to one worker (concurrency 4, batch 10, in this process), at idle and under
   `--load-rate` jobs/s of other jobs (`--load-producers` processes, `--load-batch` jobs per
   transaction by `enqueue_many`: one job per commit reached 493 jobs/s from 4 processes on
   the shared machine). The target: the signal's p99 within 2x the plain enqueue's.
3. **Parked jobs and the claim**: three databases, one with no parked job, one with
   `--parked` jobs asleep (`ctx.sleep`, three days), one with as many waiting for signals;
   the first `--seed` of each are parked by a worker running the real handler, the rest are
   copies of their rows (same status, run_at, signal key shape). Never analyzed by the
   harness: cold, as users meet them (autovacuum may come by). Per side and round:
   `--backlog` no-op jobs inserted, the worker's claim (prepared, generic plan, as
   `sqla_queue.db.queries.claim_plan` builds it for doctor) run `--claims` times, each
   rolled back, with that backlog due and no worker running; then one worker process
   drains the backlog (timed from its queue's unpause, the worker registered first); then
   `--claims` claims that find nothing due (an idle poll).
   An `EXPLAIN (ANALYZE, BUFFERS)` of each claim shows what it reads. The target: claim p99
   and drain rate >= 0.95x of the side with no parked job. `--backlog-priority 1` gives
   the backlog a priority the parked jobs (0) come before in the claim index's order.

Prints one JSON line per measurement, then the whole result (also written to --output).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import enqueue_many
from sqla_queue.db.queries.claim_plan import claim_explain_sql
from sqla_queue.worker import Worker, WorkerConfig

from . import tasks
from .cluster import PrivateCluster
from .database import JOBS, BenchDatabase
from .processes import supervised_workers
from .scenarios import Probes, spawn, wait_started
from .stats import latency_summary, summary

Say = Callable[[str], None]

STEP_SIDES = {
    "noop": ("noop", "'{}'::jsonb"),
    "direct": ("durable.direct", "jsonb_build_object('n', %(steps)s::int)"),
    "steps": ("durable.steps", "jsonb_build_object('n', %(steps)s::int)"),
    "session_steps": ("durable.session_steps", "jsonb_build_object('n', %(steps)s::int)"),
}
"""Side -> (task, its args as SQL) of the step-cost drains."""

PARKED_SIDES = ("none", "sleeping", "waiting")
PARKED_TASKS = {"sleeping": "durable.sleeper", "waiting": "durable.waiter"}
IS_PARKED = {
    "sleeping": "status = 'waiting' AND signal_key IS NULL AND deps_left IS NULL",
    "waiting": "status = 'waiting' AND signal_key IS NOT NULL",
}
"""How a parked job of each kind looks in the jobs table (what `ctx.sleep` and
`ctx.wait_for_signal` leave: both `waiting`, a sleeper with neither a signal key nor jobs
to wait for, due in three days: `sqla_queue.db.models.SLEEPS`)."""

PAUSE = "UPDATE sqla_queue.queues SET paused = %s WHERE name = 'default'"
TIMEOUT = 600.0


# -- filling and draining ----------------------------------------------------------------------


def fill(
    db: BenchDatabase, task: str, args_sql: str, count: int, priority: int = 0, **params: Any
) -> range:
    """`count` queued jobs of `task` in one transaction (no ANALYZE: cold), woken by one
    NOTIFY; returns their ids."""
    row = db.sql(
        f"WITH made AS (INSERT INTO {JOBS} (task, args, priority) "
        f"SELECT %(task)s, {args_sql}, %(priority)s FROM generate_series(1, %(count)s) g "
        "RETURNING id) SELECT min(id), max(id), pg_notify('sqla_queue', 'default') FROM made",
        {"task": task, "count": count, "priority": priority, **params},
    )[0]
    return range(int(row[0]), int(row[1]) + 1)


def wait_drained(db: BenchDatabase, ids: range, timeout: float = TIMEOUT) -> float:
    """Wait until none of `ids` is queued or running (a primary-key range read: the same
    cost whatever else the table holds); the monotonic time it was seen. Raises if one
    failed or the time ran out."""
    deadline = time.monotonic() + timeout
    left_sql = (
        f"SELECT count(*) FILTER (WHERE status IN ('queued', 'running')), "
        f"count(*) FILTER (WHERE status = 'failed') FROM {JOBS} WHERE id BETWEEN %s AND %s"
    )
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        while True:
            left, failed = conn.execute(left_sql, (ids.start, ids.stop - 1)).fetchone() or (0, 0)
            now = time.monotonic()
            if failed:
                raise RuntimeError(f"{failed} benchmark job(s) failed: see the worker's log")
            if left == 0:
                return now
            if now > deadline:
                raise RuntimeError(f"{left} of {len(ids)} jobs left after {timeout:.0f} s")
            time.sleep(0.01)


@contextmanager
def paused_worker(db: BenchDatabase, concurrency: int, batch: int) -> Iterator[Callable[[], float]]:
    """One worker process on `db`, registered while its queue is paused (its start is not
    timed); yields `go()`, which unpauses and returns the monotonic time it did."""
    db.sql(PAUSE, (True,))

    def go() -> float:
        db.sql(PAUSE, (False,))
        started = time.monotonic()
        db.sql("SELECT pg_notify('sqla_queue', 'default')")
        return started

    try:
        with supervised_workers(db, 1, batch, concurrency):
            yield go
    finally:
        db.sql(PAUSE, (False,))


def alternated(sides: tuple[str, ...], repeat: int) -> Iterator[str]:
    """A B C, C B A, A B C ...: each side as often early as late."""
    for r in range(repeat):
        yield from sides if r % 2 == 0 else reversed(sides)


# -- 1. what a step costs ----------------------------------------------------------------------


def step_cost(server: str, args: argparse.Namespace, say: Say) -> dict[str, Any]:
    """Measurement 1: drain times of each `STEP_SIDES` kind, alternated; a step's cost."""
    db = BenchDatabase(server)
    db.create()
    if args.step_synchronous_commit == "off":  # a diagnosis: what the WAL flush costs a step
        db.sql(f'ALTER DATABASE "{db.name}" SET synchronous_commit = off')
    seconds: dict[str, list[float]] = {side: [] for side in STEP_SIDES}
    steps_left = []
    try:
        with paused_worker(db, args.step_concurrency, args.step_batch) as go:
            go()
            warm = [fill(db, *STEP_SIDES[s], max(10, args.step_jobs // 10), steps=args.steps)
                    for s in STEP_SIDES]  # fmt: skip
            for ids in warm:
                wait_drained(db, ids)
            for side in alternated(tuple(STEP_SIDES), args.repeat * 2):
                db.sql(PAUSE, (True,))
                ids = fill(db, *STEP_SIDES[side], args.step_jobs, steps=args.steps)
                started = go()
                seconds[side].append(wait_drained(db, ids) - started)
                steps_left.append(int(db.sql("SELECT count(*) FROM sqla_queue.job_steps")[0][0]))
                say(f"steps {side}: {args.step_jobs / seconds[side][-1]:,.0f} jobs/s")
    finally:
        db.drop()
    median = {side: statistics.median(s) for side, s in seconds.items()}
    steps = args.step_jobs * args.steps
    noop_us = median["noop"] / args.step_jobs * 1e6

    def per_step(side: str) -> dict[str, Any]:
        us = (median[side] - median["direct"]) / steps * 1e6
        return {"us": round(us, 1), "of_noop_job": round(us / noop_us, 3)}

    return {
        "jobs": args.step_jobs,
        "steps_per_job": args.steps,
        "worker": {"processes": 1, "concurrency": args.step_concurrency, "batch": args.step_batch},
        "synchronous_commit": args.step_synchronous_commit,
        "seconds": {side: summary(s) for side, s in seconds.items()},
        "jobs_per_s": {side: round(args.step_jobs / m, 1) for side, m in median.items()},
        "noop_job_us": round(noop_us, 1),
        "direct_call_us": round((median["direct"] - median["noop"]) / steps * 1e6, 2),
        "step": per_step("steps"),
        "session_step": per_step("session_steps"),
        "step_rows_left_after_drains": max(steps_left),
    }


# -- 2. signal commit -> handler start ---------------------------------------------------------


class SignalProbes:
    """Signal probes parked in advance: `send()` signals the next and commits."""

    def __init__(self, db: BenchDatabase, count: int) -> None:
        assert db.engine is not None
        self.engine = db.engine
        self.count = count
        self.seq = 0
        with Session(self.engine) as session, session.begin():
            rows = [{"task": "durable.signal_probe", "args": {"seq": n}} for n in range(count)]
            enqueue_many(session, rows)

    def wait_parked(self, db: BenchDatabase, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        waiting = (
            f"SELECT count(*) FROM {JOBS} "
            "WHERE task = 'durable.signal_probe' AND status = 'waiting'"
        )
        while int(db.sql(waiting)[0][0]) < self.count:
            if time.monotonic() > deadline:
                raise RuntimeError("the signal probes did not park in time")
            time.sleep(0.05)

    def send(self) -> tuple[int, float]:
        seq, self.seq = self.seq, self.seq + 1
        with Session(self.engine) as session, session.begin():
            woke = sqla_queue.signal(session, f"probe:{seq}", {"seq": seq})
            at = time.perf_counter()  # the COMMIT goes next: the woken run may start before
            # the session's end returns (it gives its connection back to the pool, a round trip)
        if woke != 1:
            raise RuntimeError(f"signal probe:{seq} woke {woke} jobs, not 1")
        return seq, at


def _ms(sent: list[tuple[int, float]], started: dict[int, float]) -> list[float]:
    return [(started[seq] - at) * 1000 for seq, at in sent]


def signal_latency(server: str, args: argparse.Namespace, say: Say) -> dict[str, Any]:
    """Measurement 2: signal and plain probes in turn, idle then under load."""
    db = BenchDatabase(server)
    db.create()
    config = WorkerConfig(concurrency=4, batch=10)
    worker = Worker(db.url, tasks.registry, config)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    result: dict[str, Any] = {"worker": {"concurrency": 4, "batch": 10}}
    loads: list[Any] = []
    try:
        warmup = 20
        signals = SignalProbes(db, warmup + args.idle_probes + args.load_probes)
        plain = Probes(db)
        signals.wait_parked(db)
        sent: dict[str, list[tuple[int, float]]] = {"plain": [], "signal": []}
        for k in range(warmup + args.idle_probes):
            for kind in ("plain", "signal") if k % 2 == 0 else ("signal", "plain"):
                if kind == "plain":
                    seq, at = plain.send()
                    wait_started([seq], 30)
                else:
                    seq, at = signals.send()
                    wait_started([seq], 30, tasks.signal_started)
                if k >= warmup:
                    sent[kind].append((seq, at))
        result["idle"] = _latency_pair(sent)
        say(f"signal latency idle: {_pair_line(result['idle'])}")

        share = args.load_rate / args.load_producers
        loads = [
            spawn("steady", db.url, share, args.load_batch, stdin=True)
            for _ in range(args.load_producers)
        ]
        for load in loads:
            load.stdout.readline()  # connected: the load runs from the time given next
        duration = 3 + args.load_probes * 0.025 + 5
        until = time.time() + duration
        for load in loads:
            load.stdin.write(f"{until}\n")
            load.stdin.flush()
        time.sleep(2)  # the load reaches its rate
        sent = {"plain": [], "signal": []}
        for k in range(args.load_probes):
            for kind in ("plain", "signal") if k % 2 == 0 else ("signal", "plain"):
                sent[kind].append(plain.send() if kind == "plain" else signals.send())
                time.sleep(0.01)
        wait_started([seq for seq, _ in sent["plain"]], 60)
        wait_started([seq for seq, _ in sent["signal"]], 60, tasks.signal_started)
        achieved = [json.loads(load.communicate(timeout=duration + 60)[0]) for load in loads]
        result["load"] = _latency_pair(sent)
        result["load"]["background_jobs_per_s"] = round(
            sum(a["jobs"] / a["seconds"] for a in achieved), 1
        )
        result["load"]["background_processes"] = args.load_producers
        result["load"]["background_jobs_per_transaction"] = args.load_batch
        result["load"]["background_target_per_s"] = args.load_rate
        say(f"signal latency under load: {_pair_line(result['load'])}")
    finally:
        for load in loads:
            if load.poll() is None:
                load.kill()
                load.wait()
        worker.stop()
        thread.join(60)
        db.drop()
    return result


def _latency_pair(sent: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    plain = latency_summary(_ms(sent["plain"], tasks.probe_started))
    signal = latency_summary(_ms(sent["signal"], tasks.signal_started))
    ratio = signal["p99"] / plain["p99"]
    return {
        "plain_ms": plain,
        "signal_ms": signal,
        "p99_ratio": round(ratio, 3),
        "target_met": ratio <= 2.0,
    }


def _pair_line(pair: dict[str, Any]) -> str:
    p, s = pair["plain_ms"], pair["signal_ms"]
    return (
        f"plain p50 {p['p50']:.2f} p99 {p['p99']:.2f} ms, signal p50 {s['p50']:.2f} "
        f"p99 {s['p99']:.2f} ms ({pair['p99_ratio']:.2f}x)"
    )


# -- 3. parked jobs and the claim --------------------------------------------------------------


def park(db: BenchDatabase, kind: str, count: int, seed: int) -> dict[str, Any]:
    """`count` parked jobs of `kind`: `seed` parked by a worker running the real handler,
    the rest copies of their rows (a waiter's copy waits for a key of its own)."""
    task = PARKED_TASKS[kind]
    args_sql = "jsonb_build_object('key', 'park:' || g)" if kind == "waiting" else "'{}'::jsonb"
    seed = min(seed, count)
    ids = fill(db, task, args_sql, seed)
    parked_sql = f"SELECT count(*) FROM {JOBS} WHERE {IS_PARKED[kind]}"
    deadline = time.monotonic() + TIMEOUT
    with supervised_workers(db, 1, 50, 16):
        while int(db.sql(parked_sql)[0][0]) < seed:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind}: the seed jobs did not park in time")
            time.sleep(0.1)
    columns = [
        name
        for (name,) in db.sql(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "'sqla_queue' AND table_name = 'jobs' AND column_name <> 'id' "
            "AND is_generated = 'NEVER' ORDER BY ordinal_position"
        )
    ]
    chosen = ", ".join(columns)
    copied = ", ".join(
        "j.signal_key || '#' || g" if c == "signal_key" else f"j.{c}" for c in columns
    )
    if count > seed:
        db.sql(
            f"INSERT INTO {JOBS} ({chosen}) SELECT {copied} FROM "
            f"(SELECT * FROM {JOBS} WHERE id BETWEEN %s AND %s) j, "
            "generate_series(1, %s) g LIMIT %s",
            (ids.start, ids.stop - 1, -(-(count - seed) // seed), count - seed),
        )
    parked = int(db.sql(parked_sql)[0][0])
    return {"kind": kind, "parked": parked, "by_worker": seed, "copied": parked - seed}


def claim_statements() -> tuple[str, str]:
    """`PREPARE` and `EXECUTE` of the worker's claim of 50 from any queue (doctor's texts)."""
    prepare, explain = claim_explain_sql(postgresql.dialect(), None, 50)
    return prepare, explain.removeprefix("EXPLAIN ")


def claim_times(db: BenchDatabase, count: int) -> tuple[list[float], int, list[str]]:
    """ms of `count` runs of the worker's claim (generic plan), each rolled back; the rows
    the last one claimed; an EXPLAIN (ANALYZE, BUFFERS) of one more, rolled back too."""
    prepare, execute = claim_statements()
    times: list[float] = []
    with psycopg.connect(db.dsn) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(prepare)
        conn.commit()
        claimed = 0
        for _ in range(count):
            started = time.perf_counter()
            claimed = len(conn.execute(execute).fetchall())
            times.append((time.perf_counter() - started) * 1000)
            conn.rollback()
        explain = f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {execute}"
        plan = [str(row[0]) for row in conn.execute(explain).fetchall()]
        conn.rollback()
    return times, claimed, plan_digest(plan)


def plan_digest(plan: list[str]) -> list[str]:
    """The lines of a claim's EXPLAIN (ANALYZE, BUFFERS) that say what its locking scan read:
    the scan of the jobs under LockRows with its conditions, rows removed and buffers, the
    whole statement's buffers and its execution time."""
    kept: list[str] = []
    scan = next((i for i, line in enumerate(plan) if "LockRows" in line), None)
    if scan is not None:
        depth = len(plan[scan + 1]) - len(plan[scan + 1].lstrip())
        for line in plan[scan + 1 :]:
            indent = len(line) - len(line.lstrip())
            if indent < depth or (indent > depth + 6 and "->" in line):
                break
            if "SubPlan" in line:
                break
            kept.append(line.strip())
    kept += [line.strip() for line in plan[:5] if "Buffers" in line][:1]
    kept += [line.strip() for line in plan if line.startswith("Execution Time")]
    return kept


def parked_claim(server: str, args: argparse.Namespace, say: Say) -> dict[str, Any]:
    """Measurement 3: claims and drains beside no, sleeping and waiting parked jobs."""
    sides = ("none", *[s for s in PARKED_SIDES if s != "none" and s in args.parked_sides])
    dbs = {side: BenchDatabase(server) for side in sides}
    result: dict[str, Any] = {
        "parked": args.parked,
        "backlog": args.backlog,
        "backlog_priority": args.backlog_priority,
        "worker": {"processes": 1, "concurrency": 16, "batch": 50},
        "sides": {},
    }
    try:
        for side, db in dbs.items():
            db.create()
            made = {"parked": 0} if side == "none" else park(db, side, args.parked, args.seed)
            result["sides"][side] = {
                **made,
                "drain_jobs_per_s": [],
                "claim_ms": [],
                "idle_claim_ms": [],
                "claimed": [],
            }
            say(f"parked {side}: {made}")
        for side in alternated(sides, args.repeat * 2):
            db, res = dbs[side], result["sides"][side]
            ids = fill(db, "noop", "'{}'::jsonb", args.backlog, args.backlog_priority)
            times, claimed, plan = claim_times(db, args.claims)  # no worker runs yet
            res["claim_ms"] += times
            res["claimed"].append(claimed)
            res["claim_plan"] = plan
            with paused_worker(db, 16, 50) as go:
                started = go()
                rate = len(ids) / (wait_drained(db, ids) - started)
                res["drain_jobs_per_s"].append(round(rate, 1))
            times, claimed, plan = claim_times(db, args.claims)
            res["idle_claim_ms"] += times
            res["idle_claimed"] = claimed
            res["idle_claim_plan"] = plan
            say(
                f"parked {side}: drain {rate:,.0f} jobs/s, claim p99 "
                f"{_p99(res['claim_ms'][-args.claims :]):.2f} ms, idle claim p99 "
                f"{_p99(times):.2f} ms"
            )
    finally:
        for db in dbs.values():
            db.drop()
    base = result["sides"]["none"]
    for res in result["sides"].values():
        res["drain"] = summary(res.pop("drain_jobs_per_s"))
        res["claim"] = latency_summary(res.pop("claim_ms"))
        res["idle_claim"] = latency_summary(res.pop("idle_claim_ms"))
    for side in sides[1:]:
        res = result["sides"][side]
        res["drain_ratio"] = round(res["drain"]["median"] / base["drain"]["median"], 3)
        res["claim_p99_ratio"] = round(base["claim"]["p99"] / res["claim"]["p99"], 3)
        res["idle_claim_p99_ratio"] = round(base["idle_claim"]["p99"] / res["idle_claim"]["p99"], 3)
        res["target_met"] = res["drain_ratio"] >= 0.95 and res["claim_p99_ratio"] >= 0.95
    return result


def _p99(values: list[float]) -> float:
    return float(latency_summary(values)["p99"])


# -- the run -----------------------------------------------------------------------------------

MEASUREMENTS = {"steps": step_cost, "signals": signal_latency, "parked": parked_claim}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.durable", description=__doc__)
    p.add_argument("--database-url", default=os.environ.get("SQLA_QUEUE_BENCH_URL"))
    p.add_argument("--output", type=Path, help="write the result's JSON here too")
    p.add_argument("--only", nargs="+", choices=list(MEASUREMENTS), help="measure only these")
    p.add_argument("--repeat", type=int, default=2, help="rounds of A B .. B A (default 2)")
    p.add_argument("--steps", type=int, default=10, help="steps per job")
    p.add_argument("--step-jobs", type=int, default=2_000, help="jobs per step-cost drain")
    p.add_argument("--step-concurrency", type=int, default=4)
    p.add_argument("--step-batch", type=int, default=10)
    p.add_argument(
        "--step-synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="the step database's synchronous_commit (default on, the server's; off: a diagnosis)",
    )
    p.add_argument("--idle-probes", type=int, default=300, help="probes of each kind, idle")
    p.add_argument("--load-probes", type=int, default=300, help="probes of each kind, loaded")
    p.add_argument("--load-rate", type=float, default=1_000.0, help="other jobs/s under load")
    p.add_argument("--load-producers", type=int, default=4)
    p.add_argument(
        "--load-batch",
        type=int,
        default=25,
        help="other jobs per transaction (enqueue_many; 1: enqueue, one job per commit)",
    )
    p.add_argument("--parked", type=int, default=100_000, help="sleeping (and waiting) jobs")
    p.add_argument("--seed", type=int, default=2_000, help="of them parked by a worker")
    p.add_argument(
        "--parked-sides",
        nargs="+",
        choices=["sleeping", "waiting"],
        default=["sleeping", "waiting"],
        help="the parked kinds measured beside none (default both)",
    )
    p.add_argument("--backlog", type=int, default=20_000, help="no-op jobs per drain")
    p.add_argument(
        "--backlog-priority",
        type=int,
        default=0,
        help="the backlog's priority (parked jobs have 0; 1 puts them ahead in the claim's order)",
    )
    p.add_argument("--claims", type=int, default=100, help="timed claims per side and round")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def say(line: str) -> None:
        print(json.dumps({"say": line}), flush=True)

    cluster = None if args.database_url else PrivateCluster()
    server = args.database_url or cluster.start()  # type: ignore[union-attr]
    result: dict[str, Any] = {
        "meta": {
            "started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "where": "url" if args.database_url else "private",
            "cpus": os.cpu_count(),
            "load_average_before": os.getloadavg(),
        }
    }
    try:
        for name in args.only or list(MEASUREMENTS):
            result[name] = MEASUREMENTS[name](server, args, say)
            result[name]["load_average_after"] = os.getloadavg()
            print(json.dumps({name: result[name]}), flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    result["meta"]["load_average_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    if args.output is not None:
        args.output.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
