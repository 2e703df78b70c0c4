"""A start deadline: `expires_in=` / `expires_at=` on every enqueue path; a job not started by
then is cancelled by the claim with the reason "expired", never run; shown with its times."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from helpers.dashboard_kit import client
from helpers.support import cli, count_where
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    Job,
    Registry,
    WorkerConfig,
    enqueue,
    enqueue_many,
)
from sqla_queue.testing import DrainResult, drain, run_until_empty

PAST = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
BURST = WorkerConfig(concurrency=1, batch=5, poll_only=True)


def work_registry(ran: list[int]) -> Registry:
    registry = Registry()

    @registry.task(name="work")
    def work(n: int) -> None:
        ran.append(n)

    return registry


def expire_all(engine: Engine) -> None:
    """Pretend the deadlines have passed: each job with one had it a second ago."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET expires_at = now() - interval '1 second' "
                "WHERE expires_at IS NOT NULL"
            )
        )


def expiry_states(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT args->>'n', status, attempts, last_error, finished_at IS NOT NULL "
                "FROM sqla_queue.jobs ORDER BY id"
            )
        )
        return [tuple(r) for r in rows]


def test_every_enqueue_path_sets_the_deadline_and_an_expired_job_never_runs(
    engine: Engine,
) -> None:
    ran: list[int] = []
    registry = work_registry(ran)
    work = registry["work"]
    with Session(engine) as session, session.begin():
        enqueue(session, "work", {"n": 1}, expires_in=60)
        work.enqueue(session, {"n": 2}, expires_at=PAST)
        work.using(expires_in=dt.timedelta(minutes=5)).defer(session, n=3)
        enqueue_many(session, [{"task": "work", "args": {"n": 4}, "expires_in": 60}])
        enqueue_many(session, [work.using(expires_in=60).row(n=5)])
        session.add(Job(task="work", args={"n": 6}, expires_in=60))
    with engine.begin() as conn:
        work.using(expires_in=60).defer(conn, n=7)
    assert count_where(engine, "expires_at IS NULL") == 0
    assert count_where(engine, "expires_at > now() + interval '50 seconds'") == 6
    expire_all(engine)
    assert drain(engine, registry) == DrainResult()
    assert ran == []
    assert {s[1:] for s in expiry_states(engine)} == {("cancelled", 0, "expired", True)}


def test_the_worker_cancels_expired_jobs_and_runs_the_others(engine: Engine) -> None:
    ran: list[int] = []
    registry = work_registry(ran)
    work = registry["work"]
    with Session(engine) as session, session.begin():
        work.using(expires_at=PAST).defer(session, n=1)
        work.using(expires_in=3600).defer(session, n=2)
        work.defer(session, n=3)
    stats = run_until_empty(engine, registry, BURST)
    assert sorted(ran) == [2, 3]
    assert stats.succeeded == 2
    assert expiry_states(engine) == [("1", "cancelled", 0, "expired", True)]  # the others deleted


def test_a_task_default_expires_in_applies_per_job(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="fresh", expires_in=120)
    def fresh() -> None: ...

    with Session(engine) as session, session.begin():
        fresh.defer(session)
        fresh.using(expires_in=3600).defer(session)
    with engine.connect() as conn:
        seconds = conn.execute(
            text(
                "SELECT round(extract(epoch FROM expires_at - created_at) / 60) "
                "FROM sqla_queue.jobs ORDER BY id"
            )
        ).scalars()
        assert list(seconds) == [2, 60]


def test_bad_deadlines_are_refused_in_one_line(engine: Engine) -> None:
    registry = work_registry([])
    work = registry["work"]
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidJobError, match="expires_at or expires_in, not both"):
            work.using(expires_at=PAST, expires_in=5).defer(session, n=1)
        with pytest.raises(InvalidJobError, match="expires_at has no time zone"):
            work.using(expires_at=dt.datetime(2030, 1, 1)).defer(session, n=1)
        with pytest.raises(InvalidJobError, match="expires_in"):
            work.using(expires_in=-1).defer(session, n=1)
    with pytest.raises(ConfigurationError, match="no default expires_at"):
        registry.task(name="x", expires_at=PAST)(lambda: None)


def test_jobs_show_and_the_dashboard_show_the_deadline(engine: Engine, database_url: str) -> None:
    registry = work_registry([])
    with Session(engine) as session, session.begin():
        job = registry["work"].using(expires_at=PAST).defer(session, n=1)
        session.flush()
        job_id = job.id
    drain(engine, registry)
    shown = cli("jobs", "show", str(job_id), url=database_url)
    assert shown.exit_code == 0, shown.output
    assert "expires_at: 2020-01-01T00:00:00+00:00" in shown.output
    assert "last_error:\nexpired" in shown.output
    page = client(engine).get(f"/jobs/{job_id}").text
    assert 'id="expires-at"' in page
    assert "2020-01-01" in page
    assert "expired: never ran" in page
