"""The worker's claim and completion run as compiled text on the driver's cursor.

The same statement gives the same rows whether it goes through SQLAlchemy (when an engine
listener such as metrics must see it) or straight to the driver, and a driver error is
SQLAlchemy's own exception, so the worker's error handling is unchanged.
"""

from __future__ import annotations

import threading

import pytest
from helpers.support import enqueue_jobs
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from sqla_queue.db import queries
from sqla_queue.worker.connection import (
    JOB_ARRAYS,
    DatabaseLink,
    DriverStatement,
    FailureLog,
)


def _link(engine: Engine) -> DatabaseLink:
    return DatabaseLink(engine, threading.Event(), None, FailureLog())


@pytest.mark.parametrize("listened", [False, True])
def test_complete_and_claim_returns_the_same_rows_either_way(
    engine: Engine, listened: bool
) -> None:
    ids = enqueue_jobs(engine, "noop", 4)
    seen: list[str] = []
    if listened:  # an engine listener: the statement goes through SQLAlchemy
        event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    statics = {"worker_id": "w1", "lease": 60.0, "task_leases": {}, "task_max_attempts": {}}
    claim = DriverStatement(queries.claim_jobs(None), engine, statics)
    both = DriverStatement(
        queries.complete_and_claim(None, limits=False, size=5), engine, statics, JOB_ARRAYS
    )
    link = _link(engine)
    try:
        first = link.execute(claim, {"limit": 2})
        keys = first.keys()
        claimed = [row[keys.index("id")] for row in first.all()]
        attempts = [row[keys.index("attempts")] for row in first.all()]
        second = link.execute(both, {"job_ids": claimed, "job_attempts": attempts})
        rows = second.all()
        keys = second.keys()
    finally:
        link.close()
    assert sorted(claimed + [row[keys.index("id")] for row in rows]) == sorted(ids)
    assert all(row[keys.index("status")] == "running" for row in rows)
    assert [row[keys.index("finished")] for row in rows] == [len(claimed)] * len(rows)
    assert bool(seen) is listened


def test_a_driver_error_is_sqlalchemys_exception_with_its_sqlstate(engine: Engine) -> None:
    statement = DriverStatement(queries.complete_jobs(), engine, {}, JOB_ARRAYS)
    link = _link(engine)
    try:
        with pytest.raises(DBAPIError) as raised:
            # job_attempts shorter than job_ids is fine for unnest; a non-integer id is not
            link.execute(statement, {"job_ids": ["x"], "job_attempts": [1]})
    finally:
        link.close()
    assert not raised.value.connection_invalidated
    assert getattr(raised.value.orig, "sqlstate", "")[:2] == "22"  # a data exception
    assert not isinstance(raised.value, IntegrityError)


def test_task_settings_in_the_claims_text_survive_any_task_name(engine: Engine) -> None:
    """The worker's claim carries its tasks' leases and max_attempts as a jsonb constant
    in its text (so a plan made once still reads them once): quotes, percent signs and the
    dollar-quote tag itself in a task name change nothing."""
    odd = "o'k%s$j$%(x)s\\"
    (job_id,) = enqueue_jobs(engine, odd, 1)
    settings = {"task_leases": {odd: 1234.0}, "task_max_attempts": {odd: 7}}
    claim = DriverStatement(
        queries.claim_jobs(None, limits=False, size=5, settings=settings),
        engine,
        {"worker_id": "w1", "lease": 60.0},
    )
    link = _link(engine)
    try:
        rows = link.execute(claim)
        keys = rows.keys()
        (row,) = rows.all()
        with engine.connect() as conn:
            lease = conn.execute(
                text(
                    "SELECT extract(epoch FROM lease_expires_at - locked_at) "
                    "FROM sqla_queue.jobs WHERE id = :id"
                ),
                {"id": job_id},
            ).scalar()
    finally:
        link.close()
    assert row[keys.index("id")] == job_id
    assert row[keys.index("status")] == "running"
    assert lease is not None
    assert abs(float(lease) - 1234.0) < 1
