"""What refuses a job of an unknown queue: since sqlaq_0031 triggers that lock nothing (in
place of the foreign key from jobs.queue to queues.name), dropped and restored on request."""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from alembic import command
from sqla_queue import Job, OrphanJobsError, Queue, UnknownQueueError, enqueue, enqueue_many
from sqla_queue.admin import create_queue, delete_queue
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
from sqla_queue.db.models import QUEUE_CHECK_TRIGGERS


def _queue_fks(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(queries.queue_foreign_keys()).scalars())


def _checks(engine: Engine) -> list[str]:
    """The queue check's triggers in place."""
    with engine.connect() as conn:
        names = {row.name for row in conn.execute(queries.schema_triggers())}
    return sorted(names & set(QUEUE_CHECK_TRIGGERS))


CHECKED = sorted(QUEUE_CHECK_TRIGGERS)


def test_upgrade_heads_over_the_default_folder_refuses_unknown_queues_without_the_fk(
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
        assert _queue_fks(engine) == []  # its KEY SHARE lock per job: MultiXacts
        assert _checks(engine) == CHECKED
        with pytest.raises(UnknownQueueError), Session(engine) as session, session.begin():
            enqueue(session, "t", {}, queue="nowhere")
    finally:
        engine.dispose()


def test_drop_queue_fk_lets_a_job_name_an_unknown_queue(engine: Engine) -> None:
    drop_queue_fk(engine)

    assert _queue_fks(engine) == []
    assert _checks(engine) == []
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
    assert _checks(engine) == []
    with engine.begin() as conn:
        create_queue(conn, "ghost")
    restore_queue_fk(engine)
    assert _checks(engine) == CHECKED
    assert _queue_fks(engine) == []


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
        assert "a job of an unknown queue is refused" in restored.output
        assert _checks(engine) == CHECKED
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

    assert _queue_fks(engine) == []
    assert _checks(engine) == CHECKED


def test_an_enqueue_held_open_takes_no_lock_on_its_queues_row(engine: Engine) -> None:
    """Race, held on purpose: while one transaction has enqueued (not committed), another
    locks the queue's row FOR UPDATE at once. Under the foreign key that enqueue held a
    KEY SHARE lock on the row (NOWAIT fails; two such enqueuers made a MultiXact)."""
    with Session(engine) as holder, holder.begin():
        enqueue(holder, "t", {})
        holder.flush()
        with engine.connect() as other:
            other.execute(text("SET lock_timeout = '5s'"))
            locked = other.execute(
                text("SELECT name FROM sqla_queue.queues WHERE name = 'default' FOR UPDATE NOWAIT")
            ).scalar()
            other.rollback()
    assert locked == "default"


def test_the_queue_check_refuses_every_way_a_job_names_an_unknown_queue(engine: Engine) -> None:
    """One clear error, naming the queue, for an ORM enqueue, a batch (one statement, one
    unknown queue among known ones) and a job moved to another queue; nothing written."""
    with pytest.raises(UnknownQueueError) as single, Session(engine) as session, session.begin():
        enqueue(session, "t", {}, queue="typo")
    assert "typo" in str(single.value)
    batch = [{"task": "t", "args": {"n": n}} for n in range(50)]
    batch[37]["queue"] = "also-typo"
    with pytest.raises(UnknownQueueError) as many, Session(engine) as session, session.begin():
        enqueue_many(session, batch)
    assert "also-typo" in str(many.value)
    with Session(engine) as session, session.begin():
        job = enqueue(session, "t", {})
        session.flush()
        job_id = job.id
    with pytest.raises(UnknownQueueError) as moved, engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET queue = 'moved-typo' WHERE id = :id"),
            {"id": job_id},
        )
    assert "moved-typo" in str(moved.value)
    with Session(engine) as session:
        assert session.scalars(select(Job.queue)).all() == ["default"]


def test_a_queue_jobs_name_is_not_deleted_and_a_renamed_queue_takes_its_jobs(
    engine: Engine,
) -> None:
    """What the foreign key's NO ACTION and ON UPDATE CASCADE did, by the queue check."""
    with engine.begin() as conn:
        create_queue(conn, "old-name")
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {}, queue="old-name")
    with pytest.raises(IntegrityError) as refused, engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_queue.queues WHERE name = 'old-name'"))
    assert 'Key (name)=(old-name) is still referenced from table "jobs"' in str(refused.value)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.queues SET name = 'new-name' WHERE name = 'old-name'"))
    with Session(engine) as session:
        assert session.scalars(select(Job.queue)).all() == ["new-name"]
    with engine.begin() as conn:  # the admin's delete: its finished jobs first, then the queue
        conn.execute(text("UPDATE sqla_queue.jobs SET status = 'done', finished_at = now()"))
        assert delete_queue(conn, "new-name") == 1
        assert (
            conn.execute(
                text("SELECT count(*) FROM sqla_queue.queues WHERE name = 'new-name'")
            ).scalar()
            == 0
        )


def test_a_flush_that_adds_a_queue_and_its_jobs_writes_the_queue_first(engine: Engine) -> None:
    """The queue check is not deferred: the ORM must insert a new queue before its jobs,
    in whichever order they were added (there is no foreign key in the models to order by)."""
    with Session(engine) as session, session.begin():
        session.add(Job(task="t", args={}, queue="added-first"))
        enqueue(session, "t", {}, queue="added-first")
        session.add(Queue(name="added-first"))
    with Session(engine) as session:
        assert session.scalars(select(Job.queue)).all() == ["added-first", "added-first"]
