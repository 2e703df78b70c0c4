"""The history of finished jobs (issue 35, item 4): what a full history costs the hot path.

    python -m benchmarks.history [--history-jobs 10000000] [--days 10] [--jobs 20000]
        [--rounds 5] [--claims 100] [--page-rounds 2] [--output run.json] [--keep]
        [--database-url postgresql://...]

starts a private PostgreSQL cluster (initdb in a temporary folder, stock settings, its own
port: `benchmarks.cluster`; `--database-url` measures on a server of your choice instead)
and makes two databases on it, each with its queues `default` and `mail` archiving
(`archive`): one with an empty history, one with `--history-jobs` finished jobs in it
(written straight into `--days` daily partitions with `INSERT ... SELECT generate_series`).
Both are then VACUUM ANALYZEd and checkpointed, as a history filled over days would be.
The measurements alternate between the two databases (empty then full in even rounds,
full then empty in odd ones), so the machine's noise meets both sides alike:

1. the claim: the worker's claim of 50 (prepared, generic plan, as a worker's is after five
   runs) on a table of `--jobs` queued jobs, `--claims` times, each rolled back: p50 and
   p99 ms per round; the median of the rounds' p99 and the p99 of all claims pooled;
2. the drain rate of `sqla-queue worker --processes 2 -c 4 --batch 50` draining `--jobs`
   no-op jobs into the history (each finish moves its job there), after a warm-up drain,
   one per round: the median of the rounds;
3. the dashboard's pages and reads (`benchmarks.dashboard.page_checks`, each the median of
   5 calls after a warm-up), `--page-rounds` rounds: the median of the rounds;

then prunes one day of the full history (`admin.prune` with a cut-off that leaves the
oldest partition whole behind it): the time of the prune call and of a `DROP TABLE` of the
next partition alone. The ratios full / empty come from the same run; the load average is
recorded before and after each measurement. Prints one JSON document (and writes it to
`--output`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import text

from sqla_queue import admin
from sqla_queue.db import queries

from .cluster import PrivateCluster
from .dashboard import median_ms, page_checks
from .database import BenchDatabase
from .processes import drain_summary
from .stats import latency_summary, summary

FILL = """
INSERT INTO sqla_queue.jobs_history (id, queue, task, args, status, priority, run_at,
    attempts, created_at, finished_at, started_at, locked_at, tags, meta, result, workflow_id)
