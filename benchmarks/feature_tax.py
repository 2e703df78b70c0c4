"""The schema's feature tax: what each index, trigger and constraint of `sqla_queue.jobs`
costs a plain job, measured side by side in one run (issue 39, item 1).

    python -m benchmarks.feature_tax [--database-url URL] [--rounds 4] [--json OUT.jsonl]
        [--only tax,enqueue] [--revision REV] [--compare REV] [--label TEXT]

Without `--database-url` a private stock cluster is started for the run
(`benchmarks.cluster`). A scratch database is created, migrated (to `--revision`, head by
default) and dropped at the end.

`tax`: three plain-job workloads, each on a table emptied before it:

- `copy`: 10 COPY batches of 1,000 rows, a commit each (rows/s);
- `insert`: 300 single-row INSERT + COMMIT (rows/s);
- `cycle`: 5,000 rows COPYed in (not timed), then claimed 50 at a time by the ceiling's
  claim (`FOR UPDATE SKIP LOCKED`, status, lease and attempts set) and deleted by id, each
  in its own transaction, as a worker on a retention-delete queue does (jobs/s).

They run against today's `sqla_queue.jobs` whole (`jobs`); against a table of the same
columns with only the primary key and one claim index (`minimal`); and against the jobs
table without one of its indexes, triggers or constraints at a time (`-NAME`: dropped,
measured, put back). Every round runs every variant once, in an order rotating from round
to round, after one warm-up round that is not counted; each figure is the median over the
rounds, and a share is `median(without X) / median(jobs) - 1` (what X costs the plain job).

`--compare REV`: the three workloads on the jobs table of a second scratch database
migrated to REV (before) and on head's (after), alternated over twice the rounds.

`enqueue`: `benchmarks.enqueue_paths`' business transaction (an ORM transaction with one
domain row and `enqueue()`, against the same transaction with a hand-written job INSERT)
and its bulk path (`enqueue_many` against a raw COPY of the same rows), alternated the same
way.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import create_engine

from sqla_queue import normalize_url
from sqla_queue.db.migrate import upgrade

from . import enqueue_paths
from .cluster import PrivateCluster

TABLE = "sqla_queue.jobs"
MINIMAL = "sqla_queue.jobs_minimal"
COPY_BATCHES = 10
COPY_ROWS = 1_000
INSERTS = 200
CYCLE_ROWS = 5_000
CLAIM_BATCH = 50
PARTS = ("tax", "enqueue")


def _copy_payload(rows: int, start: int = 0) -> bytes:
    """`rows` plain jobs as COPY text: task, args, queue."""
    out = io.StringIO()
    for n in range(start, start + rows):
        out.write(f'shop.send_receipt\t{{"n": {n}}}\tdefault\n')
    return out.getvalue().encode()


_BATCH = _copy_payload(COPY_ROWS)
_CYCLE = _copy_payload(CYCLE_ROWS)


def _copy(conn: psycopg.Connection, table: str, payload: bytes) -> None:
    with conn.cursor() as cur, cur.copy(f"COPY {table} (task, args, queue) FROM STDIN") as copy:
        copy.write(payload)
    conn.commit()


def server_cpu(conn: psycopg.Connection) -> float:
    """CPU seconds the connection's backend has run (this machine's /proc, ns resolution)."""
    pid = conn.info.backend_pid
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


Measured = tuple[float, float]
"""(rows per second by the wall clock, the backend's CPU microseconds per row)."""


def _timed(conn: psycopg.Connection, rows: int, work: Callable[[], object]) -> Measured:
    cpu = server_cpu(conn)
    started = time.perf_counter()
    work()
    wall = time.perf_counter() - started
    return rows / wall, (server_cpu(conn) - cpu) / rows * 1e6


def measure_copy(conn: psycopg.Connection, table: str) -> Measured:
    def work() -> None:
        for _ in range(COPY_BATCHES):
            _copy(conn, table, _BATCH)

    return _timed(conn, COPY_BATCHES * COPY_ROWS, work)


def measure_insert(conn: psycopg.Connection, table: str) -> Measured:
    sql = f"INSERT INTO {table} (task, args) VALUES (%s, %s)"

    def work() -> None:
        for n in range(INSERTS):
            conn.execute(sql, ("shop.send_receipt", f'{{"n": {n}}}'))
            conn.commit()

    return _timed(conn, INSERTS, work)


def _claim_sql(table: str) -> str:
    return f"""
WITH c AS MATERIALIZED (
    SELECT id FROM {table} WHERE status = 'queued' AND queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id LIMIT {CLAIM_BATCH} FOR UPDATE SKIP LOCKED)
UPDATE {table} j SET status = 'running', locked_at = now(), locked_by = 'bench',
    lease_expires_at = now() + interval '30 seconds', attempts = j.attempts + 1
FROM c WHERE j.id = c.id RETURNING j.id"""


def measure_cycle(conn: psycopg.Connection, table: str) -> Measured:
    _copy(conn, table, _CYCLE)
    conn.execute(f"ANALYZE {table}")
    conn.commit()
    claim = _claim_sql(table)
    delete = f"DELETE FROM {table} WHERE id = ANY(%s)"

    def work() -> None:
        while True:
            ids = [row[0] for row in conn.execute(claim)]
            conn.commit()
            if not ids:
                break
            conn.execute(delete, (ids,))
            conn.commit()

    return _timed(conn, CYCLE_ROWS, work)


WORKLOADS: dict[str, Callable[[psycopg.Connection, str], Measured]] = {
    "copy": measure_copy,
    "insert": measure_insert,
    "cycle": measure_cycle,
}


class Feature:
    """One index, trigger or constraint of the jobs table: dropped and put back by name."""

    def __init__(self, kind: str, name: str, definition: str) -> None:
        self.kind, self.name, self.definition = kind, name, definition

    def drop(self, conn: psycopg.Connection) -> None:
        if self.kind == "index":
            conn.execute(f"DROP INDEX sqla_queue.{self.name}")
        elif self.kind == "trigger":
            conn.execute(f"DROP TRIGGER {self.name} ON {TABLE}")
        else:
            conn.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {self.name}")
        conn.commit()

    def restore(self, conn: psycopg.Connection) -> None:
        if self.kind == "constraint":
            conn.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {self.name} {self.definition}")
        else:
            conn.execute(self.definition)
        conn.commit()


def features(conn: psycopg.Connection) -> list[Feature]:
    """The jobs table's indexes (but its primary key), triggers, CHECKs and foreign keys."""
    found = [
        Feature("index", name, definition)
        for name, definition in conn.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'sqla_queue.jobs'::regclass AND NOT i.indisprimary "
            "ORDER BY c.relname"
        )
    ]
    found += [
        Feature("trigger", name, definition)
        for name, definition in conn.execute(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgrelid = 'sqla_queue.jobs'::regclass AND NOT tgisinternal ORDER BY tgname"
        )
    ]
    found += [
        Feature("constraint", name, definition)
        for name, definition in conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'sqla_queue.jobs'::regclass AND contype IN ('c', 'f') "
            "ORDER BY conname"
        )
    ]
    conn.commit()
    return found


