"""The worker's claim on a table as it is: median ms of 30 claims of 50, each rolled back.

    python benchmarks/claim_cost.py LABEL OUTFILE DATABASE_URL {any,listed}

The claim is the worker's (no limited queue, the batch in its text) prepared as a generic
plan, as the worker's is after five runs. Run it alternately with two checkouts
(`PYTHONPATH=old/ python ...`) against one database whose jobs table was never analyzed
(`ALTER TABLE sqla_queue.jobs SET (autovacuum_enabled = off)` before filling it), so both
meet the same statistics; a JSON line per run goes to OUTFILE. Only uses what both have.
"""

import json
import re
import statistics
import sys
import time

from sqlalchemy import create_engine, text

from sqla_queue.db import queries

label, out, url, form = sys.argv[1:5]
engine = create_engine(url)
statement = queries.claim_jobs(
    None if form == "any" else ["default"], False, 50, {"task_leases": {}, "task_max_attempts": {}}
)
names: list[str] = []


def positional(match: re.Match[str]) -> str:
    names.append(match.group(1))
    return f"${len(names)}"


sql = re.sub(r"%\((\w+)\)s", positional, statement.compile(dialect=engine.dialect).string)
values = {"worker_id": "'w'", "lease": "60", "queues": "ARRAY['default']::text[]"}
arguments = ", ".join(values[name] for name in names)
times: list[float] = []
with engine.connect() as conn:
    reltuples = conn.execute(
        text("SELECT reltuples FROM pg_class WHERE oid = 'sqla_queue.jobs'::regclass")
    ).scalar()
    conn.execute(text("SET plan_cache_mode = force_generic_plan"))
    conn.exec_driver_sql(f"PREPARE claim AS {sql}".replace("%", "%%"))
    conn.commit()
    for _ in range(30):
        started = time.perf_counter()
        conn.exec_driver_sql(f"EXECUTE claim({arguments})").all()
        times.append((time.perf_counter() - started) * 1000)
        conn.rollback()
line = {
    "label": label,
    "form": form,
    "reltuples": reltuples,
    "median_ms": statistics.median(times),
    "min_ms": min(times),
    "max_ms": max(times),
}
with open(out, "a") as f:
    f.write(json.dumps(line) + "\n")