SELECT g, CASE WHEN g % 5 = 0 THEN 'mail' ELSE 'default' END, 'task_' || (g % 10),
       jsonb_build_object('n', g), 'done', 0, :start, 1, :start,
       :start + (g - :first) * :step, :start + (g - :first) * :step,
       :start + (g - :first) * :step, '{}', '{}', NULL,
       CASE WHEN g <= 20 THEN 'wf-1' END
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
"""
"""A day of finished jobs, ids `:first`..`:last`, spread evenly over it from `:start`."""


def claim_times(
    db: BenchDatabase, jobs: int, claims: int = 100, keep: list[float] | None = None
) -> dict[str, float]:
    """Latencies (ms) of the worker's claim of 50, prepared as a generic plan, on `jobs`
    queued jobs; each claim rolled back, so each meets the same table."""
    assert db.engine is not None
    db.reset_jobs()
    db.insert_noop_jobs(jobs, analyze=True)
    statement = queries.claim_jobs(
        ["default"], False, 50, {"task_leases": {}, "task_max_attempts": {}}
    )
    compiled = statement.compile(dialect=db.engine.dialect)
    names: list[str] = []

    def positional(name: str) -> str:
        names.append(name)
        return f"${len(names)}"

    sql = re.sub(r"%\((\w+)\)s", lambda m: positional(m.group(1)), compiled.string)
    values = {"worker_id": "'w'", "lease": "60", "queues": "ARRAY['default']::text[]"}
    arguments = ", ".join(values[name] for name in names)
    times: list[float] = []
    with psycopg.connect(db.dsn, autocommit=True) as conn:  # its own session: no pool
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE claim AS {sql}".replace("%%", "%"))
        for _ in range(claims):
            conn.execute("BEGIN")
            started = time.perf_counter()
            conn.execute(f"EXECUTE claim({arguments})").fetchall()
            times.append((time.perf_counter() - started) * 1000)
            conn.execute("ROLLBACK")
    db.reset_jobs()
    if keep is not None:
        keep.extend(times)
    return latency_summary(times)


def fill(db: BenchDatabase, total: int, days: int) -> dict[str, Any]:
    """`total` finished jobs in `days` daily partitions ending yesterday; seconds taken."""
    assert db.engine is not None
    per_day = total // days
    started = time.monotonic()
    with db.engine.begin() as conn:
        today = conn.execute(text("SELECT sqla_queue.history_period_start(now(), 1)")).scalar_one()
    for day in range(days):
        start = today - dt.timedelta(days=days - day)
        name = f"jobs_history_p{start.astimezone(dt.timezone.utc):%Y%m%d}"
        with db.engine.begin() as conn:
            bound = f"'{start.isoformat()}'::timestamptz"
            conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS sqla_queue.{name} PARTITION OF "
                    f"sqla_queue.jobs_history FOR VALUES FROM ({bound}) "
                    f"TO ({bound} + interval '1 day')"
                )
            )
            first = day * per_day + 1
            conn.execute(
                text(FILL),
                {
                    "first": first,
                    "last": first + per_day - 1,
                    "start": start,
                    "step": dt.timedelta(seconds=86400 / per_day),
                },
            )
    db.sql("ANALYZE sqla_queue.jobs_history")
    db.sql(f"SELECT setval(pg_get_serial_sequence('sqla_queue.jobs', 'id'), {total + 1})")
    return {"rows": per_day * days, "days": days, "seconds": round(time.monotonic() - started, 1)}


def pages(db: BenchDatabase, history_jobs: int) -> dict[str, float | None]:
    """Median ms of each page and read; None for a page with nothing to show (a job or the
    workflow `wf-1` the empty history does not hold: not 200)."""
    assert db.engine is not None
    found: dict[str, float | None] = {}
    for what, call in page_checks(db.engine, max(history_jobs, 2)):
        try:
            found[what] = round(median_ms(call), 1)
        except AssertionError:
            found[what] = None
    return found


def prune_a_day(db: BenchDatabase, days: int) -> dict[str, Any]:
    """Prune with a cut-off just after the oldest partition's end: that partition dropped."""
    assert db.engine is not None
    with db.engine.connect() as conn:
        parts = conn.execute(queries.history_partitions()).all()
        oldest = parts[0]
        older_than = conn.execute(
            text("SELECT extract(epoch FROM now() - :t)"), {"t": oldest.ends}
        ).scalar_one()
        rows = conn.execute(text(f"SELECT count(*) FROM sqla_queue.{oldest.name}")).scalar_one()
    drop_ms: list[float] = []
    with db.engine.begin() as conn:
        conn.execute(text("SET LOCAL lock_timeout = '2s'"))
        started = time.perf_counter()
        pruned = admin.prune(conn, float(older_than) - 60)
        prune_ms = (time.perf_counter() - started) * 1000
    # the DROP alone, on the next oldest partition, as prune sends it
    with db.engine.begin() as conn:
        second = conn.execute(queries.history_partitions()).first()
        assert second is not None
        started = time.perf_counter()
        conn.execute(queries.drop_history_partition(second.name))
        drop_ms.append((time.perf_counter() - started) * 1000)
    return {
        "partition_rows": int(rows),
        "pruned": pruned,
        "prune_call_ms": round(prune_ms, 1),
        "drop_ms": round(statistics.median(drop_ms), 1),
    }


def load() -> list[float]:
    """The machine's load average (1, 5, 15 minutes), rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def settle(db: BenchDatabase) -> None:
    """VACUUM ANALYZE the history and CHECKPOINT: a history filled days ago has been
    vacuumed by autovacuum and checkpointed long since; its pages are not dirty now."""
    db.sql("VACUUM ANALYZE sqla_queue.jobs_history")
    db.sql("CHECKPOINT")


def paired_rounds(
    sides: dict[str, tuple[BenchDatabase, int]], jobs: int, rounds: int, claims: int
) -> dict[str, Any]:
    """`rounds` rounds of the claim latencies and of one drain (after its warm-up) on each
    side, the sides alternating A B, B A, A B, ... so that the machine's noise meets both."""
    found: dict[str, dict[str, list[Any]]] = {
        name: {"claim_p50": [], "claim_p99": [], "claims": [], "drain": [], "load": []}
        for name in sides
    }
    names = list(sides)
    for number in range(rounds):
        order = names if number % 2 == 0 else names[::-1]
        for what in ("claim", "drain"):
            for name in order:
                db, _ = sides[name]
                before = load()
                if what == "claim":
                    times = claim_times(db, jobs, claims, keep=found[name]["claims"])
                    found[name]["claim_p50"].append(times["p50"])
                    found[name]["claim_p99"].append(times["p99"])
                else:
                    drained = drain_summary(db, jobs=jobs, processes=2, batch=50, repeat=1)
                    found[name]["drain"].append(drained["median"])
                found[name]["load"].append({"round": number, "what": what, "before": before,
                                            "after": load()})  # fmt: skip
                print(f"round {number} {what} {name}: "
                      f"{found[name]['drain'][-1] if what == 'drain' else times} "
                      f"load {before[0]}", file=sys.stderr, flush=True)  # fmt: skip
    summaries: dict[str, Any] = {}
    for name, got in found.items():
        summaries[name] = {
            "claim_ms": {
                "p50_median": statistics.median(got["claim_p50"]),
                "p99_median": statistics.median(got["claim_p99"]),
                "p99_rounds": got["claim_p99"],
                "pooled": latency_summary(got["claims"]),
            },
            "drain": summary(got["drain"]),
            "load": got["load"],
        }
    return summaries