def _make_minimal(conn: psycopg.Connection) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {MINIMAL}")
    conn.execute(
        f"CREATE TABLE {MINIMAL} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING IDENTITY, "
        "PRIMARY KEY (id))"
    )
    conn.execute(
        f"CREATE INDEX ix_jobs_minimal_claim ON {MINIMAL} (queue, priority, run_at, id) "
        "WHERE status = 'queued'"
    )
    conn.commit()


def _empty(conn: psycopg.Connection, table: str) -> None:
    conn.execute(f"TRUNCATE {table} CASCADE" if table == TABLE else f"TRUNCATE {table}")
    conn.commit()


def tax(url: str, rounds: int = 4, each_feature: bool = True) -> dict[str, Any]:
    """Each workload against `jobs`, `minimal` and (unless not `each_feature`) `jobs` without
    each feature in turn."""
    dsn = enqueue_paths._dsn(url)
    with psycopg.connect(dsn) as conn:
        every = features(conn) if each_feature else []
        _make_minimal(conn)
        variants: list[tuple[str, Feature | None]] = [("jobs", None), ("minimal", None)]
        variants += [(f"-{f.name}", f) for f in every]
        rates: dict[str, dict[str, list[float]]] = {
            name: {w: [] for w in WORKLOADS} for name, _ in variants
        }
        cpu: dict[str, dict[str, list[float]]] = {
            name: {w: [] for w in WORKLOADS} for name, _ in variants
        }
        try:
            for i in range(rounds + 1):  # the first is a warm-up
                shift = i % len(variants)
                for name, feature in variants[shift:] + variants[:shift]:
                    table = MINIMAL if name == "minimal" else TABLE
                    _empty(conn, table)
                    if feature is not None:
                        feature.drop(conn)
                    try:
                        for workload, measure in WORKLOADS.items():
                            _empty(conn, table)
                            rate, us = measure(conn, table)
                            if i:
                                rates[name][workload].append(rate)
                                cpu[name][workload].append(us)
                    finally:
                        if feature is not None:
                            conn.rollback()
                            _empty(conn, table)
                            feature.restore(conn)
        finally:
            conn.rollback()
            conn.execute(f"DROP TABLE IF EXISTS {MINIMAL}")
            conn.commit()

    def medians(of: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
        return {n: {w: statistics.median(v) for w, v in by.items()} for n, by in of.items()}

    rate_m, cpu_m = medians(rates), medians(cpu)
    return {
        "rounds": rounds,
        "features": {f.name: f.kind for f in every},
        "rates": rates,
        "cpu_us": cpu,
        "median_rate": rate_m,
        "median_cpu_us": cpu_m,
        "rate_vs_minimal": {w: rate_m["jobs"][w] / rate_m["minimal"][w] for w in WORKLOADS},
        "cpu_vs_minimal": {w: cpu_m["minimal"][w] / cpu_m["jobs"][w] for w in WORKLOADS},
        # what each feature costs a plain job: the backend's CPU per row with it, less without
        "cost_us": {
            name[1:]: {w: cpu_m["jobs"][w] - cpu_m[name][w] for w in WORKLOADS}
            for name in cpu_m
            if name.startswith("-")
        },
    }


def compare(url: str, before_url: str, before: str, rounds: int = 8) -> dict[str, Any]:
    """The plain workloads on the jobs table at head (`url`) and at revision `before`
    (`before_url`, a second scratch database on the same server), alternated."""
    engine = create_engine(normalize_url(before_url))
    try:
        upgrade(engine, before)
    finally:
        engine.dispose()
    sides = {"before": enqueue_paths._dsn(before_url), "after": enqueue_paths._dsn(url)}
    rates: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WORKLOADS} for s in sides}
    cpu: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WORKLOADS} for s in sides}
    with psycopg.connect(sides["before"]) as b, psycopg.connect(sides["after"]) as a:
        conns = {"before": b, "after": a}
        names = list(sides)
        for i in range(rounds + 1):  # the first is a warm-up
            for side in names[i % 2 :] + names[: i % 2]:
                for workload, measure in WORKLOADS.items():
                    _empty(conns[side], TABLE)
                    rate, us = measure(conns[side], TABLE)
                    if i:
                        rates[side][workload].append(rate)
                        cpu[side][workload].append(us)
    med = {s: {w: statistics.median(v) for w, v in by.items()} for s, by in rates.items()}
    med_cpu = {s: {w: statistics.median(v) for w, v in by.items()} for s, by in cpu.items()}
    return {
        "before": before,
        "rounds": rounds,
        "rates": rates,
        "cpu_us": cpu,
        "median_rate": med,
        "median_cpu_us": med_cpu,
        "rate_ratio": {w: med["after"][w] / med["before"][w] for w in WORKLOADS},
    }


