"""A worker without -q serves the queues its registry's tasks name; `-q '*'` every queue
(issue 37): another application's jobs are left alone instead of "unknown task" errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.support import cli, create_task_log, enqueue_jobs, task_log
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, Job, Registry, admin, enqueue

APP = "helpers.apps.tasks:registry"  # its tasks name no queue: they serve "default"


def _foreign_job(engine: Engine) -> int:
    with engine.begin() as connection:
        admin.create_queue(connection, "elsewhere")
    with Session(engine) as session, session.begin():
        job = enqueue(session, "other_app.report", {}, queue="elsewhere", flush=True)
        assert job.id is not None
        return job.id


def test_a_worker_without_q_leaves_the_queues_its_tasks_do_not_name(
    database_url: str, engine: Engine
) -> None:
    create_task_log(engine)
    ids = enqueue_jobs(engine, "record", 2)
    foreign = _foreign_job(engine)
    result = cli("worker", "--app", APP, "--burst", url=database_url)
    assert result.exit_code == 0, result.output
    assert "unknown task" not in result.stderr
    assert sorted(job_id for job_id, _ in task_log(engine)) == ids
    with Session(engine) as session:
        job = session.get_one(Job, foreign)
        assert (job.status, job.attempts, job.last_error) == ("queued", 0, None)


def test_a_worker_with_q_star_serves_every_queue(database_url: str, engine: Engine) -> None:
    foreign = _foreign_job(engine)
    result = cli("worker", "--app", APP, "--burst", "-q", "*", url=database_url)
    assert result.exit_code == 0, result.output
    assert "unknown task 'other_app.report'" in result.stderr
    with Session(engine) as session:
        job = session.get_one(Job, foreign)
        assert job.status == "queued"
        assert (job.last_error or "").startswith("deferred")


def test_queues_sync_creates_declared_queues_with_their_settings(
    database_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "declared_app.py").write_text(
        "from sqla_queue import Registry\n"
        "registry = Registry()\n"
        "registry.declare_queue('ledger', retention='keep', max_running=2)\n"
        "@registry.task(queue='mail')\n"
        "def send() -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    diff = cli("queues", "sync", "--app", "declared_app:registry", url=database_url)
    assert diff.exit_code == 0, diff.output
    assert diff.stdout.splitlines()[:2] == ["+ ledger", "+ mail"]
    done = cli("queues", "sync", "--app", "declared_app:registry", "--yes", url=database_url)
    assert done.exit_code == 0, done.output
    with engine.connect() as connection:
        found = {q.name: (q.retention, q.max_running) for q in admin.list_queues(connection)}
    assert found["ledger"] == ("keep", 2)
    assert found["mail"] == ("delete", None)


def test_declare_queue_refuses_bad_settings_in_one_line() -> None:
    registry = Registry()
    with pytest.raises(ConfigurationError, match="retention is one of delete, keep, archive"):
        registry.declare_queue("x", retention="forever")
    with pytest.raises(ConfigurationError, match="max_running is a positive int or None"):
        registry.declare_queue("x", max_running=0)
    assert registry.queue_names() == []
