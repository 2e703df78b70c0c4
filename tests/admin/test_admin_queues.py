"""Queue administration: deleting a queue and its jobs, re-running `queues create`."""

from __future__ import annotations

from helpers.support import cli
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Job, JobStatus, Queue
from sqla_queue.admin import create_queue, delete_queue
from sqla_queue.db import queries


def test_deleting_a_queue_without_force_only_deletes_finished_jobs(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        create_queue(session, "history", retention="keep")
        session.add(Job(task="t", queue="history"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET status = 'done', finished_at = now()"))
    with Session(engine) as session, session.begin():
        session.add(Job(task="t", queue="history"))
    with engine.begin() as conn:
        # What delete_queue runs: a queued job that arrived after its count must survive.
        deleted = conn.execute(
            queries.delete_jobs_of_queue(finished_only=True), {"queue_name": "history"}
        ).rowcount
        left = conn.execute(text("SELECT status FROM sqla_queue.jobs")).scalars().all()
    assert deleted == 1
    assert left == [JobStatus.queued.value]


def test_deleting_a_queue_with_only_finished_jobs_removes_them_with_it(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        create_queue(session, "old", retention="keep")
        session.add(Job(task="t", queue="old"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET status = 'failed', finished_at = now()"))
    with Session(engine) as session, session.begin():
        assert delete_queue(session, "old") == 1
        assert session.get(Queue, "old") is None


def test_rerunning_queues_create_keeps_the_retention(database_url: str) -> None:
    assert (
        cli(
            "queues", "create", "audit", "--retention", "archive", url=database_url, catch=True
        ).exit_code
        == 0
    )
    again = cli("queues", "create", "audit", url=database_url, catch=True)
    assert again.exit_code == 0, again.output
    assert "exists (retention archive)" in again.output
    changed = cli("queues", "create", "audit", "--retention", "keep", url=database_url, catch=True)
    assert "exists (retention keep)" in changed.output
