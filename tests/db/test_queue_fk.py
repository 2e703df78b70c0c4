"""The optional foreign key from jobs.queue to queues.name: dropped and restored on request."""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session, selectinload

from alembic import command
from sqla_queue import Job, OrphanJobsError, Queue, enqueue
from sqla_queue.admin import create_queue
from sqla_queue.cli import main
from sqla_queue.db import queries
from sqla_queue.db.migrate import (
    SCHEMA_REVISION,
    alembic_config,
    downgrade,
    drop_queue_fk,
    restore_queue_fk,
    schema_revision,
    upgrade,
)


def _queue_fks(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(queries.queue_foreign_keys()).scalars())


def test_upgrade_heads_over_the_default_folder_never_drops_the_fk(
    empty_database_url: str,
) -> None:
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            config = alembic_config(conn)
            assert "sqlaq_nofk_0001" not in {
                script.revision for script in ScriptDirectory.from_config(config).walk_revisions()
            }
            command.upgrade(config, "heads")
        assert _queue_fks(engine) == ["fk_jobs_queue_queues"]
    finally:
        engine.dispose()


def test_drop_queue_fk_lets_a_job_name_an_unknown_queue(engine: Engine) -> None:
    drop_queue_fk(engine)

    assert _queue_fks(engine) == []
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {}, queue="nowhere")
    with Session(engine) as session:
        assert session.scalar(select(Job.queue)) == "nowhere"


def test_orm_relationship_works_with_and_without_the_constraint(engine: Engine) -> None:
    for present in (True, False):
        if not present:
            drop_queue_fk(engine)
        with Session(engine) as session, session.begin():
            enqueue(session, "t", {"present": present})
        with Session(engine) as session:
            job = session.scalars(select(Job).where(Job.args["present"].as_boolean() == present))
            loaded = job.one()
            assert loaded.queue_row is not None
            assert loaded.queue_row.name == "default"
            queue = session.scalars(
                select(Queue).where(Queue.name == "default").options(selectinload(Queue.jobs))
            ).one()
            assert loaded in queue.jobs
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {}, queue="ghost")
    with Session(engine) as session:
        ghost = session.scalars(select(Job).where(Job.queue == "ghost")).one()
        assert ghost.queue_row is None


def test_restore_refuses_while_jobs_name_missing_queues_and_says_how_to_fix(
    engine: Engine,
) -> None:
    drop_queue_fk(engine)
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {}, queue="ghost")
        enqueue(session, "t", {}, queue="ghost")

    with pytest.raises(OrphanJobsError) as raised:
        restore_queue_fk(engine)

    message = str(raised.value)
    assert "'ghost': 2 job(s)" in message
    assert "sqla-queue queues create" in message
    assert _queue_fks(engine) == []
    with engine.begin() as conn:
        create_queue(conn, "ghost")
    restore_queue_fk(engine)
    assert _queue_fks(engine) == ["fk_jobs_queue_queues"]


def test_migrate_keeps_working_after_the_fk_is_dropped(engine: Engine) -> None:
    drop_queue_fk(engine)

    upgrade(engine)

    with engine.connect() as conn:
        assert schema_revision(conn) == SCHEMA_REVISION
    assert _queue_fks(engine) == []


def test_full_downgrade_with_the_fk_dropped_removes_everything(engine: Engine) -> None:
    drop_queue_fk(engine)

    downgrade(engine)

    with engine.connect() as conn:
        assert schema_revision(conn) is None


def test_cli_migrate_drops_and_restores_the_fk(database_url: str) -> None:
    engine = create_engine(database_url)
    runner = CliRunner()
    try:
        dropped = runner.invoke(
            main, ["migrate", "--database-url", database_url, "--drop-queue-fk"]
        )
        assert dropped.exit_code == 0, dropped.output
        assert "queue foreign key dropped" in dropped.output
        assert _queue_fks(engine) == []

        restored = runner.invoke(
            main, ["migrate", "--database-url", database_url, "--restore-queue-fk"]
        )
        assert restored.exit_code == 0, restored.output
        assert _queue_fks(engine) == ["fk_jobs_queue_queues"]
    finally:
        engine.dispose()


def test_cli_restore_with_orphans_exits_with_the_queue_names(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        drop_queue_fk(engine)
        with Session(engine) as session, session.begin():
            enqueue(session, "t", {}, queue="typo")
    finally:
        engine.dispose()

    result = CliRunner().invoke(
        main, ["migrate", "--database-url", database_url, "--restore-queue-fk"]
    )

    assert result.exit_code == 1
    assert "'typo': 1 job(s)" in result.output


def test_restore_without_a_drop_changes_nothing(engine: Engine) -> None:
    restore_queue_fk(engine)

    assert _queue_fks(engine) == ["fk_jobs_queue_queues"]
