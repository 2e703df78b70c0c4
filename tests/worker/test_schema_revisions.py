"""A worker and a schema it does not know: a newer sqla-queue migrated the database (during a
rolling deploy, say). It refuses to start, in one line, and a running worker that sees the
schema move past it stops claiming, says why in its log and in /readyz, and claims again once
the schema is back at a revision it knows."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from helpers.fault_kit import free_port
from helpers.support import WorkerThread, answers_with, cli, count_where, http_get, wait_for
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, SchemaUnknownError, enqueue
from sqla_queue.db import migrate

UNKNOWN = "sqlaq_9999"
VERSIONS = f"{migrate.VERSION_TABLE_SCHEMA}.{migrate.VERSION_TABLE}"


def record_revision(engine: Engine, revision: str, where: str = "version table") -> None:
    """Record `revision` as our schema's, as a newer sqla-queue's migration would."""
    with engine.begin() as conn:
        if where == "version table":
            conn.execute(text(f"UPDATE {VERSIONS} SET version_num = :rev"), {"rev": revision})
        else:
            conn.execute(text(f"COMMENT ON SCHEMA sqla_queue IS 'sqla_queue revision {revision}'"))


@pytest.fixture
def head(engine: Engine) -> str:
    with engine.connect() as conn:
        (recorded,) = conn.scalars(text(f"SELECT version_num FROM {VERSIONS}")).all()
    assert recorded in migrate.known_revisions()
    return recorded


@pytest.mark.parametrize("where", ["version table", "marker"])
@pytest.mark.parametrize("command", [["worker", "--app", "helpers.apps.tasks:registry"], ["stats"]])
def test_a_schema_revision_this_code_does_not_know_is_refused_in_one_line(
    database_url: str, engine: Engine, command: list[str], where: str
) -> None:
    record_revision(engine, UNKNOWN, where)
    with pytest.raises(SchemaUnknownError, match=UNKNOWN):
        migrate.check_schema(engine)
    result = cli(*command, url=database_url, catch=True)
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"records revision {UNKNOWN}, which this version of sqla-queue does not know" in lines[0]
    assert "upgrade sqla-queue here" in lines[0]


def test_a_running_worker_stops_claiming_when_the_schema_moves_past_it_and_says_why(
    engine: Engine, head: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()
    registry.task(name="noop")(lambda: None)
    port = free_port()
    caplog.set_level(logging.INFO, logger="sqla_queue.worker")
    worker = WorkerThread(
        engine,
        registry,
        heartbeat=0.2,
        poll_interval=0.1,
        health_port=port,
        health_host="127.0.0.1",
    )
    keeper = worker.worker.keeper
    with worker:
        with Session(engine) as session, session.begin():
            enqueue(session, "noop")
        wait_for(lambda: worker.worker.stats.succeeded == 1, timeout=60)

        record_revision(engine, UNKNOWN)  # a newer sqla-queue migrates the database
        wait_for(lambda: keeper.schema_refusal, timeout=60)
        with Session(engine) as session, session.begin():
            later = enqueue(session, "noop", flush=True).id
        for _ in range(3):  # it beat (and read the schema's revisions) 3 times since
            beat = _heartbeat_at(engine)
            wait_for(lambda: _heartbeat_at(engine) > beat, timeout=60)  # noqa: B023
        assert count_where(engine, f"id = {later} AND status = 'queued'") == 1
        status, ready = http_get(port, "/readyz")
        assert status == 503
        assert UNKNOWN in ready["schema"]
        assert "claiming no more jobs" in ready["schema"]
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("claiming no more jobs" in m and UNKNOWN in m for m in said), said

        record_revision(engine, head)  # downgraded again: it claims again
        wait_for(lambda: worker.worker.stats.succeeded == 2, timeout=60)
        wait_for(lambda: answers_with(port, "/readyz", 200), timeout=60)
    assert keeper.schema_refusal is None


def _heartbeat_at(engine: Engine) -> dt.datetime:
    """When the worker last beat its registration (it reads the schema's revisions then)."""
    with engine.connect() as conn:
        beat = conn.scalar(text("SELECT heartbeat_at FROM sqla_queue.workers"))
    assert isinstance(beat, dt.datetime)
    return beat


FUTURE = "sqlaq_9998_future"


def record_newer_revision(engine: Engine, kind: str) -> None:
    """A newer sqla-queue applied revision `FUTURE` of `kind` (it records kinds as it goes)."""
    record_revision(engine, FUTURE)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO sqla_queue.schema_revisions (revision, kind) VALUES (:r, :k)"),
            {"r": FUTURE, "k": kind},
        )


def test_a_worker_built_for_an_older_revision_runs_on_newer_expand_revisions_saying_so_once(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    record_newer_revision(engine, "expand")
    assert migrate.check_schema(engine) == migrate.SCHEMA_REVISION  # the marker: ours
    registry = Registry()
    registry.task(name="noop")(lambda: None)
    caplog.set_level(logging.INFO, logger="sqla_queue.worker")
    worker = WorkerThread(engine, registry, heartbeat=0.2, poll_interval=0.1)
    with worker:
        with Session(engine) as session, session.begin():
            enqueue(session, "noop")
        wait_for(lambda: worker.worker.stats.succeeded == 1, timeout=60)
        for _ in range(2):  # it read the schema's revisions at later beats too
            beat = _heartbeat_at(engine)
            wait_for(lambda: _heartbeat_at(engine) > beat, timeout=60)  # noqa: B023
        assert worker.worker.keeper.schema_refusal is None
    said = [r.getMessage() for r in caplog.records if "expand-only" in r.getMessage()]
    assert len(said) == 1, said
    assert FUTURE in said[0]
    assert f"built for schema {migrate.SCHEMA_REVISION}" in said[0]


def test_a_worker_refuses_a_newer_contract_revision(engine: Engine) -> None:
    record_newer_revision(engine, "contract")
    with pytest.raises(SchemaUnknownError, match=FUTURE):
        migrate.check_schema(engine)


def test_a_worker_built_for_a_newer_revision_than_the_database_refuses_naming_migrate(
    empty_database_url: str,
) -> None:
    from sqlalchemy import create_engine

    old = create_engine(empty_database_url)
    try:
        migrate.upgrade(old, "sqlaq_0017")
    finally:
        old.dispose()
    result = cli(
        "worker", "--app", "helpers.apps.tasks:registry", url=empty_database_url, catch=True
    )
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "sqlaq_0017" in lines[0]
    assert "sqla-queue migrate" in lines[0]


def test_a_worker_registers_its_version_shown_by_workers_list_and_the_dashboard(
    database_url: str, engine: Engine
) -> None:
    import json

    from helpers.dashboard_kit import client

    registry = Registry()
    worker = WorkerThread(engine, registry, heartbeat=0.2, poll_interval=0.1)
    with worker:
        wait_for(lambda: count_where_workers(engine) == 1, timeout=60)
        (listed,) = json.loads(cli("workers", "list", "--json", url=database_url).output)
        table = cli("workers", "list", url=database_url).output
        page = client(engine).get("/workers").text
    assert listed["version"] == migrate.package_version()
    assert listed["schema_revision"] == migrate.SCHEMA_REVISION
    assert migrate.SCHEMA_REVISION[:10] in table
    assert f"{migrate.package_version()} ({migrate.SCHEMA_REVISION})" in page


def count_where_workers(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text("SELECT count(*) FROM sqla_queue.workers")) or 0)
