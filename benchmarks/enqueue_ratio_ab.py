"""Issue 39's two enqueue ratios, with whichever sqla_queue this interpreter imports.

    python benchmarks/enqueue_ratio_ab.py LABEL OUTFILE SERVER_URL [--rounds 5]

Run it alternately from two virtual environments (the old commit's and the new) against one
private cluster, so each pair of runs sees the same machine; it uses only what both sides
have (`enqueue`, `enqueue_many`, `migrate.upgrade`). Each run creates its own database and,
after one warm-up round, alternates `--rounds` times, the order of the sides rotating:

- bulk: `enqueue_many(session, rows)` of 20,000 plain rows + commit, against a raw psycopg
  `COPY sqla_queue.jobs (task, args, queue)` of the same rows (`write_row`) + commit;
- business: 300 ORM transactions of one domain row and `enqueue()`, against the same
  transactions with a hand-written `INSERT INTO sqla_queue.jobs (task, args)`.

Each side records its wall rate, this process's CPU and the server backend's CPU per
row (from /proc: the server must run on this machine). One JSON line per run is appended to
OUTFILE: medians per side, the ratio of medians and the median of the per-round ratios, and
the load average. The figures: BENCHMARKS.md, "Issue 39, round 5".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import create_engine, event, pool, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import enqueue, enqueue_many
from sqla_queue.db.migrate import upgrade

BULK_ROWS = 20_000
TRANSACTIONS = 300
_RAW_JOB = text("INSERT INTO sqla_queue.jobs (task, args) VALUES ('shop.send_receipt', :args)")


class _Base(DeclarativeBase):
    pass


class Order(_Base):
    """The domain row of the business transaction."""

    __tablename__ = "ratio_ab_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    total: Mapped[int]


def _backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


Side = Callable[[], tuple[float, float, float]]
"""A side's run: (wall seconds, this process's CPU seconds, the server's CPU seconds)."""


def _timed(pids: Callable[[], list[int]], work: Callable[[], None]) -> tuple[float, float, float]:
    server = sum(_backend_cpu(p) for p in pids())
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, sum(_backend_cpu(p) for p in pids()) - server


def run(url: str, rounds: int) -> dict[str, Any]:
    engine = create_engine(url, pool_size=1, max_overflow=0)
    pid: list[int] = []

    @event.listens_for(engine, "connect")
    def _pid(dbapi_conn: Any, record: Any) -> None:
        pid.append(dbapi_conn.info.backend_pid)

    upgrade(engine)
    _Base.metadata.create_all(engine)
    raw = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))
    rows = [{"task": "shop.send_receipt", "args": {"n": n}} for n in range(BULK_ROWS)]

    def engine_pids() -> list[int]:
        return pid[-1:]

    def raw_pids() -> list[int]:
        return [raw.info.backend_pid]

    def reset() -> None:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE sqla_queue.jobs, ratio_ab_orders"))

    def raw_copy() -> None:
        with (
            raw.cursor() as cur,
            cur.copy("COPY sqla_queue.jobs (task, args, queue) FROM STDIN") as copy,
        ):
            for job in rows:
                copy.write_row((job["task"], json.dumps(job["args"]), "default"))
        raw.commit()

    def ours_bulk() -> None:
        with Session(engine) as session, session.begin():
            enqueue_many(session, rows)

    def business(job: str) -> Callable[[], None]:
        def loop() -> None:
            for n in range(TRANSACTIONS):
                with Session(engine) as session, session.begin():
                    session.add(Order(email=f"c{n}@example.com", total=n))
                    if job == "enqueue":
                        enqueue(session, "shop.send_receipt", {"n": n})
                    else:
                        session.execute(_RAW_JOB, {"args": json.dumps({"n": n})})

        return loop

    pairs = {
        "bulk": {"raw_copy": (raw_copy, raw_pids), "enqueue_many": (ours_bulk, engine_pids)},
        "business": {
            "sql_insert": (business("sql"), engine_pids),
            "enqueue": (business("enqueue"), engine_pids),
        },
    }
    sizes = {"bulk": BULK_ROWS, "business": TRANSACTIONS}
    result: dict[str, Any] = {}
    try:
        for part, sides in pairs.items():
            names = list(sides)
            for name in names:  # warm-up
                reset()
                _timed(sides[name][1], sides[name][0])
            runs: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
            for i in range(rounds):
                for name in names[i % 2 :] + names[: i % 2]:
                    reset()
                    runs[name].append(_timed(sides[name][1], sides[name][0]))
            n = sizes[part]
            out: dict[str, Any] = {}
            for name, measured in runs.items():
                out[name] = {
                    "rate": statistics.median(n / w for w, _, _ in measured),
                    "client_us": statistics.median(c / n * 1e6 for _, c, _ in measured),
                    "server_us": statistics.median(s / n * 1e6 for _, _, s in measured),
                    "rates": [round(n / w) for w, _, _ in measured],
                }
            ours, base = names[1], names[0]
            out["ratio"] = out[ours]["rate"] / out[base]["rate"]
            out["ratio_of_pairs"] = statistics.median(
                b[0] / o[0] for o, b in zip(runs[ours], runs[base], strict=True)
            )
            result[part] = out
    finally:
        raw.close()
        engine.dispose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/enqueue_ratio_ab.py")
    parser.add_argument("label")
    parser.add_argument("outfile")
    parser.add_argument("server_url", help="postgresql+psycopg://... of any database on it")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    admin = create_engine(args.server_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    db = "ratio_ab_" + uuid.uuid4().hex[:8]
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{db}"'))
    try:
        url = admin.url.set(database=db).render_as_string(hide_password=False)
        result = run(url, args.rounds)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()
    result["label"] = args.label
    result["load_average"] = list(os.getloadavg())
    result["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps(result)
    print(line)
    with open(args.outfile, "a") as out:
        out.write(line + "\n")


if __name__ == "__main__":
    main()
