"""One measurement of drain and enqueue with whichever sqla_queue this interpreter imports.

Run it alternately from two virtual environments (one per checkout: the old commit and the
new) against one private cluster, so each pair of runs sees the same machine:

    python benchmarks/before_after.py LABEL OUTFILE [ADMIN_URL]

ADMIN_URL defaults to a private cluster at 127.0.0.1:55432. Each run creates its own
database, drains 20,000 no-op jobs (c=4, batch 50, burst, poll-only), then times 1,500
one-job transactions and one 20,000-row enqueue_many, appends a JSON line to OUTFILE and
drops its database. Results of the worker rebuild: results/worker-rebuild-before-after.md.
"""

import json
import sys
import time
import uuid

from sqlalchemy import create_engine, pool, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue, enqueue_many
from sqla_queue.migrate import upgrade
from sqla_queue.worker import Worker, WorkerConfig

label, out = sys.argv[1], sys.argv[2]
admin_url = (
    sys.argv[3] if len(sys.argv) > 3 else "postgresql+psycopg://postgres@127.0.0.1:55432/postgres"
)
admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
db = "bp_" + uuid.uuid4().hex[:8]
with admin.connect() as c:
    c.execute(text(f'CREATE DATABASE "{db}"'))
url = admin.url.set(database=db).render_as_string(hide_password=False)
engine = create_engine(url)
try:
    upgrade(engine)
    registry = Registry()

    @registry.task(name="noop")
    def noop(**_):
        return None

    N = 20000
    with Session(engine) as s, s.begin():
        enqueue_many(s, [{"task": "noop", "args": {"n": i}} for i in range(N)])
    with engine.begin() as c:
        c.execute(text("ANALYZE sqla_queue.jobs"))
    t0 = time.perf_counter()
    Worker(engine, registry, WorkerConfig(concurrency=4, batch=50, burst=True, poll_only=True)).run(
        install_signal_handlers=False
    )
    drain = N / (time.perf_counter() - t0)
    with engine.connect() as c:
        left = c.execute(
            text("SELECT count(*) FROM sqla_queue.jobs WHERE status in ('queued','running')")
        ).scalar()
    assert left == 0, left
    M = 1500
    t0 = time.perf_counter()
    for i in range(M):
        with Session(engine) as s, s.begin():
            enqueue(s, "noop", {"n": i})
    enq = M / (time.perf_counter() - t0)
    B = 20000
    t0 = time.perf_counter()
    with Session(engine) as s, s.begin():
        enqueue_many(s, [{"task": "noop", "args": {"n": i}} for i in range(B)])
    bulk = B / (time.perf_counter() - t0)
    with open(out, "a") as f:
        f.write(json.dumps({"label": label, "drain": drain, "enqueue": enq, "bulk": bulk}) + "\n")
finally:
    engine.dispose()
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE "{db}" WITH (FORCE)'))
