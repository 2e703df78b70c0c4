"""Revisions that run while the queue runs: the same schema from every earlier revision,
locks waited for at most `lock_timeout` and retried, index builds resumed, kinds declared,
contract revisions refused while older workers live."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from alembic.script import ScriptDirectory
from helpers.races import Race
from helpers.schema_catalogue import schema_catalogue
from helpers.support import cli, wait_for
from sqlalchemy import Engine, create_engine, text

from sqla_queue import OlderWorkersError
from sqla_queue.db import migrate, online

SCRIPT = ScriptDirectory.from_config(migrate.alembic_config(optional=True))
EARLIER = [
    rev.revision
    for rev in reversed(list(SCRIPT.iterate_revisions(migrate.SCHEMA_REVISION, "base")))
    if rev is not None and rev.revision != migrate.SCHEMA_REVISION
]


@pytest.fixture
def empty_engine(empty_database_url: str) -> Iterator[Engine]:
    eng = create_engine(empty_database_url)
    yield eng
    eng.dispose()


def test_every_revision_declares_whether_it_expands_or_contracts() -> None:
    undeclared = [
        rev.revision
        for rev in SCRIPT.walk_revisions()
        if getattr(rev.module, "migration_kind", None) not in online.MIGRATION_KINDS
    ]
    assert not undeclared, f"revisions without migration_kind = 'expand' | 'contract': {undeclared}"
    assert len(EARLIER) >= 17


@pytest.mark.parametrize("start", EARLIER)
def test_upgrading_from_an_earlier_revision_gives_the_fresh_install_schema(
    engine: Engine, empty_engine: Engine, start: str
) -> None:
    migrate.upgrade(empty_engine, start)
    with empty_engine.connect() as conn:
        assert migrate.applied_revisions(conn) == (start,)
    migrate.upgrade(empty_engine)
    fresh, upgraded = schema_catalogue(engine), schema_catalogue(empty_engine)
    for kind in fresh:
        assert upgraded[kind] == fresh[kind], kind
    assert ("sqlaq_0009", "contract") in fresh["kinds"]
    assert (migrate.SCHEMA_REVISION, "expand") in fresh["kinds"]


def before_fleet_versions() -> str:
    """The revision before sqlaq_0022_fleet_versions, the first revision that alters the
    workers table (which the tests below hold a lock on)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    down = script.get_revision("sqlaq_0022_fleet_versions").down_revision
    assert isinstance(down, str)
    return down


def test_a_lock_held_by_a_long_transaction_is_waited_for_briefly_and_retried_saying_so(
    empty_engine: Engine,
) -> None:
    before = before_fleet_versions()
    migrate.upgrade(empty_engine, before)
    said: list[str] = []
    with Race(empty_engine) as race:
        held = race.hold(lambda conn: conn.execute(text("SELECT * FROM sqla_queue.workers")).all())
        upgrading = race.beside(
            lambda: migrate.upgrade(
                empty_engine, lock_timeout=0.2, lock_retries=1000, report=said.append
            ),
            "migrate",
        )
        wait_for(lambda: len(said) >= 3, timeout=30)
        assert not upgrading.done()  # still trying, not failed
        held.rollback()
        upgrading.result()
    first = said[0]
    assert before in first
    assert "waited 0.2 s (lock_timeout)" in first
    assert f"pid {held.pid}" in first, first
    assert "retry 1 of 1000" in first
    with empty_engine.connect() as conn:
        assert migrate.check_schema(conn) == migrate.SCHEMA_REVISION
        # the revision that waited applied once it got its lock
        assert conn.scalar(text("SELECT count(*) FROM sqla_queue.schema_revisions")) > 17


def test_a_migration_that_never_gets_its_lock_gives_up_in_one_line_and_resumes_later(
    empty_engine: Engine,
) -> None:
    before = before_fleet_versions()
    migrate.upgrade(empty_engine, before)
    with Race(empty_engine) as race:
        held = race.hold(lambda conn: conn.execute(text("SELECT * FROM sqla_queue.workers")).all())
        with pytest.raises(migrate.MigrationBlockedError) as refused:
            migrate.upgrade(empty_engine, lock_timeout=0.1, lock_retries=2, report=lambda _: None)
        assert f"pid {held.pid}" in str(refused.value)
        assert "in 3 tries of 0.1 s" in str(refused.value)
        held.rollback()
    with empty_engine.connect() as conn:
        assert migrate.applied_revisions(conn) == (before,)
    migrate.upgrade(empty_engine)
    with empty_engine.connect() as conn:
        assert migrate.check_schema(conn) == migrate.SCHEMA_REVISION