def _median(samples: list[float | None]) -> float | None:
    """The median of a page's rounds, rounded; None if a round had nothing to show."""
    known = [ms for ms in samples if ms is not None]
    return round(statistics.median(known), 1) if len(known) == len(samples) else None


def page_rounds(
    sides: dict[str, tuple[BenchDatabase, int]], rounds: int
) -> dict[str, dict[str, Any]]:
    """Each page's median (of 5, after a warm-up) per round, the sides alternating;
    the median over the rounds."""
    samples: dict[str, dict[str, list[float | None]]] = {name: {} for name in sides}
    names = list(sides)
    loads: dict[str, list[Any]] = {name: [] for name in sides}
    for number in range(rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            db, history_jobs = sides[name]
            before = load()
            for what, ms in pages(db, history_jobs).items():
                samples[name].setdefault(what, []).append(ms)
            loads[name].append({"round": number, "before": before, "after": load()})
            print(f"round {number} pages {name} load {before[0]}", file=sys.stderr, flush=True)
    result: dict[str, dict[str, Any]] = {}
    for name, per_page in samples.items():
        result[name] = {
            "median_ms": {what: _median(ms) for what, ms in per_page.items()},
            "rounds_ms": per_page,
            "load": loads[name],
        }
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--database-url",
        default=None,
        help="measure on this server instead of a private stock cluster started for the run",
    )
    parser.add_argument("--cluster-port", type=int, default=0)
    parser.add_argument("--history-jobs", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5, help="paired claim and drain rounds")
    parser.add_argument("--claims", type=int, default=100, help="claims per round")
    parser.add_argument("--page-rounds", type=int, default=2, help="paired page rounds")
    parser.add_argument("--repeat", type=int, help="(old name of --rounds)")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="restart the private cluster between the fill and the rounds (caches emptied)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the databases (and the private cluster) in place for EXPLAIN; "
        "their URLs on stderr; remove the cluster yourself (pg_ctl stop, rm its folder)",
    )
    args = parser.parse_args(argv)
    rounds = args.repeat or args.rounds
    cluster: PrivateCluster | None = None
    if args.database_url:
        server_url = args.database_url
    else:
        cluster = PrivateCluster(port=args.cluster_port)
        server_url = cluster.start()
    empty_db, full_db = BenchDatabase(server_url), BenchDatabase(server_url)
    made: list[BenchDatabase] = []
    try:
        for db in (empty_db, full_db):
            db.create()
            made.append(db)
            db.sql(
                "INSERT INTO sqla_queue.queues (name, retention) VALUES ('default', 'archive'), "
                "('mail', 'archive') ON CONFLICT (name) DO UPDATE SET retention = 'archive'"
            )
        filled = fill(full_db, args.history_jobs, args.days)
        for db in (empty_db, full_db):
            settle(db)
        if args.restart and cluster is not None:
            for db in (empty_db, full_db):
                assert db.engine is not None
                db.engine.dispose()
            cluster.restart()
        sides = {"empty": (empty_db, 2), "full": (full_db, args.history_jobs)}
        started = load()
        paired = paired_rounds(sides, args.jobs, rounds, args.claims)
        paged = page_rounds(sides, args.page_rounds)
        before_prune = load()
        pruned = prune_a_day(full_db, args.days)
        pruned["load"] = before_prune
        empty, full = paired["empty"], paired["full"]
        ratio = {
            "drain_rate_full_over_empty": full["drain"]["median"] / empty["drain"]["median"],
            "claim_p99_full_over_empty": full["claim_ms"]["p99_median"]
            / empty["claim_ms"]["p99_median"],
            "claim_p99_pooled_full_over_empty": full["claim_ms"]["pooled"]["p99"]
            / empty["claim_ms"]["pooled"]["p99"],
            "claim_p50_full_over_empty": full["claim_ms"]["p50_median"]
            / empty["claim_ms"]["p50_median"],
        }
        for name in ("empty", "full"):
            paired[name]["pages"] = paged[name]
        result = {
            "where": "private stock cluster" if cluster else "--database-url",
            "server": empty_db.server_settings(),
            "rounds": rounds,
            "restarted_after_fill": bool(args.restart and cluster is not None),
            "load": {"start": started, "end": load()},
            "empty": paired["empty"],
            "fill": filled,
            "full": paired["full"],
            "prune": pruned,
            "ratios": ratio,
        }
    finally:
        if args.keep:
            for db in made:
                print(f"kept: {db.dsn}", file=sys.stderr)
            if cluster is not None:
                print(f"kept cluster: {cluster.folder}", file=sys.stderr)
        else:
            for db in made:
                db.drop()
            if cluster is not None:
                cluster.stop()
    document = json.dumps(result, indent=2, default=str)
    if args.output:
        args.output.write_text(document)
    print(document)
    return result


if __name__ == "__main__":
    main()
