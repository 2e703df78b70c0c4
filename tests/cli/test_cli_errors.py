"""Bad values on the command line: each a one-line error naming the problem, no traceback."""

from __future__ import annotations

import pytest
from helpers.support import cli, enqueue_jobs, jobs_by_id
from sqlalchemy import Engine, text

from sqla_queue import admin
from sqla_queue.admin import partitions


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("enqueue", "t", "--args", '{"x": NaN}'), "NaN is not JSON"),
        (("enqueue", "t", "--delay", "99999999999999999999"), "from 0 to 3155760000 s"),
        (("enqueue", "t", "--delay", "1e20"), "'1e20' is not a duration"),
        (("migrate", "--revision", "bogus"), "migration failed"),
        (("migrate", "--lock-timeout", "0"), "from 0.001 to 3600 s"),
        (("migrate", "--lock-retries", "99999999999"), "a whole number from 0 to 10000"),
    ],
)
def test_cli_bad_values_are_one_line_errors(
    database_url: str, args: tuple[str, ...], fragment: str
) -> None:
    result = cli(*args, url=database_url, catch=True)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert fragment in result.output


NO_JOB_HAS_IT = [
    (("enqueue", "t", "--after", "99999999999999999999"), "'--after': must be a job id"),
    (("enqueue", "t", "--args", '{"a": "\\u0000"}'), "--args: args contain a NUL"),
    (("jobs", "list", "--args", '{"a": "\\u0000"}'), "--args: args contain a NUL"),
    (("jobs", "retry", "--args", '{"a": "\\ud800"}', "-y"), "--args: args contain a lone"),
    (("jobs", "retry", "--args-path", "a", "--args-value", '"\\u0000"', "-y"), "--args-value"),
    (
        ("jobs", "cancel", "--args-path", "a", "--args-value", "[" * 5000 + "]" * 5000, "-y"),
        "--args-value: args value is nested too deeply",
    ),
    (
        ("jobs", "delete", "--args-path", "a", "--args-value", "[" * 150 + "]" * 150, "-y"),
        "--args-value: args are nested more than 100 levels",
    ),
    (("jobs", "list", "--args-path", "a..b", "--args-value", "1"), "--args-path: args path"),
    (
        ("queues", "weight", "fair", "x" * 100_000, "2"),
        "'PARTITION': partition must be at most 200 characters",
    ),
    (("queues", "weight", "fair", "a\tb", "2"), "'PARTITION': partition must be printable"),
    (
        ("queues", "weight", "fair", "", "--clear"),
        "'PARTITION': partition must be a non-empty string",
    ),
]


@pytest.mark.parametrize(("args", "fragment"), NO_JOB_HAS_IT)
def test_a_value_no_job_can_have_is_a_usage_error_naming_the_option_and_loses_no_job(
    database_url: str, engine: Engine, args: tuple[str, ...], fragment: str
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "fair")
        partitions.set_fair(conn, "fair")
    ids = enqueue_jobs(engine, "t", 3, args={"a": 1})
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'failed' WHERE id = :id"), {"id": ids[0]}
        )
    before = jobs_by_id(engine)
    result = cli(*args, url=database_url, catch=True)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    assert fragment in errors[0]
    assert "database error" not in result.output
    after = jobs_by_id(engine)
    assert {i: j.status for i, j in after.items()} == {i: j.status for i, j in before.items()}
    with engine.connect() as conn:
        assert partitions.partition_weights(conn) == {}
