"""The rollup (`job_counts`): a burst worker counts the attempts it ends, per minute, queue
and task, and writes them in one upsert that adds to other workers' rows; rows older than a
day are pruned; the series the charts read come from it alone."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from helpers.support import Bounds, database_clock
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue
from sqla_queue.db import rollup as series
from sqla_queue.db.rollup import RollupWriter
from sqla_queue.doctor import DoctorOptions, Severity
from sqla_queue.doctor.checks import check_failed_jobs
from sqla_queue.job.counts import MAX_KEYS, JobCounts
from sqla_queue.job.retry import RetryPolicy
from sqla_queue.testing import run_until_empty

COUNTS = "SELECT queue, task, sum(succeeded), sum(failed), sum(retried) FROM sqla_queue.job_counts GROUP BY queue, task ORDER BY queue, task"  # noqa: E501


def _registry() -> Registry:
    registry = Registry()
    tries: dict[int, int] = {}

    @registry.task(name="ok")
    def ok() -> None:
        pass

    @registry.task(name="boom", max_attempts=1)
    def boom() -> None:
        raise ValueError("boom")

    @registry.task(name="flaky", max_attempts=3, retry=RetryPolicy(base=0.0, jitter=0.0))
    def flaky(n: int) -> None:
        tries[n] = tries.get(n, 0) + 1
        if tries[n] < 3:  # twice retried, then succeeds
            raise ValueError("not yet")

    return registry


def test_a_burst_worker_writes_what_its_attempts_did(engine: Engine, emails_queue: str) -> None:
    registry = _registry()
    with Session(engine) as session, session.begin():
        for _ in range(3):
            enqueue(session, "ok")
        enqueue(session, "ok", queue=emails_queue)
        enqueue(session, "boom")
        enqueue(session, "boom")
        enqueue(session, "flaky", {"n": 1})
    stats = run_until_empty(engine, registry)
    assert (stats.succeeded, stats.failed, stats.retried) == (5, 2, 2)
    with engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text(COUNTS))]
        seconds = conn.execute(text("SELECT sum(run_seconds) FROM sqla_queue.job_counts"))
        newest = conn.execute(text("SELECT max(minute) FROM sqla_queue.job_counts")).scalar()
    assert rows == [
        ("default", "boom", 0, 2, 0),
        ("default", "flaky", 1, 0, 2),
        ("default", "ok", 3, 0, 0),
        ("emails", "ok", 1, 0, 0),
    ]
    assert seconds.scalar() >= 0
    assert newest is not None
    assert newest.second == 0
    assert dt.datetime.now(dt.timezone.utc) - newest < dt.timedelta(minutes=2)


def test_two_writers_add_to_the_same_rows(engine: Engine) -> None:
    first, second = JobCounts(), JobCounts()
    first.add("q", "t", succeeded=2, seconds=1.5)
    first.add("q", "u", failed=1)
    second.add("q", "t", succeeded=3, failed=1, retried=4, seconds=0.5)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert RollupWriter(first).write(conn) == 2
        assert RollupWriter(second).write(conn) == 1
        assert RollupWriter(second).write(conn) == 0  # nothing pending: no statement
        rows = [tuple(r) for r in conn.execute(text(COUNTS))]
        run = conn.execute(
            text("SELECT run_seconds FROM sqla_queue.job_counts WHERE task = 't'")
        ).scalar()
    assert rows == [("q", "t", 5, 1, 4), ("q", "u", 0, 1, 0)]
    assert run == pytest.approx(2.0)


def test_a_failed_write_keeps_the_counts_and_logs_once(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    counts = JobCounts()
    writer = RollupWriter(counts, write_every=0.0)
    counts.add("q", "t", succeeded=1)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_queue.job_counts RENAME TO job_counts_away"))
    with caplog.at_level(logging.WARNING, "sqla_queue.worker"):
        writer.tick(engine)
        counts.add("q", "t", succeeded=1)
        writer.tick(engine)
    assert sum("could not write the job counts" in r.message for r in caplog.records) == 1
    assert [c[0] for c in counts.pending().values()] == [2]
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_queue.job_counts_away RENAME TO job_counts"))
    writer.tick(engine)
    assert counts.pending() == {}
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(text(COUNTS))] == [("q", "t", 2, 0, 0)]


def test_counts_kept_while_writes_fail_are_bounded() -> None:
    counts = JobCounts()
    counts.put_back({(minute * 60, "q", "t"): [1, 0, 0, 0.0] for minute in range(MAX_KEYS + 5)})
    pending = counts.pending()
    assert len(pending) == MAX_KEYS
    assert counts.dropped == 5
    assert min(pending)[0] == 5 * 60  # the oldest minutes went


def test_rows_older_than_a_day_are_pruned_by_the_writer(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded) VALUES "
                "(date_trunc('minute', now() - interval '25 hours'), 'q', 'old', 1), "
                "(date_trunc('minute', now() - interval '23 hours'), 'q', 'kept', 1)"
            )
        )
    RollupWriter(JobCounts()).tick(engine, force=True)
    with engine.connect() as conn:
        left = conn.execute(text("SELECT task FROM sqla_queue.job_counts")).scalars().all()
    assert left == ["kept"]


def test_the_series_come_per_minute_and_per_ten_minutes(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed) "
                "SELECT date_trunc('minute', now()) - make_interval(mins => m), 'q', "
                "'t' || (m % 2), 1, (m % 3 = 0)::int FROM generate_series(0, 1439) AS m"
            )
        )
    with engine.connect() as conn:
        hour = series.recent(conn, series.HOUR)
        day = series.recent(conn, series.DAY)
        tasks = series.recent(conn, series.HOUR, queue="q", by_task=True)
    (q_hour,) = hour.values()
    assert len(q_hour.succeeded) == 60
    assert q_hour.succeeded == [1] * 60
    assert sum(q_hour.failed) == 20
    (q_day,) = day.values()
    assert len(q_day.succeeded) == 144
    assert q_day.succeeded[:-1] == [10] * 143
    assert 1 <= q_day.succeeded[-1] <= 10  # the current ten minutes, so far
    assert sorted(tasks) == ["t0", "t1"]
    assert tasks["t0"].succeeded[-1] == 1
    assert tasks["t1"].succeeded[-1] == 0


def test_doctor_tells_a_big_tables_failures_from_the_rollup(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(series, "BIG_TABLE", 0)  # as if the jobs table were big
    with engine.connect() as conn:
        assert check_failed_jobs(conn, DoctorOptions()).severity is Severity.ok
    before = database_clock(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed) "
                "VALUES (date_trunc('minute', now()) - interval '2 hours', 'q', 't', 1, 3), "
                "(date_trunc('minute', now()) - interval '25 hours', 'q', 't', 0, 50)"
            )
        )
    with engine.connect() as conn:
        found = check_failed_jobs(conn, DoctorOptions())
    after = database_clock(engine)
    assert found.severity is Severity.warn
    assert found.details["q"]["count"] == 3  # the last day's only
    # from the end of its bucket (ten minutes at most before the row's minute), read up to
    # the time the steps took after the write: a bound by the clock, however slow they were
    late = (after - before).total_seconds()
    assert found.details["q"]["latest_seconds_ago"] in Bounds(6600, 7200 + late)
    assert "in the last day (the workers' rollup" in found.value
