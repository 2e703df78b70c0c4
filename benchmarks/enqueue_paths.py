"""The enqueue paths against their ceilings, measured side by side in one run (issue 13).

    python -m benchmarks.enqueue_paths --database-url URL [--only business,core,bulk]
        [--repeats 5] [--quick] [--json OUT.jsonl]

URL names a server (any database on it): a database `sqlaq_paths_<random>` is created,
migrated, measured in and dropped. Each function below also works on its own, given the URL
of a database it may migrate and write to (it truncates `sqla_queue.jobs` and adds, then
drops, a table `enqueue_paths_orders`).

Every function returns a dict of figures. Rates are per second, `median` over `repeats`
rounds that run every side once, in an order rotating from round to round, so all sides
see the same machine (after one warm-up run of each);
`ratio` is median(ours) / median(baseline) and `ratio_of_pairs` the median of the
per-repetition ratios, with their `ratio_range` (min, max). Each dict holds each side's
`{"median": rate, "runs": [rates]}` under the side's name:

- `business_tx(url)`: an ORM transaction inserting one domain row (`Session`, `add`,
  commit), without and with one `enqueue()` in it, and with a hand-written job INSERT
  instead (`session.execute(text(...))`, no NOTIFY: what the row itself costs). Keys:
  `without`, `with`, `with_sql_insert` (each `{"median": tx/s, "runs": [...]}`), `ratio`
  (with / without), `job_cost` (1 - ratio: the share of the transaction's throughput the
  job costs; target <= 0.15), `sql_ratio` (with_sql_insert / without), `ratio_of_pairs`,
  `ratio_range`, `transactions` (per repetition).
- `core_enqueue(url)`: `enqueue(connection, ...)` + commit in a loop on one connection,
  against a raw psycopg `INSERT INTO sqla_queue.jobs ...; COMMIT` loop on one connection.
  Keys: `raw`, `core` (each `{"median", "runs"}`), `ratio` (core / raw; target >= 0.8),
  `ratio_of_pairs`, `ratio_range`, `transactions`.
- `bulk(url, queue_fk=True)`: `enqueue_many(session, rows)` + commit of `rows` jobs,
  against a raw psycopg `COPY sqla_queue.jobs (task, args, queue) FROM STDIN` of the same
  rows (args serialised with `json.dumps`) + commit, with the jobs -> queues foreign key in
  place or dropped (restored afterwards). Keys: `raw_copy`, `enqueue_many` (rows/s),
  `ratio` (target >= 0.8), `ratio_of_pairs`, `ratio_range`, `rows`, `queue_fk`.
- `run(url, only=None)`: `{"business_tx": ..., "core_enqueue": ..., "bulk_fk": ...,
  "bulk_no_fk": ..., "load_average": [1, 5, 15 min]}` for the parts asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import enqueue, enqueue_many, normalize_url
from sqla_queue.db.migrate import drop_queue_fk, restore_queue_fk, upgrade

PARTS = ("business", "core", "bulk")
BUSINESS_SIDES = {"without": "", "with": "enqueue", "with_sql_insert": "sql"}
"""The business transaction's sides: its domain row alone, with `enqueue()`, and with a
hand-written `INSERT INTO sqla_queue.jobs` (no NOTIFY, no checks): the floor of a job."""
_RAW_JOB = text("INSERT INTO sqla_queue.jobs (task, args) VALUES ('shop.send_receipt', :args)")


class _Base(DeclarativeBase):
    pass


class Order(_Base):
    """The domain row of the business transaction."""

    __tablename__ = "enqueue_paths_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    total: Mapped[int]


def _dsn(url: str) -> str:
    return make_url(normalize_url(url)).set(drivername="postgresql").render_as_string(False)


@contextmanager
def _engine(url: str) -> Iterator[Engine]:
    engine = create_engine(normalize_url(url), pool_size=2)
    try:
        upgrade(engine)
        yield engine
    finally:
        engine.dispose()


def _truncate(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE sqla_queue.jobs"))


def _alternate(
    sides: dict[str, Callable[[], float]], repeats: int, reset: Callable[[], None]
) -> dict[str, list[float]]:
    """Run each side once to warm up, then `repeats` rounds of all sides, the order of the
    sides rotating from round to round; each side's rates in round order."""
    names = list(sides)
    for name in names:
        reset()
        sides[name]()
    runs: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            reset()
            runs[name].append(sides[name]())
    return runs


def _compare(runs: dict[str, list[float]], ours: str, baseline: str) -> dict[str, Any]:
    """The figures of `ours` against `baseline` (see the module doc)."""
    pairs = [o / b for o, b in zip(runs[ours], runs[baseline], strict=True)]
    result: dict[str, Any] = {
        name: {"median": statistics.median(rates), "runs": rates} for name, rates in runs.items()
    }
    result["ratio"] = result[ours]["median"] / result[baseline]["median"]
    result["ratio_of_pairs"] = statistics.median(pairs)
    result["ratio_range"] = [min(pairs), max(pairs)]
    return result


def business_tx(url: str, transactions: int = 600, repeats: int = 5) -> dict[str, Any]:
    """One domain row per ORM transaction, without and with one enqueue() (see module doc)."""
    with _engine(url) as engine:
        _Base.metadata.drop_all(engine)
        _Base.metadata.create_all(engine)

        def loop(job: str) -> float:
            started = time.perf_counter()
            for n in range(transactions):
                with Session(engine) as session, session.begin():
                    session.add(Order(email=f"c{n}@example.com", total=n))
                    if job == "enqueue":
                        enqueue(session, "shop.send_receipt", {"n": n})
                    elif job == "sql":
                        session.execute(_RAW_JOB, {"args": json.dumps({"n": n})})
            return transactions / (time.perf_counter() - started)

        try:
            runs = _alternate(
                {side: partial(loop, job) for side, job in BUSINESS_SIDES.items()},
                repeats,
                lambda: _truncate(engine),
            )
        finally:
            _Base.metadata.drop_all(engine)
    result = _compare(runs, "with", "without")
    result["job_cost"] = 1 - result["ratio"]
    result["sql_ratio"] = result["with_sql_insert"]["median"] / result["without"]["median"]
    result["transactions"] = transactions
    return result