def enqueue(url: str, rounds: int = 4) -> dict[str, Any]:
    """enqueue() in an ORM transaction against a hand-written INSERT; enqueue_many against COPY."""
    business = enqueue_paths.business_tx(url, 600, rounds)
    business["ratio_to_sql"] = business["with"]["median"] / business["with_sql_insert"]["median"]
    pairs = [
        w / s
        for w, s in zip(business["with"]["runs"], business["with_sql_insert"]["runs"], strict=True)
    ]
    business["ratio_to_sql_pairs"] = statistics.median(pairs)
    return {"business_tx": business, "bulk": enqueue_paths.bulk(url, 20_000, rounds)}


def run(
    url: str,
    only: tuple[str, ...] = PARTS,
    rounds: int = 4,
    revision: str | None = None,
    before: tuple[str, str] | None = None,
    each_feature: bool = True,
) -> dict[str, Any]:
    """The parts in `only`; with `before` (a second database's URL, a revision) the plain
    workloads at head against that revision first; `each_feature=False` measures the jobs
    and minimal tables only."""
    engine = create_engine(normalize_url(url))
    try:
        upgrade(engine) if revision is None else upgrade(engine, revision)
    finally:
        engine.dispose()
    result: dict[str, Any] = {"load_before": list(os.getloadavg())}
    if before is not None:
        result["compare"] = compare(url, before[0], before[1], rounds * 2)
    if "tax" in only:
        result["tax"] = tax(url, rounds, each_feature)
    if "enqueue" in only:
        result["enqueue"] = enqueue(url, rounds)
    result["load_after"] = list(os.getloadavg())
    return result


