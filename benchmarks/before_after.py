"""One measurement of drain and enqueue with whichever sqla_queue this interpreter imports.

Run it alternately from two virtual environments (one per checkout: the old commit and the
new) against one private cluster, so each pair of runs sees the same machine:

    python benchmarks/before_after.py LABEL OUTFILE [ADMIN_URL] [--drain-only]
        [--batch N] [--concurrency N] [--jobs N] [--processes N] [--server-data DATADIR]

ADMIN_URL defaults to a private cluster at 127.0.0.1:55432. Each run creates its own
database, enqueues 20,000 no-op jobs (`enqueue_many`, 1,000 per transaction) and drains them
at once, cold, as an application does after a burst: no ANALYZE in between (`--warm`
ANALYZEs the table first, the old way) (c=4, batch 50, burst, poll-only; `--batch`,
`--concurrency` and `--jobs` change them), then, unless `--drain-only`, times 1,500
one-job transactions and one 20,000-row enqueue_many, appends a JSON line to OUTFILE and
drops its database. The drain line also carries the process's CPU seconds per job
(`drain_cpu_us`) and, with `--server-data` (the cluster's data directory, on this machine),
the PostgreSQL processes' own (`server_cpu_us`, read from /proc). Results of the worker
rebuild: results/worker-rebuild-before-after.md. The script only uses what both checkouts
have, so the old one can run this copy.
"""

import argparse
import json
import multiprocessing
import os
import resource
import time
import uuid

from sqlalchemy import create_engine, pool, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue, enqueue_many
from sqla_queue.db.migrate import upgrade
from sqla_queue.worker import Worker, WorkerConfig

parser = argparse.ArgumentParser()
parser.add_argument("label")
parser.add_argument("out")
parser.add_argument(
    "admin_url", nargs="?", default="postgresql+psycopg://postgres@127.0.0.1:55432/postgres"
)
parser.add_argument("--drain-only", action="store_true")
parser.add_argument(
    "--warm", action="store_true", help="ANALYZE the jobs table between enqueue and drain"
)
parser.add_argument(
    "--no-autoanalyze",
    action="store_true",
    help="keep autovacuum's ANALYZE off the jobs table (its analyze threshold, a table setting;"
    " its VACUUM stays): a burst drained before autovacuum's next visit (naptime 60 s) meets"
    " the never-analyzed table throughout",
)
parser.add_argument("--batch", type=int, default=50)
parser.add_argument("--concurrency", type=int, default=4)
parser.add_argument("--jobs", type=int, default=20000)
parser.add_argument(
    "--processes",
    type=int,
    default=1,
    help="drain with this many worker processes (forked, each a burst Worker as one child"
    " of `worker --processes N` runs); the CPU per job is then theirs together",
)
parser.add_argument(
    "--server-data",
    help="the cluster's data directory (same machine): the drain line then carries the"
    " server's CPU seconds per job too (`server_cpu_us`)",
)
opts = parser.parse_args()


def server_cpu() -> float:
    """CPU seconds of the postmaster and its children, live and reaped (0 without --server-data)."""
    if not opts.server_data:
        return 0.0
    with open(f"{opts.server_data}/postmaster.pid") as f:
        postmaster = int(f.readline())
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(pid) == postmaster:
            total += sum(int(x) for x in fields[11:15])  # own and reaped children's
        elif int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


admin = create_engine(opts.admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
db = "bp_" + uuid.uuid4().hex[:8]
with admin.connect() as c:
    c.execute(text(f'CREATE DATABASE "{db}"'))
url = admin.url.set(database=db).render_as_string(hide_password=False)
engine = create_engine(url)
try:
    upgrade(engine)
    if opts.no_autoanalyze:
        with engine.begin() as c:
            c.execute(
                text("ALTER TABLE sqla_queue.jobs SET (autovacuum_analyze_threshold = 2000000000)")
            )
    registry = Registry()

    @registry.task(name="noop")
    def noop(**_):
        return None

    N = opts.jobs
    for start in range(0, N, 1000):
        with Session(engine) as s, s.begin():
            rows = range(start, min(start + 1000, N))
            enqueue_many(s, [{"task": "noop", "args": {"n": i}} for i in rows])
    if opts.warm:
        with engine.begin() as c:
            c.execute(text("ANALYZE sqla_queue.jobs"))
    config = WorkerConfig(
        concurrency=opts.concurrency, batch=opts.batch, burst=True, poll_only=True
    )
    with engine.connect() as c:
        reltuples = c.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = 'sqla_queue.jobs'::regclass")
        ).scalar()

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def child() -> None:
        own = create_engine(url)
        try:
            Worker(own, registry, config).run(install_signal_handlers=False)
        finally:
            own.dispose()

    if opts.processes > 1:
        engine.dispose()  # nothing of the parent's pool crosses the fork
        forked = [
            multiprocessing.get_context("fork").Process(target=child) for _ in range(opts.processes)
        ]
        cpu0 = children_cpu()
    else:
        cpu0 = time.process_time()
    server0 = server_cpu()
    t0 = time.perf_counter()
    if opts.processes > 1:
        for process in forked:
            process.start()
        for process in forked:
            process.join()
        drain = N / (time.perf_counter() - t0)
        drain_cpu_us = (children_cpu() - cpu0) / N * 1e6
    else:
        Worker(engine, registry, config).run(install_signal_handlers=False)
        drain = N / (time.perf_counter() - t0)
        drain_cpu_us = (time.process_time() - cpu0) / N * 1e6
    server_cpu_us = (server_cpu() - server0) / N * 1e6
    with engine.connect() as c:
        left = c.execute(
            text("SELECT count(*) FROM sqla_queue.jobs WHERE status in ('queued','running')")
        ).scalar()
        analyzed = c.execute(
            text(
                "SELECT autoanalyze_count + analyze_count FROM pg_stat_user_tables"
                " WHERE relid = 'sqla_queue.jobs'::regclass"
            )
        ).scalar()
    assert left == 0, left
    line = {
        "label": opts.label,
        "batch": opts.batch,
        "concurrency": opts.concurrency,
        "processes": opts.processes,
        "loadavg": os.getloadavg()[0],
        "jobs": N,
        "warm": opts.warm,
        "reltuples_at_start": reltuples,
        "analyzed": analyzed,
        "drain": drain,
        "drain_cpu_us": drain_cpu_us,
        "server_cpu_us": server_cpu_us,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not opts.drain_only:
        M = 1500
        t0 = time.perf_counter()
        for i in range(M):
            with Session(engine) as s, s.begin():
                enqueue(s, "noop", {"n": i})
        line["enqueue"] = M / (time.perf_counter() - t0)
        B = 20000
        t0 = time.perf_counter()
        with Session(engine) as s, s.begin():
            enqueue_many(s, [{"task": "noop", "args": {"n": i}} for i in range(B)])
        line["bulk"] = B / (time.perf_counter() - t0)
    with open(opts.out, "a") as f:
        f.write(json.dumps(line) + "\n")
finally:
    engine.dispose()
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE "{db}" WITH (FORCE)'))