def core_enqueue(url: str, transactions: int = 1000, repeats: int = 5) -> dict[str, Any]:
    """enqueue(connection) + commit vs a raw psycopg INSERT + COMMIT (see module doc)."""
    with _engine(url) as engine, psycopg.connect(_dsn(url)) as raw:

        def raw_loop() -> float:
            started = time.perf_counter()
            for n in range(transactions):
                raw.execute(
                    "INSERT INTO sqla_queue.jobs (task, args) VALUES (%s, %s)",
                    ("shop.send_receipt", json.dumps({"n": n})),
                )
                raw.commit()
            return transactions / (time.perf_counter() - started)

        def core_loop() -> float:
            with engine.connect() as conn:
                started = time.perf_counter()
                for n in range(transactions):
                    enqueue(conn, "shop.send_receipt", {"n": n})
                    conn.commit()
                return transactions / (time.perf_counter() - started)

        runs = _alternate({"raw": raw_loop, "core": core_loop}, repeats, lambda: _truncate(engine))
    result = _compare(runs, "core", "raw")
    result["transactions"] = transactions
    return result


def bulk(url: str, rows: int = 20_000, repeats: int = 5, queue_fk: bool = True) -> dict[str, Any]:
    """enqueue_many vs a raw psycopg COPY of the same rows (see module doc)."""
    jobs = [{"task": "shop.send_receipt", "args": {"n": n}} for n in range(rows)]
    with _engine(url) as engine, psycopg.connect(_dsn(url)) as raw:

        def raw_copy() -> float:
            started = time.perf_counter()
            with (
                raw.cursor() as cursor,
                cursor.copy("COPY sqla_queue.jobs (task, args, queue) FROM STDIN") as copy,
            ):
                for job in jobs:
                    copy.write_row((job["task"], json.dumps(job["args"]), "default"))
            raw.commit()
            return rows / (time.perf_counter() - started)

        def ours() -> float:
            started = time.perf_counter()
            with Session(engine) as session, session.begin():
                enqueue_many(session, jobs)
            return rows / (time.perf_counter() - started)

        if not queue_fk:
            drop_queue_fk(engine)
        try:
            runs = _alternate(
                {"raw_copy": raw_copy, "enqueue_many": ours}, repeats, lambda: _truncate(engine)
            )
        finally:
            if not queue_fk:
                _truncate(engine)
                restore_queue_fk(engine)
    result = _compare(runs, "enqueue_many", "raw_copy")
    result["rows"] = rows
    result["queue_fk"] = queue_fk
    return result


def run(
    url: str, only: tuple[str, ...] = PARTS, repeats: int = 5, quick: bool = False
) -> dict[str, Any]:
    """The parts in `only` against the database of `url`; see the module doc for keys."""
    scale = 4 if quick else 1
    result: dict[str, Any] = {}
    if "business" in only:
        result["business_tx"] = business_tx(url, 600 // scale, repeats)
    if "core" in only:
        result["core_enqueue"] = core_enqueue(url, 1000 // scale, repeats)
    if "bulk" in only:
        result["bulk_fk"] = bulk(url, 20_000 // scale, repeats, queue_fk=True)
        result["bulk_no_fk"] = bulk(url, 20_000 // scale, repeats, queue_fk=False)
    result["load_average"] = list(os.getloadavg())
    return result


@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A fresh database on the server of `server_url`, dropped at the end; yields its URL."""
    server = normalize_url(server_url)
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    name = f"sqlaq_paths_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server).set(database=name).render_as_string(False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _say(result: dict[str, Any]) -> None:
    lines = {
        "business_tx": ("without", "with", "tx/s", "with/without"),
        "core_enqueue": ("raw", "core", "tx/s", "core/raw"),
        "bulk_fk": ("raw_copy", "enqueue_many", "rows/s", "ours/raw, with FK"),
        "bulk_no_fk": ("raw_copy", "enqueue_many", "rows/s", "ours/raw, without FK"),
    }
    for key, (base, ours, unit, label) in lines.items():
        if key in result:
            r = result[key]
            low, high = r["ratio_range"]
            print(
                f"{key}: {base} {r[base]['median']:,.0f} {unit}, {ours} {r[ours]['median']:,.0f} "
                f"{unit}; {label} {r['ratio']:.2f}x (pairs: median {r['ratio_of_pairs']:.2f}x, "
                f"{low:.2f}-{high:.2f})"
            )
    if "business_tx" in result:
        r = result["business_tx"]
        print(
            f"business_tx: job cost {r['job_cost']:.0%} of the tx (target <= 15%); a hand-written "
            f"job INSERT instead: {r['with_sql_insert']['median']:,.0f} tx/s, "
            f"cost {1 - r['sql_ratio']:.0%}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.enqueue_paths")
    parser.add_argument("--database-url", required=True, help="a server; a scratch db is made")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated: {PARTS}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a quarter of the sizes")
    parser.add_argument("--json", help="append the result as one JSON line to this file")
    parser.add_argument("--label", default="", help="a label stored with the JSON line")
    args = parser.parse_args(argv)
    only = tuple(part.strip() for part in args.only.split(",") if part.strip())
    unknown = set(only) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    with scratch_database(args.database_url) as url:
        result = run(url, only, args.repeats, args.quick)
    result["label"] = args.label
    result["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _say(result)
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