def _cancel_when_waiting(engine: Engine, query_start: str) -> None:
    """Cancel the session running `query_start...` once it waits (a killed build)."""

    def waiting() -> int | None:
        with engine.connect() as conn:
            return conn.scalar(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE :q AND wait_event_type = 'Lock'"
                ),
                {"q": query_start + "%"},
            )

    pid = wait_for(waiting, timeout=30)
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_cancel_backend(:pid)"), {"pid": pid})


def test_an_index_build_killed_half_way_is_dropped_and_built_again(
    engine: Engine, empty_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    migrate.upgrade(empty_engine, "sqlaq_0011")
    build = (
        "CREATE INDEX CONCURRENTLY ix_jobs_about ON sqla_queue.jobs (about) WHERE about IS NOT NULL"
    )
    with empty_engine.connect() as conn:
        conn.execute(text("ALTER TABLE sqla_queue.jobs ADD COLUMN about text"))
        conn.commit()
    with Race(empty_engine) as race:
        # an open writer (an enqueue not yet committed) makes the build wait; it is killed
        race.hold(lambda conn: conn.execute(text("LOCK sqla_queue.jobs IN ROW EXCLUSIVE MODE")))
        killer = threading.Thread(target=_cancel_when_waiting, args=(empty_engine, build[:30]))
        killer.start()
        autocommit = empty_engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        with autocommit as conn, pytest.raises(Exception, match="canceling statement"):
            conn.execute(text(build))
        killer.join(30)
    with empty_engine.connect() as conn:
        assert online.index_state(conn, "ix_jobs_about") is False  # left INVALID
    caplog.set_level(logging.WARNING, logger="sqla_queue.migrate")
    migrate.upgrade(empty_engine)
    with empty_engine.connect() as conn:
        assert online.index_state(conn, "ix_jobs_about") is True
    assert any("ix_jobs_about" in r.getMessage() and "INVALID" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert schema_catalogue(empty_engine)["indexes"] == schema_catalogue(engine)["indexes"]


def _register_old_worker(engine: Engine, worker_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.workers (id, hostname, pid, concurrency, expires_at) "
                "VALUES (:id, 'old-host', 4242, 1, now() + interval '1 hour')"
            ),
            {"id": worker_id},
        )


def test_migrate_refuses_a_contract_revision_while_older_workers_live_unless_forced(
    empty_database_url: str, empty_engine: Engine
) -> None:
    migrate.upgrade(empty_engine, "sqlaq_0008")  # sqlaq_0009 (workflows) is a contract
    _register_old_worker(empty_engine, "old-worker-1")
    with pytest.raises(OlderWorkersError, match="old-worker-1"):
        migrate.upgrade(empty_engine)

    refused = cli("migrate", url=empty_database_url, catch=True)
    assert refused.exit_code != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "sqlaq_0009" in lines[0]
    assert "old-worker-1" in lines[0]
    assert "--force" in lines[0]
    with empty_engine.connect() as conn:
        assert migrate.applied_revisions(conn) == ("sqlaq_0008",)  # nothing applied

    forced = cli("migrate", "--force", url=empty_database_url, catch=True)
    assert forced.exit_code == 0, forced.output
    with empty_engine.connect() as conn:
        assert migrate.check_schema(conn) == migrate.SCHEMA_REVISION


def test_migrate_applies_expand_revisions_beside_older_workers(empty_engine: Engine) -> None:
    migrate.upgrade(empty_engine, "sqlaq_0009")
    _register_old_worker(empty_engine, "old-worker-2")
    migrate.upgrade(empty_engine)  # 0010 to head: all expand
    with empty_engine.connect() as conn:
        assert migrate.check_schema(conn) == migrate.SCHEMA_REVISION
        assert conn.scalar(text("SELECT id FROM sqla_queue.workers")) == "old-worker-2"
