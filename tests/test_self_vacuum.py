"""Workers vacuum the jobs table themselves once its dead rows pass `vacuum_threshold`:
one worker at a time, outside any transaction, and a role that may not gets one warning.
`doctor` reports the dead rows and the last vacuum (the jobs_vacuum check)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue_many
from sqla_queue.doctor import Severity, diagnose
from sqla_queue.queries import vacuum as statements
from sqla_queue.worker import Worker, WorkerConfig
from sqla_queue.worker.connection import FailureLog
from sqla_queue.worker.vacuum import SelfVacuum, over_threshold


def make_dead_rows(engine: Engine, count: int) -> None:
    """Enqueue `count` jobs and delete them: `count` dead rows, counted by the statistics
    collector at once (pg_stat_force_next_flush, PostgreSQL 15)."""
    with Session(engine) as session, session.begin():
        enqueue_many(session, [{"task": "noop", "args": {}} for _ in range(count)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("DELETE FROM sqla_queue.jobs"))
        conn.execute(text("SELECT pg_stat_force_next_flush()"))


def state(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(statements.jobs_vacuum_state()).mappings().one())


def test_dead_rows_past_the_threshold_are_vacuumed(engine: Engine) -> None:
    make_dead_rows(engine, 1500)
    assert state(engine)["dead"] >= 1500
    vacuum = SelfVacuum(engine, 1000, FailureLog())
    assert vacuum.run() is True
    after = state(engine)
    assert after["vacuum"] is not None  # pg_stat_user_tables.last_vacuum was set
    assert after["dead"] < 1500
    assert vacuum.vacuums == 1
    with engine.connect() as conn:  # analysed too: the claim's plan sees the table as it is
        analysed = conn.execute(
            text(
                "SELECT last_analyze FROM pg_stat_user_tables "
                "WHERE schemaname = 'sqla_queue' AND relname = 'jobs'"
            )
        ).scalar()
    assert analysed is not None


def test_dead_rows_below_the_threshold_are_left_alone(engine: Engine) -> None:
    make_dead_rows(engine, 500)
    vacuum = SelfVacuum(engine, 1000, FailureLog())
    assert vacuum.run() is False
    assert state(engine)["vacuum"] is None


def test_threshold_grows_with_a_tenth_of_the_live_rows() -> None:
    assert over_threshold(live=0, dead=1001, threshold=1000)
    assert not over_threshold(live=10_000, dead=1999, threshold=1000)
    assert over_threshold(live=10_000, dead=2001, threshold=1000)


def test_one_worker_at_a_time_vacuums(engine: Engine) -> None:
    make_dead_rows(engine, 1500)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as other:
        assert other.execute(statements.try_vacuum_lock()).scalar() is True
        vacuum = SelfVacuum(engine, 1000, FailureLog())
        assert state(engine)["vacuuming"] is True  # as doctor and the other workers see it
        with engine.connect() as conn:
            assert vacuum.check(conn) is False  # somebody else is at it: no thread started
        assert vacuum.run() is False  # and the lock is not taken past the holder
        assert state(engine)["vacuum"] is None
        other.execute(statements.vacuum_unlock())
    assert SelfVacuum(engine, 1000, FailureLog()).run() is True


def test_a_running_worker_vacuums_its_table(engine: Engine) -> None:
    registry = Registry()
    config = WorkerConfig(heartbeat=0.2, dead_after=1.0, poll_interval=0.2, vacuum_threshold=1000)
    worker = Worker(engine, registry, config)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    # the dead rows first: a worker already running claims and puts back the unknown
    # `noop` jobs meanwhile, and the DELETE's statistics were then once not flushed in 30 s
    # (live 1500, dead 0): the test would wait on the statistics, not on the worker
    make_dead_rows(engine, 1500)
    thread.start()
    try:
        deadline = threading.Event()
        for _ in range(300):  # 30 s: the keeper looks every beat (0.2 s), a loaded CI is slow
            if state(engine)["vacuum"] is not None:
                break
            deadline.wait(0.1)
        seen = state(engine)
        assert seen["vacuum"] is not None, (
            f"no VACUUM in 30 s: {seen}, worker vacuums {worker.keeper.vacuum.vacuums}, "
            f"refused {worker.keeper.vacuum.refused!r}"
        )
        assert worker.keeper.vacuum.vacuums >= 1
    finally:
        worker.stop()
        thread.join(30)


def test_no_threshold_leaves_the_table_to_autovacuum(engine: Engine) -> None:
    make_dead_rows(engine, 1500)
    vacuum = SelfVacuum(engine, None, FailureLog())
    with engine.connect() as conn:
        assert vacuum.check(conn) is False
    assert state(engine)["vacuum"] is None


@pytest.fixture
def unprivileged_engine(database_url: str, engine: Engine) -> Iterator[Engine]:
    """An engine of a role that may read and write the jobs table but does not own it."""
    role = f"sqlaq_novacuum_{uuid.uuid4().hex[:8]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT USAGE ON SCHEMA sqla_queue TO {role}"))
        conn.execute(
            text(f"GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA sqla_queue TO {role}")
        )
    url = make_url(database_url).set(username=role)
    limited = create_engine(url, poolclass=pool.NullPool)
    yield limited
    limited.dispose()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"DROP OWNED BY {role}"))
        conn.execute(text(f"DROP ROLE {role}"))


def test_a_role_that_may_not_vacuum_gets_one_warning(
    engine: Engine, unprivileged_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    make_dead_rows(engine, 1500)
    vacuum = SelfVacuum(unprivileged_engine, 1000, FailureLog())
    with caplog.at_level(logging.WARNING, logger="sqla_queue.worker"):
        assert vacuum.run() is False
        with unprivileged_engine.connect() as conn:
            assert vacuum.check(conn) is False  # it stopped trying
    assert vacuum.refused is not None
    assert not vacuum.enabled
    warnings = [r.getMessage() for r in caplog.records if "may not vacuum" in r.getMessage()]
    assert len(warnings) == 1
    assert "owner" in warnings[0]
    assert "vacuum_threshold=None" in warnings[0]
    assert state(engine)["vacuum"] is None


def test_doctor_reports_dead_rows_and_the_last_vacuum(engine: Engine) -> None:
    make_dead_rows(engine, 1500)
    finding = {f.name: f for f in diagnose(engine)}["jobs_vacuum"]
    assert finding.severity is Severity.ok
    assert finding.details["dead_tuples"] >= 1500
    assert finding.details["last_vacuum_seconds_ago"] is None
    assert "vacuumed never" in finding.value
    SelfVacuum(engine, 1000, FailureLog()).run()
    finding = {f.name: f for f in diagnose(engine)}["jobs_vacuum"]
    assert finding.details["last_vacuum_seconds_ago"] is not None


def test_doctor_warns_when_vacuum_is_behind(engine: Engine) -> None:
    make_dead_rows(engine, statements.BEHIND_DEAD_ROWS + 500)
    finding = {f.name: f for f in diagnose(engine)}["jobs_vacuum"]
    assert finding.severity is Severity.warn
    assert "VACUUM" in finding.fix


def test_a_table_vacuumed_by_somebody_else_is_skipped_not_refused(engine: Engine) -> None:
    make_dead_rows(engine, 1500)
    with engine.connect() as other, other.begin():
        # What a VACUUM or autovacuum in progress holds: SKIP_LOCKED passes the table by.
        other.execute(text("LOCK TABLE sqla_queue.jobs IN SHARE UPDATE EXCLUSIVE MODE"))
        vacuum = SelfVacuum(engine, 1000, FailureLog())
        assert vacuum.run() is False
        assert vacuum.refused is None
        assert vacuum.enabled
    assert vacuum.run() is True
