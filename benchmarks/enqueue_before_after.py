"""One enqueue-only measurement with whichever sqla_queue this interpreter imports.

Run it alternately from two virtual environments (the old commit's and the new) against
one private cluster, so each pair of runs sees the same machine:

    python benchmarks/enqueue_before_after.py LABEL OUTFILE [ADMIN_URL]

It uses only what both sides have (`enqueue(session, ...)`, `enqueue_many(session, ...)`,
`migrate.upgrade`). Each run creates its own database, times 1,000 one-job transactions
(`enqueue` + commit, a Session each) and three 20,000-row `enqueue_many` transactions (the
median is kept), appends a JSON line {"label", "enqueue", "bulk", "load"} to OUTFILE and
drops its database. Results: results/enqueue-before-after.md.
"""

import json
import os
import statistics
import sys
import time
import uuid

from sqlalchemy import create_engine, pool, text
from sqlalchemy.orm import Session

from sqla_queue import enqueue, enqueue_many
from sqla_queue.db.migrate import upgrade

label, out = sys.argv[1], sys.argv[2]
admin_url = (
    sys.argv[3] if len(sys.argv) > 3 else "postgresql+psycopg://postgres@127.0.0.1:55460/postgres"
)
admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
db = "eba_" + uuid.uuid4().hex[:8]
with admin.connect() as c:
    c.execute(text(f'CREATE DATABASE "{db}"'))
engine = create_engine(admin.url.set(database=db))
try:
    upgrade(engine)
    with Session(engine) as s, s.begin():  # warm-up: connections, statement caches
        for i in range(50):
            enqueue(s, "noop", {"n": i})
    M = 1000
    t0 = time.perf_counter()
    for i in range(M):
        with Session(engine) as s, s.begin():
            enqueue(s, "noop", {"n": i})
    one = M / (time.perf_counter() - t0)
    B = 20000
    rates = []
    for _ in range(3):
        rows = [{"task": "noop", "args": {"n": i}} for i in range(B)]
        t0 = time.perf_counter()
        with Session(engine) as s, s.begin():
            enqueue_many(s, rows)
        rates.append(B / (time.perf_counter() - t0))
        with engine.begin() as c:
            c.execute(text("TRUNCATE sqla_queue.jobs"))
    line = {
        "label": label,
        "enqueue": one,
        "bulk": statistics.median(rates),
        "bulk_runs": rates,
        "load": os.getloadavg()[0],
        "at": time.strftime("%H:%M:%S", time.gmtime()),
    }
    with open(out, "a") as f:
        f.write(json.dumps(line) + "\n")
finally:
    engine.dispose()
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE "{db}" WITH (FORCE)'))