def report(result: dict[str, Any]) -> str:
    """The result as Markdown tables."""
    lines: list[str] = []
    if "compare" in result:
        c = result["compare"]
        r, u = c["median_rate"], c["median_cpu_us"]
        lines += [
            f"Plain jobs into the jobs table at {c['before']} (before) and at head (after):",
            "",
            "| workload | before /s | µs/row | after /s | µs/row | after/before |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for w in WORKLOADS:
            lines.append(
                f"| {w} | {r['before'][w]:,.0f} | {u['before'][w]:.1f} | {r['after'][w]:,.0f} | "
                f"{u['after'][w]:.1f} | {c['rate_ratio'][w]:.2f}x |"
            )
        lines.append("")
    if "tax" in result:
        t = result["tax"]
        r, c = t["median_rate"], t["median_cpu_us"]
        lines += [
            "| table | COPY rows/s | µs/row | INSERT+COMMIT rows/s | µs/row "
            "| claim+delete jobs/s | µs/job |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in ("jobs", "minimal"):
            lines.append(
                f"| {name} | {r[name]['copy']:,.0f} | {c[name]['copy']:.1f} | "
                f"{r[name]['insert']:,.0f} | {c[name]['insert']:.1f} | "
                f"{r[name]['cycle']:,.0f} | {c[name]['cycle']:.1f} |"
            )
        rv, cv = t["rate_vs_minimal"], t["cpu_vs_minimal"]
        lines.append(
            f"| jobs / minimal | {rv['copy']:.2f}x | {cv['copy']:.2f}x | {rv['insert']:.2f}x | "
            f"{cv['insert']:.2f}x | {rv['cycle']:.2f}x | {cv['cycle']:.2f}x |"
        )
        lines += [
            "",
            "What each costs a plain job: the backend's CPU µs per row with it less without it",
            "(median over the rounds; negative: within the noise).",
            "",
            "| feature | kind | COPY | INSERT+COMMIT | claim+delete |",
            "|---|---|---:|---:|---:|",
        ]
        costs = sorted(t["cost_us"].items(), key=lambda kv: -sum(kv[1].values()))
        for name, s in costs:
            lines.append(
                f"| {name} | {t['features'][name]} | {s['copy']:+.1f} | {s['insert']:+.1f} | "
                f"{s['cycle']:+.1f} |"
            )
    if "enqueue" in result:
        b = result["enqueue"]["business_tx"]
        k = result["enqueue"]["bulk"]
        lines += [
            "",
            "| path | ours | baseline | ratio (median of pairs) |",
            "|---|---:|---:|---:|",
            f"| enqueue() in an ORM tx vs hand-written INSERT | {b['with']['median']:,.0f} tx/s | "
            f"{b['with_sql_insert']['median']:,.0f} tx/s | {b['ratio_to_sql']:.2f}x "
            f"({b['ratio_to_sql_pairs']:.2f}x) |",
            f"| enqueue_many vs raw COPY, {k['rows']:,} rows | "
            f"{k['enqueue_many']['median']:,.0f} rows/s | {k['raw_copy']['median']:,.0f} rows/s | "
            f"{k['ratio']:.2f}x ({k['ratio_of_pairs']:.2f}x) |",
        ]
    lines.append("")
    lines.append(
        f"load average before {result['load_before'][0]:.1f}, after {result['load_after'][0]:.1f}"
    )
    return "\n".join(lines)


@contextmanager
def _server(database_url: str | None) -> Iterator[str]:
    if database_url:
        yield database_url
        return
    with PrivateCluster() as cluster:
        yield cluster.url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.feature_tax")
    parser.add_argument("--database-url", help="a server (default: a private stock cluster)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated: {PARTS}")
    parser.add_argument("--revision", help="migrate the scratch database to this revision")
    parser.add_argument(
        "--compare", metavar="REV", help="also measure the plain workloads at this revision"
    )
    parser.add_argument("--json", help="append the result as one JSON line to this file")
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    only = tuple(p.strip() for p in args.only.split(",") if p.strip())
    with _server(args.database_url) as server, enqueue_paths.scratch_database(server) as url:
        if args.compare:
            with enqueue_paths.scratch_database(server) as old:
                result = run(url, only, args.rounds, args.revision, (old, args.compare))
        else:
            result = run(url, only, args.rounds, args.revision)
    result["label"] = args.label
    result["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(report(result))
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
