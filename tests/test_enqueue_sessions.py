"""Edge cases of enqueue and administration: session binds, autoflush, privileges, reruns."""

from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_queue import (
    InvalidJobError,
    Job,
    JobStatus,
    Queue,
    QueueBase,
    enqueue,
    enqueue_many,
    queries,
)
from sqla_queue.admin import create_queue, delete_queue
from sqla_queue.cli import main
from sqla_queue.enqueue import COPY_MIN_ROWS


def run_cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"SQLA_QUEUE_DATABASE_URL": url})


def count_jobs(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_enqueue_works_in_a_session_with_per_mapper_binds(engine: Engine) -> None:
    with Session(binds={QueueBase: engine}) as session, session.begin():
        enqueue(session, "t.one")
        enqueue_many(session, [{"task": "t.many"}] * (COPY_MIN_ROWS + 1))
    assert count_jobs(engine) == COPY_MIN_ROWS + 2


def test_bulk_enqueue_flushes_a_pending_queue_first(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        session.add(Queue(name="fresh"))
        ids = enqueue_many(session, [{"task": "t", "queue": "fresh"}] * (COPY_MIN_ROWS + 50))
    assert len(ids) == COPY_MIN_ROWS + 50


def test_bulk_enqueue_without_sequence_privilege_falls_back_to_insert(
    engine: Engine, database_url: str
) -> None:
    role = f"sqlaq_enq_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT USAGE ON SCHEMA sqla_queue TO {role}"))
        conn.execute(text(f"GRANT INSERT, SELECT ON sqla_queue.jobs TO {role}"))
    limited = create_engine(make_url(database_url).set(username=role))
    try:
        with Session(limited) as session, session.begin():
            ids = enqueue_many(session, [{"task": "t"}] * (COPY_MIN_ROWS + 10))
        assert len(ids) == COPY_MIN_ROWS + 10
    finally:
        limited.dispose()
        with engine.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
    assert count_jobs(engine) == COPY_MIN_ROWS + 10


def test_an_empty_queue_name_is_refused_not_sent_to_default(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match="queue must be a non-empty string"):
            enqueue(session, "t", queue="")
        with pytest.raises(InvalidJobError, match="queue must be a non-empty string"):
            enqueue_many(session, [{"task": "t", "queue": ""}])


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), 1e20])
def test_a_delay_that_is_not_a_finite_duration_is_refused(engine: Engine, delay: float) -> None:
    with Session(engine) as session, pytest.raises(InvalidJobError) as refused:
        enqueue(session, "t", delay=delay)
    assert "delay must be a number of seconds from 0 to 3155760000 s" in str(refused.value)


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
        run_cli(database_url, "queues", "create", "audit", "--retention", "archive").exit_code == 0
    )
    again = run_cli(database_url, "queues", "create", "audit")
    assert again.exit_code == 0, again.output
    assert "exists (retention archive)" in again.output
    changed = run_cli(database_url, "queues", "create", "audit", "--retention", "keep")
    assert "exists (retention keep)" in changed.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("enqueue", "t", "--args", '{"x": NaN}'), "NaN is not JSON"),
        (("enqueue", "t", "--delay", "99999999999999999999"), "from 0 to 3155760000 s"),
        (("enqueue", "t", "--delay", "1e20"), "'1e20' is not a duration"),
        (("migrate", "--revision", "bogus"), "migration failed"),
    ],
)
def test_cli_bad_values_are_one_line_errors(
    database_url: str, args: tuple[str, ...], fragment: str
) -> None:
    result = run_cli(database_url, *args)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert fragment in result.output
