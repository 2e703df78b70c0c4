"""Workers vacuum the jobs table themselves once its dead rows pass `vacuum_threshold`:
one worker at a time, outside any transaction, and a role that may not gets one warning.
`doctor` reports the dead rows and the last vacuum (the jobs_vacuum check), and the empty
pages no VACUUM gives back (jobs_truncatable). The upkeep never stalls the claim (issue 40):
a worker's VACUUM and statistics check meet a lock another session holds on the table, as
a VACUUM in progress holds it, while the worker drains, and the jobs keep starting."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_queue import Registry, admin, enqueue_many
from sqla_queue.db.queries import vacuum as statements
from sqla_queue.doctor import Severity, diagnose
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
    vacuum.run()  # may ANALYZE (1,000 changes on a table never analyzed), never VACUUM
    assert vacuum.vacuums == 0
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
        vacuum.check(conn)  # its statistics are still kept: an ANALYZE may start
    vacuum.stop(30)
    assert not vacuum.running()
    assert vacuum.vacuums == 0
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


def _relation_pages(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(text("SELECT pg_relation_size('sqla_queue.jobs') / 8192")).scalar_one()
        )


def test_the_jobs_table_is_migrated_with_vacuum_truncate_off(engine: Engine) -> None:
    """No VACUUM, a worker's or autovacuum's, takes the lock that stops every claim to give
    the table's empty end back (migration sqlaq_0014)."""
    with engine.connect() as conn:
        options = conn.execute(
            text("SELECT reloptions FROM pg_class WHERE oid = 'sqla_queue.jobs'::regclass")
        ).scalar_one()
    assert "vacuum_truncate=false" in options


def test_the_self_vacuum_gives_no_page_back(engine: Engine) -> None:
    """The empty pages stay (the queue refills them); truncating them takes an ACCESS
    EXCLUSIVE lock every claim waits behind, and the VACUUM's attempts at it kept its own
    lock up to 5 s longer, an ANALYZE waiting behind that (issue 40). Even on a table whose
    `vacuum_truncate` was reset, the worker's VACUUM says TRUNCATE false itself."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ALTER TABLE sqla_queue.jobs RESET (vacuum_truncate)"))
    make_dead_rows(engine, 1500)  # every row deleted: the whole table could go
    pages = _relation_pages(engine)
    assert pages > 0
    vacuum = SelfVacuum(engine, 1000, FailureLog())
    assert vacuum.run() is True
    assert vacuum.vacuums == 1
    assert _relation_pages(engine) == pages


def test_doctor_names_the_space_a_truncation_gives_back_and_its_fix_runs_as_printed(
    engine: Engine,
) -> None:
    make_dead_rows(engine, 1500)
    assert SelfVacuum(engine, 1000, FailureLog()).run() is True
    pages = _relation_pages(engine)
    finding = {f.name: f for f in diagnose(engine)}["jobs_truncatable"]
    assert finding.severity is Severity.ok  # a few hundred kB: named, not warned of
    assert finding.details["pages"] == pages
    assert finding.details["empty_pages"] == pages  # every row gone: all of it
    assert finding.details["empty_bytes"] == pages * 8192
    assert "could be given back" in finding.value
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(finding.fix.split("`")[1])  # as doctor prints it
    assert _relation_pages(engine) == 0
    after = {f.name: f for f in diagnose(engine)}["jobs_truncatable"]
    assert after.details["empty_pages"] == 0


def test_doctor_counts_only_the_empty_pages_after_the_last_row(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        enqueue_many(session, [{"task": "noop", "args": {}} for _ in range(3000)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        last = conn.execute(text("SELECT max(id) FROM sqla_queue.jobs")).scalar_one()
        # the first jobs stay, the rest go: the pages after the first jobs' are empty
        conn.execute(text("DELETE FROM sqla_queue.jobs WHERE id > :keep"), {"keep": last - 2900})
        conn.execute(text("VACUUM (TRUNCATE false) sqla_queue.jobs"))
        used = conn.execute(
            text("SELECT max((ctid::text::point)[0])::bigint + 1 FROM sqla_queue.jobs")
        ).scalar_one()
    pages = _relation_pages(engine)
    finding = {f.name: f for f in diagnose(engine)}["jobs_truncatable"]
    assert 0 < used < pages
    assert finding.details["empty_pages"] == pages - used


STALL_JOBS = 600
HOLD_UNTIL_STARTED = 200
"""The other session holds the table's lock until this many jobs have started..."""
HOLD_AT_MOST = 60.0
"""...or for this many seconds after the worker registered: a deadline that fails the test
(a claim loop that waits behind the lock starts none), never one that measures speed."""


