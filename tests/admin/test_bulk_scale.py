"""`bulk_retry` of 100,000 failed jobs by filter: every batch is a transaction of its own of at
most the batch's rows (read from the rows themselves: the transaction id that wrote each), so
no transaction of the action grows with the filter; unique keys stay held. How long the
transactions lasted is sampled from pg_stat_activity and printed, not asserted: a loaded
machine stretches any of them."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.support import enqueue_jobs, jobs_by_id, set_status
from sqlalchemy import Engine, create_engine, text

from sqla_queue.admin import filters as bulk
from sqla_queue.admin.filters import JobFilter

pytestmark = pytest.mark.slow

JOBS = 100_000
APP = "bulk-scale-under-test"
BATCH = 1000

POPULATE = """
INSERT INTO sqla_queue.jobs
    (queue, task, args, status, attempts, max_attempts, run_at, created_at, finished_at,
     last_error)
SELECT 'default', 'report', jsonb_build_object('n', g), 'failed', 3, 3, now(), now(), now(),
       'Traceback (most recent call last):' || chr(10) || 'TimeoutError: upstream'
FROM generate_series(1, :jobs) AS g
"""


class LongestTransaction:
    """Samples, every 20 ms, how long the action's open transaction has lasted."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.longest = 0.0
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = text(
            "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) "
            "FROM pg_stat_activity WHERE application_name = :app AND xact_start IS NOT NULL"
        )
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            while not self.stop.is_set():
                seconds = float(conn.execute(query, {"app": APP}).scalar_one())
                self.longest = max(self.longest, seconds)
                self.samples += 1
                time.sleep(0.02)

    def __enter__(self) -> LongestTransaction:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.engine.dispose()


def test_retrying_100000_failed_jobs_by_filter_holds_no_long_transaction(
    database_url: str, engine: Engine
) -> None:
    twins: list[int] = []
    for _ in range(2):  # two failed jobs of one key: one goes back, one is skipped
        (job_id,) = enqueue_jobs(engine, "report", 1, args={"k": 1}, unique=True)
        set_status(engine, [job_id], "failed", "TimeoutError: upstream")
        twins.append(job_id)
    (held,) = enqueue_jobs(engine, "report", 1, args={"k": 2}, unique=True)
    set_status(engine, [held], "failed", "TimeoutError: upstream")
    (holder,) = enqueue_jobs(engine, "report", 1, args={"k": 2}, unique=True)  # queued
    with engine.begin() as conn:
        conn.execute(text(POPULATE), {"jobs": JOBS})
        conn.execute(text("ANALYZE sqla_queue.jobs"))
    acting = create_engine(database_url, connect_args={"application_name": APP})
    batches: list[float] = []
    last = [time.perf_counter()]

    def progress(_: bulk.BulkResult) -> None:  # printed only: a loaded machine stretches it
        now = time.perf_counter()
        batches.append(now - last[0])
        last[0] = now

    where = JobFilter(task="report", status="failed", error="timeouterror")
    with acting.connect() as conn:
        assert bulk.count_matching(conn, where, "retry") == JOBS + 3
    try:
        with LongestTransaction(database_url) as sampler:
            started = time.perf_counter()
            result = bulk.bulk_retry(acting, where, batch=BATCH, progress=progress)
            took = time.perf_counter() - started
    finally:
        acting.dispose()
    assert (result.acted, result.skipped, result.held) == (JOBS + 1, 2, 2)
    assert result.batches == 101
    with engine.connect() as conn:
        # The transaction that last wrote each job the action sent back: one per batch.
        per_transaction = (
            conn.execute(
                text(
                    "SELECT count(*) FROM sqla_queue.jobs"
                    " WHERE status = 'queued' AND task = 'report' AND id <> :holder"
                    " GROUP BY xmin::text"
                ),
                {"holder": holder},
            )
            .scalars()
            .all()
        )
    assert sum(per_transaction) == JOBS + 1
    assert len(per_transaction) == result.batches
    assert max(per_transaction) <= BATCH, max(per_transaction)
    rows = jobs_by_id(engine, [*twins, held, holder])
    assert [rows[i].status for i in twins] == ["queued", "failed"]
    assert (rows[held].status, rows[holder].status) == ("failed", "queued")
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM sqla_queue.jobs WHERE status = 'failed'")
        ).scalar_one()
    assert left == 2
    print(
        f"\nretried {result.acted} in {result.batches} batches, {took:.1f} s; longest "
        f"transaction sampled {sampler.longest:.2f} s, longest batch {max(batches):.2f} s"
    )
