"""`sqla-queue`: enqueue, queues, stats, prune, cancel, worker, signals, bad input, embedded."""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.support import (
    count_where,
    create_task_log,
    dispose_engines,
    enqueue_jobs,
    jobs_by_id,
    start_worker_process,
    task_log,
    wait_for,
)
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text

from sqla_queue import admin
from sqla_queue.cli import main


@pytest.fixture(autouse=True)
def _restore_logging_and_engines() -> Iterator[None]:
    """`sqla-queue worker` configures the root logger: give the next test its own back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    dispose_engines()


def cli(*args: str, url: str | None = None, **env: str | None) -> Result:
    """Run `sqla-queue ARGS` in-process, with SQLA_QUEUE_DATABASE_URL set to `url`."""
    environment = {"SQLA_QUEUE_DATABASE_URL": url, **env}
    return CliRunner().invoke(main, list(args), env=environment, catch_exceptions=False)


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Failed with a non-zero exit status and one line on stderr, no traceback."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- enqueue -----------------------------------------------------------------------------------


def test_enqueue_commits_a_job_and_prints_its_id(database_url: str, engine: Engine) -> None:
    result = cli(
        "enqueue",
        "emails.send",
        "--args",
        '{"to": "a@b.c"}',
        "--priority",
        "3",
        "--delay",
        "60",
        "--max-attempts",
        "2",
        url=database_url,
    )
    assert result.exit_code == 0, result.output
    job = jobs_by_id(engine)[int(result.stdout.strip())]
    assert (job.task, job.args, job.queue, job.priority, job.max_attempts) == (
        "emails.send",
        {"to": "a@b.c"},
        "default",
        3,
        2,
    )
    assert count_where(engine, "run_at > now() + interval '50 seconds'") == 1


def test_enqueue_with_args_that_are_not_json_says_so(database_url: str, engine: Engine) -> None:
    result = cli("enqueue", "t", "--args", "{to: nobody}", url=database_url)
    assert result.exit_code == 2
    assert "--args" in result.stderr
    assert "not valid JSON" in result.stderr
    assert "Traceback" not in result.output
    assert count_where(engine, "true") == 0


def test_enqueue_into_an_unknown_queue_names_the_command_that_creates_it(
    database_url: str, engine: Engine
) -> None:
    result = cli("enqueue", "t", "--queue", "nope", url=database_url)
    assert_one_line_error(result, "'nope'", "sqla-queue queues create nope")
    assert count_where(engine, "true") == 0


# -- queues, stats, prune, cancel --------------------------------------------------------------


def test_queues_create_list_pause_resume_delete(database_url: str, engine: Engine) -> None:
    assert cli("queues", "create", "emails", "--retention", "keep", url=database_url).exit_code == 0
    assert "created" in cli("queues", "create", "reports", url=database_url).stdout
    assert cli("queues", "pause", "reports", url=database_url).exit_code == 0

    listed = cli("queues", "list", url=database_url).stdout.splitlines()
    assert listed == [
        "default\tactive\tretention=delete",
        "emails\tactive\tretention=keep",
        "reports\tpaused\tretention=delete",
    ]

    assert cli("queues", "resume", "reports", url=database_url).exit_code == 0
    assert "reports\tactive" in cli("queues", "list", url=database_url).stdout

    enqueue_jobs(engine, "t", 2, queue="emails")
    refused = cli("queues", "delete", "emails", url=database_url)
    assert_one_line_error(refused, "2 queued or running", "--force")
    forced = cli("queues", "delete", "emails", "--force", url=database_url)
    assert forced.exit_code == 0, forced.output
    assert "2 job(s) deleted" in forced.stdout
    assert "emails" not in cli("queues", "list", url=database_url).stdout

    assert_one_line_error(cli("queues", "pause", "ghost", url=database_url), "'ghost'")


def test_stats_json_counts_jobs_per_queue_and_status(database_url: str, engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "emails")
    enqueue_jobs(engine, "t", 3, queue="emails")
    enqueue_jobs(engine, "t", 1, delay=3600)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET run_at = now() - interval '90 seconds'"
                " WHERE queue = 'emails'"
            )
        )

    result = cli("stats", "--json", url=database_url)

    assert result.exit_code == 0, result.output
    rows = {row["queue"]: row for row in json.loads(result.stdout)}
    assert rows["emails"]["queued"] == 3
    assert 89 < rows["emails"]["oldest_due_age_seconds"] < 150
    assert rows["default"]["queued"] == 1
    assert rows["default"]["oldest_due_age_seconds"] is None  # not due yet
    table = cli("stats", url=database_url)
    assert table.exit_code == 0
    assert "emails" in table.stdout


def test_prune_deletes_finished_jobs_older_than_the_cutoff(
    database_url: str, engine: Engine
) -> None:
    enqueue_jobs(engine, "t", 3)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'done', finished_at = now() - "
                "CASE WHEN id % 3 = 0 THEN interval '1 hour' ELSE interval '3 days' END"
            )
        )
    result = cli("prune", "--older-than", "2d", url=database_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "pruned 2 job(s)"
    assert count_where(engine, "true") == 1
    assert_one_line_error(
        cli("prune", "--older-than", "1d", "--status", "queued", url=database_url),
        "can only prune finished statuses",
    )


def test_jobs_cancel_cancels_queued_jobs_and_reports_the_rest(
    database_url: str, engine: Engine
) -> None:
    first, second = enqueue_jobs(engine, "t", 2)
    result = cli("jobs", "cancel", str(first), "999999", url=database_url)
    assert result.exit_code == 1
    assert f"job {first}: cancelled (was queued)" in result.stdout
    assert "job 999999: not cancelled" in result.stdout
    statuses = {job.id: job.status for job in jobs_by_id(engine).values()}
    assert statuses == {first: "cancelled", second: "queued"}


# -- worker --------------------------------------------------------------------------------


def test_worker_burst_runs_the_jobs_then_exits(database_url: str, engine: Engine) -> None:
    create_task_log(engine)
    ids = enqueue_jobs(engine, "record", 5)
    result = cli("worker", "--app", "apps.tasks:registry", "--burst", "-c", "2", url=database_url)
    assert result.exit_code == 0, result.output
    assert "done: 5 succeeded, 0 retried, 0 failed" in result.stderr
    assert sorted(job_id for job_id, _ in task_log(engine)) == ids


@pytest.mark.slow
@pytest.mark.parametrize(("signals", "shutdown_timeout"), [(1, "0.5"), (2, "60")])
def test_sigterm_returns_unfinished_jobs_to_queued(
    database_url: str, engine: Engine, signals: int, shutdown_timeout: str
) -> None:
    """One SIGTERM: running jobs get the shutdown timeout, then go back to `queued`.
    A second one exits at once, far sooner than a 60 s timeout, and still requeues them."""
    create_task_log(engine)
    ids = enqueue_jobs(engine, "linger", 4, args={"seconds": 30})
    worker = start_worker_process(database_url, "-c", "2", "--shutdown-timeout", shutdown_timeout)
    try:
        wait_for(lambda: len(task_log(engine)) == 2, timeout=20)
        for _ in range(signals):
            worker.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # two signals at once would arrive as one
        _, stderr = worker.communicate(timeout=15)
    finally:
        worker.kill()
    assert (worker.returncode == 0) == (signals == 1), stderr
    assert "Traceback" not in stderr
    jobs = jobs_by_id(engine, ids)
    assert {(job.status, job.locked_by) for job in jobs.values()} == {("queued", None)}
    # Interrupted jobs keep their attempt; claimed but unstarted ones get theirs back.
    started = {job_id for job_id, _ in task_log(engine)}
    assert {job.id for job in jobs.values() if job.attempts == 1} == started
    assert sorted(job.attempts for job in jobs.values()) == [0, 0, 1, 1]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["worker", "--app", "apps.tasks:registry", "--burst"],
        ["enqueue", "t"],
        ["queues", "list"],
        ["stats"],
        ["prune", "--older-than", "1d"],
        ["jobs", "cancel", "1"],
    ],
    ids=lambda command: command[0],
)
def test_commands_refuse_a_database_without_the_schema(
    empty_database_url: str, command: list[str]
) -> None:
    result = cli(*command, url=empty_database_url)
    assert_one_line_error(result, "sqla-queue migrate")


@pytest.mark.parametrize("command", [["worker", "--app", "apps.tasks:registry"], ["stats"]])
def test_commands_refuse_an_older_schema_revision(
    database_url: str, engine: Engine, command: list[str]
) -> None:
    with engine.begin() as conn:
        conn.execute(text("COMMENT ON SCHEMA sqla_queue IS 'sqla_queue revision sqlaq_0000'"))
    result = cli(*command, url=database_url)
    assert_one_line_error(result, "older revision of it (sqlaq_0000)", "sqla-queue migrate")


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("no_such_package.tasks:registry", "no module named 'no_such_package'"),
        ("apps.tasks", "expected 'package.module:registry'"),
        ("apps.tasks:missing", "has no attribute 'missing'"),
        ("apps.tasks:record", "not a sqla_queue.Registry"),
    ],
)
def test_worker_with_a_bad_app_path_says_what_is_wrong(
    database_url: str, app: str, message: str
) -> None:
    result = cli("worker", "--app", app, "--burst", url=database_url)
    assert_one_line_error(result, repr(app), message)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["-c", "-1"], "concurrency must be at least 1, got -1"),
        (["--batch", "0"], "batch must be at least 1"),
        (["--lease", "0"], "lease must be positive"),
        (["-q", ","], "the queue list is empty"),
    ],
)
def test_worker_with_a_bad_setting_says_what_is_wrong(
    database_url: str, option: list[str], message: str
) -> None:
    result = cli("worker", "--app", "apps.tasks:registry", "--burst", *option, url=database_url)
    assert_one_line_error(result, message)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "is not a database URL"),
        ("mysql://user@localhost/db", "needs PostgreSQL"),
        ("postgresql://postgres@127.0.0.1:5432/sqlaq_no_such_db", "does not exist"),
        ("postgresql://postgres@127.0.0.1:1/db", "cannot use the database"),
    ],
)
@pytest.mark.parametrize("command", [["migrate"], ["stats"]], ids=lambda c: c[0])
def test_bad_database_url_gives_one_line_and_a_non_zero_exit(
    url: str, message: str, command: list[str]
) -> None:
    assert_one_line_error(cli(*command, "--database-url", url), message)


def test_worker_with_a_database_that_does_not_exist_exits_with_one_line() -> None:
    result = cli(
        "worker",
        "--app",
        "apps.tasks:registry",
        "--database-url",
        "postgresql://postgres@127.0.0.1:5432/sqlaq_no_such_db",
    )
    assert_one_line_error(result, "does not exist")


# -- the embedded default ------------------------------------------------------------------


def test_without_a_url_the_cli_uses_an_embedded_postgres(tmp_path: Path) -> None:
    pytest.importorskip("pgserver")
    from sqla_queue import database

    data_dir = tmp_path / "pgdata"
    try:
        result = cli("migrate", url=None, SQLA_QUEUE_EMBEDDED_DIR=str(data_dir))
        assert result.exit_code == 0, result.output
        assert "using the embedded PostgreSQL at" in result.stderr
        assert "sqla_queue schema at revision sqlaq_0004" in result.stdout
        assert (data_dir / "PG_VERSION").exists()
        listed = cli("queues", "list", url=None, SQLA_QUEUE_EMBEDDED_DIR=str(data_dir))
        assert listed.stdout.startswith("default\tactive")
        stopped = cli("embedded", "stop", url=None, SQLA_QUEUE_EMBEDDED_DIR=str(data_dir))
        assert stopped.stdout.strip() == "stopped"
        assert not (data_dir / "postmaster.pid").exists()
    finally:
        database.stop_embedded(data_dir)
