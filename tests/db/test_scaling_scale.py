"""The autoscaling signal's read on a big table (slow): 1,000,000 jobs by default
(`SQLA_QUEUE_SCALING_JOBS` for more, e.g. 10000000), created in the last hour, 7% of them
ready over ten queues at five priorities, 90% finished and kept, the hour's rollup, twenty
live workers (ten of them recording a session the signal looks up). The read's answer is
checked, and the rows its statements' plans scanned bounded (counted by EXPLAIN ANALYZE: a
loaded machine cannot change them); its time is printed for BENCHMARKS.md (median of 30),
never asserted."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator

import pytest
from helpers.plans import explained, rows_scanned
from sqlalchemy import Engine, text

from sqla_queue.db.scaling import READY_CAP, scaling_signal

pytestmark = pytest.mark.slow

JOBS = int(os.environ.get("SQLA_QUEUE_SCALING_JOBS", "1000000"))
ROWS_BOUND = 100_000
"""Rows the signal's plans may scan in all, whatever the table's size: ten queues' ready
jobs up to the cap, the newest jobs of the arrival window, a few minutes of the rollup
(some 25,000 at 1,000,000 jobs; a scan of the table would read all of them)."""

POPULATE = """
INSERT INTO sqla_queue.queues (name, retention)
SELECT 'q' || n, 'keep' FROM generate_series(0, 9) AS n;
INSERT INTO sqla_queue.jobs
    (queue, task, args, status, priority, attempts, run_at, created_at, finished_at, locked_by)
SELECT
    'q' || (g % 10), 'task', '{}'::jsonb,
    CASE WHEN g % 10000 = 3 THEN 'running' WHEN g % 100 < 2 THEN 'failed'
         WHEN g % 100 < 9 THEN 'queued' ELSE 'done' END,
    (g / 10) % 5,
    1,
    now() - make_interval(secs => (:jobs - g) * :spacing),
    now() - make_interval(secs => (:jobs - g) * :spacing),
    CASE WHEN g % 100 >= 9 OR g % 100 < 2
         THEN now() - make_interval(secs => (:jobs - g) * :spacing) END,
    CASE WHEN g % 10000 = 3 THEN 'w' || ((g / 10000) % 20) END
FROM generate_series(1, :jobs) AS g;
INSERT INTO sqla_queue.workers (id, hostname, pid, queues, concurrency, expires_at, session_pid)
SELECT 'w' || n, 'host', n, NULL, 16, now() + interval '1 hour',
       CASE WHEN n % 2 = 0 THEN CAST(:session AS integer) END
FROM generate_series(0, 19) n;
INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed, retried, run_seconds)
SELECT date_trunc('minute', finished_at), queue, task, count(*) FILTER (WHERE status = 'done'),
       count(*) FILTER (WHERE status = 'failed'), 0, 0
FROM sqla_queue.jobs WHERE finished_at IS NOT NULL GROUP BY 1, 2, 3
"""


@pytest.fixture
def big(engine: Engine) -> Iterator[Engine]:
    """The filled database; half the workers record a session (`session_pid`, one held open
    for the test: the signal looks each up), the other half none."""
    with engine.connect() as held:
        session = held.execute(text("SELECT pg_backend_pid()")).scalar_one()
        held.commit()
        with engine.begin() as conn:
            for statement in POPULATE.strip().split(";\n"):
                params = {"jobs": JOBS, "spacing": 3600 / JOBS, "session": session}
                conn.execute(text(statement), params)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE sqla_queue.jobs"))
            conn.execute(text("ANALYZE sqla_queue.job_counts"))
        yield engine


def test_the_signal_reads_a_bounded_part_of_a_big_table(big: Engine) -> None:
    timings = []
    for _ in range(30):
        with big.begin() as conn:
            started = time.perf_counter()
            found = [s for s in scaling_signal(conn) if s.queue.startswith("q")]
            timings.append((time.perf_counter() - started) * 1000)
    median = statistics.median(timings)
    print(
        f"\nscaling signal at {JOBS:,} jobs: median {median:.1f} ms, "
        f"min {min(timings):.1f} ms, max {max(timings):.1f} ms"
    )
    assert len(found) == 10
    ready = sum(s.ready for s in found)
    expected = JOBS * 7 // 100 - JOBS // 10000  # queued, less those running
    if expected < READY_CAP * 10:
        assert abs(ready - expected) <= 10
    # every worker serves every queue: each sees all their free slots
    assert {(s.workers, s.free_slots) for s in found} == {(20, max(0, 20 * 16 - JOBS // 10000))}
    # the first ready jobs were due an hour ago (queues q2 to q8 have some)
    assert all(s.oldest_ready_age > 3000 for s in found if s.ready)
    assert sum(1 for s in found if s.ready) == 7
    # (the rates read the last five whole minutes: at 10,000,000 the filling outlasts them)
    assert all(s.completion_rate >= 0 and s.arrival_rate >= 0 for s in found)
    with big.begin() as conn, explained(conn) as plans:
        scaling_signal(conn)
    scanned = [rows_scanned(plan) for plan in plans]
    print(f"rows scanned by each of its {len(plans)} plans: {scanned}")
    assert plans
    assert sum(scanned) < ROWS_BOUND, scanned


def test_each_statement_of_the_signal(big: Engine) -> None:
    """The time of each of the signal's statements (printed: which one to look at)."""
    from sqla_queue.db import scaling
    from sqla_queue.db.queries import scaling as statements

    params = {
        "cap": scaling.READY_CAP,
        "queue": None,
        "seconds": scaling.RATE_SECONDS,
        "window": scaling.ARRIVAL_WINDOW,
    }
    for name in (
        "READY_AND_OLDEST",
        "RUNNING_BY_WORKER",
        "LIVE_WORKERS",
        "RECENT_ENDED",
        "RECENT_CREATED",
    ):
        timings = []
        for _ in range(10):
            with big.begin() as conn:
                started = time.perf_counter()
                conn.execute(getattr(statements, name), params).all()
                timings.append((time.perf_counter() - started) * 1000)
        print(f"\n{name}: median {statistics.median(timings):.1f} ms")
        assert timings