def _started(engine: Engine) -> list[dt.datetime]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT started_at FROM sqla_queue.all_jobs "
                    "WHERE task = 'tick' AND started_at IS NOT NULL ORDER BY started_at"
                )
            ).scalars()
        )


def _registered_at(engine: Engine, worker_id: str) -> dt.datetime | None:
    with engine.connect() as conn:
        started: dt.datetime | None = conn.execute(
            text("SELECT started_at FROM sqla_queue.workers WHERE id = :id"), {"id": worker_id}
        ).scalar()
        return started


@pytest.mark.timeout(180)
def test_a_vacuum_held_table_stalls_no_job_start_while_a_worker_drains(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="tick")
    def tick() -> None:
        time.sleep(0.005)

    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")  # the started_at of every job stays
    make_dead_rows(engine, 1500)  # past the threshold: the self-vacuum is due at once
    with Session(engine) as session, session.begin():
        enqueue_many(session, [{"task": "tick", "args": {}} for _ in range(STALL_JOBS)])
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_force_next_flush()"))  # and the statistics stale
    config = WorkerConfig(
        concurrency=4,
        batch=10,
        heartbeat=0.2,
        dead_after=2.0,
        poll_interval=0.1,
        vacuum_threshold=1000,
    )
    worker = Worker(engine, registry, config)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    try:
        with engine.connect() as holder:
            holder.execute(text("SET lock_timeout = '10s'"))
            # What a VACUUM in progress holds (through its truncation attempts, up to 5 s):
            # any ANALYZE or VACUUM of the table waits for it, or skips it.
            holder.execute(text("LOCK TABLE sqla_queue.jobs IN SHARE UPDATE EXCLUSIVE MODE"))
            thread.start()
            registered = None
            deadline = time.monotonic() + 60
            while registered is None and time.monotonic() < deadline:
                registered = _registered_at(engine, config.worker_id)
                time.sleep(0.02)
            assert registered is not None, "the worker did not register in 60 s"
            held_from = time.monotonic()
            while (
                len(_started(engine)) < HOLD_UNTIL_STARTED
                and time.monotonic() - held_from < HOLD_AT_MOST
            ):
                time.sleep(0.02)
            started_while_held = len(_started(engine))
            holder.rollback()
        deadline = time.monotonic() + 90
        while len(_started(engine)) < STALL_JOBS and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive(), "the worker did not stop in 30 s"
    assert len(_started(engine)) == STALL_JOBS, "the worker did not drain after the release"
    # Counts, not gaps between start times: the claim loop kept starting jobs for as long as
    # another session held what a VACUUM holds; on ab8d9f7 its own ANALYZE waited there and
    # not one job started until the lock went.
    assert started_while_held >= HOLD_UNTIL_STARTED, (
        f"{started_while_held} of {STALL_JOBS} jobs started in {HOLD_AT_MOST:.0f} s while "
        "another session held the table's SHARE UPDATE EXCLUSIVE lock: the claim waits on it"
    )


def test_the_upkeep_leaves_its_lock_timeout_off_the_pooled_connection(database_url: str) -> None:
    """The upkeep's session waits at most `UPKEEP_LOCK_TIMEOUT` for a lock; the connection
    goes back to the pool (which claims and heartbeats share) with the server's setting."""
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    try:
        make_dead_rows(engine, 1500)
        vacuum = SelfVacuum(engine, 1000, FailureLog())
        assert vacuum.run() is True
        with engine.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "0"
    finally:
        engine.dispose()
