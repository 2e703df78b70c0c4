"""Every number, duration, rate, id and name the CLI and the Python API take, fuzzed with
huge, negative, NaN, infinite, empty, unicode and surrogate values: the outcome is a result
or one clear line (exit 1, or 2 for usage), never a traceback or a database error.

The profile (tests/conftest.py) sets the examples per test: a few by default, many with
SQLA_QUEUE_HYPOTHESIS_PROFILE=long. Every example of one test runs against its database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import example, given
from hypothesis import strategies as st
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import Registry, SqlaQueueError, admin, enqueue
from sqla_queue.cli import main
from sqla_queue.worker import WorkerConfig

FORBIDDEN = ("Traceback", "out of range", "psycopg", "sqlalchemy", "database error")
"""Text no outcome may show: a traceback, or a database error passed on as it came."""

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
odd_text = st.text(
    st.characters(exclude_categories=[]) | surrogates, max_size=12
)  # control characters, NUL, unicode, lone surrogates
huge = st.integers(min_value=2**31 - 2, max_value=2**80) | st.integers(-(2**80), -1)
integer = st.integers(-3, 12) | huge
special = st.sampled_from(
    [
        "",
        " ",
        "0",
        "-0",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "Infinity",
        "1e999",
        "-1e999",
        "1e-400",
        "0x10",
        "1_000",
        "1.5",
        "-1.5s",
        "١٢",
        "\uff19",
        "99999999999999w",
        "99999999999999999999",
        "9" * 400,
        "1/0s",
        "1/99999999999999w",
        "99999999999/s",
        "\ud800",
        "\udcff",
        "🚀",
        "ü",
        "\x00",
    ]
)
value = integer.map(str) | st.floats().map(repr) | special | odd_text
"""What a user might type where a number, duration, rate or id goes."""
name = (
    odd_text
    | st.sampled_from(["", "default", "x" * 201, "tab\there", "\ud800", "é" * 200])
    | st.text(min_size=190, max_size=210)
)
"""What a user might type where a queue, task or tag name goes."""


def invoke(url: str, args: list[str]) -> Result:
    return CliRunner().invoke(main, args, env={"SQLA_QUEUE_DATABASE_URL": url})


def assert_clean(result: Result, args: list[str]) -> None:
    """A result, or one clear line: no traceback, no raw database error."""
    shown = f"{args!r} -> exit {result.exit_code}:\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{shown}\n{result.exception!r}"
    )
    assert result.exit_code in (0, 1, 2), shown
    for text_ in FORBIDDEN:
        assert text_ not in result.output, shown
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) <= 1, shown
    if result.exit_code == 2:
        assert len(errors) == 1, shown


# -- the CLI -----------------------------------------------------------------------------------

VALUED_OPTIONS: list[tuple[list[str], str]] = [
    (["enqueue", "t"], "--priority"),
    (["enqueue", "t"], "--delay"),
    (["enqueue", "t"], "--max-attempts"),
    (["queues", "create", "fuzz"], "--max-running"),
    (["queues", "create", "fuzz"], "--rate"),
    (["queues", "create", "fuzz"], "--result-ttl"),
    (["queues", "set", "default"], "--max-running"),
    (["queues", "set", "default"], "--rate"),
    (["queues", "set", "default"], "--result-ttl"),
    (["prune"], "--older-than"),
    (["jobs", "retry", "1"], "--attempts"),
    (["jobs", "list"], "--limit"),
    (["jobs", "list"], "--before"),
    (["relay"], "--batch"),
    (["relay"], "--poll-interval"),
    (["relay"], "--publish-timeout"),
    (["relay"], "--duplicate-window"),
    (["doctor", "--sample", "0"], "--stuck-after"),
    (["doctor", "--sample", "0"], "--backlog-threshold"),
    (["doctor", "--sample", "0"], "--long-transaction"),
    (["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only"], "-c"),
    (["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only"], "--batch"),
    (["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only"], "--max-batch"),
    (["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only"], "--lease"),
    (
        ["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only"],
        "--poll-interval",
    ),
    (
        ["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only"],
        "--shutdown-timeout",
    ),
    (
        ["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only"],
        "--give-up-after",
    ),
]


@pytest.mark.parametrize(
    ("command", "option"), VALUED_OPTIONS, ids=[" ".join(c[:2]) + o for c, o in VALUED_OPTIONS]
)
@given(given_value=value)
@example(given_value="99999999999999w")
@example(given_value="99999999999")
@example(given_value="-1")
def test_every_numeric_option_gives_a_result_or_one_clear_line(
    database_url: str, command: list[str], option: str, given_value: str
) -> None:
    args = [*command, option, given_value]
    assert_clean(invoke(database_url, args), args)


ID_COMMANDS = [["jobs", "cancel"], ["jobs", "show"], ["jobs", "retry"], ["jobs", "delete"]]


@pytest.mark.parametrize("command", ID_COMMANDS, ids=[" ".join(c) for c in ID_COMMANDS])
@given(given_value=value)
@example(given_value="99999999999999999999")
@example(given_value="0")
def test_every_job_id_argument_gives_a_result_or_one_clear_line(
    database_url: str, command: list[str], given_value: str
) -> None:
    args = [*command, given_value]
    assert_clean(invoke(database_url, args), args)


NAMED = [
    ["enqueue", "{}"],
    ["enqueue", "t", "--queue", "{}"],
    ["enqueue", "t", "--tag", "{}"],
    ["queues", "create", "{}"],
    ["queues", "pause", "{}"],
    ["queues", "delete", "{}"],
    ["jobs", "list", "--queue", "{}"],
    ["jobs", "list", "--task", "{}"],
    ["jobs", "list", "--tag", "{}"],
    ["jobs", "retry", "--failed", "--queue", "{}"],
    ["prune", "--older-than", "1d", "--status", "{}"],
    ["queues", "set", "{}", "--max-running", "2"],
    ["queues", "resume", "{}"],
    ["queues", "weight", "default", "{}", "2"],
    ["worker", "--app", "helpers.apps.tasks:registry", "--burst", "--poll-only", "-q", "{}"],
]


@pytest.mark.parametrize("template", NAMED, ids=[" ".join(t) for t in NAMED])
@given(given_name=name)
@example(given_name="\ud800")
def test_every_name_gives_a_result_or_one_clear_line(
    database_url: str, template: list[str], given_name: str
) -> None:
    args = [given_name if part == "{}" else part for part in template]
    assert_clean(invoke(database_url, args), args)


@given(given_value=value)
@example(given_value="99999")
@example(given_value="\u0661\u0662")  # Arabic-Indic 12: int() takes it, a port must not
@example(given_value="1_2")
def test_a_port_outside_1_to_65535_is_one_clear_line(database_url: str, given_value: str) -> None:
    # Only ports no server can listen on: a valid one would start the dashboard.
    if re.fullmatch(r"\s*[-+]?[0-9]+\s*", given_value) and 1 <= int(given_value) <= 65535:
        given_value = str(int(given_value) + 65536)
    args = ["dashboard", "--port", given_value]
    result = invoke(database_url, args)
    assert_clean(result, args)
    assert result.exit_code == 2


@given(
    args_json=st.sampled_from(
        ['{"a": 1e999}', '{"a": -1e400}', '{"a": NaN}', '{"a": Infinity}', "[" * 100_000]
    )
    | odd_text
)
def test_enqueue_args_that_are_not_storable_json_are_one_clear_line(
    database_url: str, args_json: str
) -> None:
    args = ["enqueue", "t", "--args", args_json]
    assert_clean(invoke(database_url, args), args)


# -- the Python API ----------------------------------------------------------------------------

number = (
    st.integers(-(2**80), 2**80)
    | huge
    | st.floats()
    | st.booleans()
    | st.none()
    | st.text(max_size=4)
    | st.timedeltas()
    | st.sampled_from([2**31 - 1, 2**31, 2**63, -(2**63), 1e300, float("nan"), float("inf")])
)
"""What a caller might pass where a number or a duration goes."""


def settle(engine: Engine, call: Callable[[Any], object]) -> None:
    """Run `call` on a connection, rolled back after: a result or our own error, nothing else."""
    with engine.connect() as conn:
        try:
            call(conn)
        except SqlaQueueError:
            pass
        finally:
            conn.rollback()


ADMIN_CALLS: dict[str, Callable[[Any, Any], object]] = {
    "set_result_ttl": lambda conn, x: admin.set_result_ttl(conn, "default", x),
    "set_max_running": lambda conn, x: admin.set_max_running(conn, "default", x),
    "set_rate": lambda conn, x: admin.set_rate(conn, "default", x),
    "set_rate(count, 1)": lambda conn, x: admin.set_rate(conn, "default", (x, 1.0)),
    "set_rate(1, window)": lambda conn, x: admin.set_rate(conn, "default", (1, x)),
    "prune": lambda conn, x: admin.prune(conn, x),
    "retry_jobs(attempts)": lambda conn, x: admin.retry_jobs(conn, all_failed=True, attempts=x),
    "retry_jobs(ids)": lambda conn, x: admin.retry_jobs(conn, [x]),
    "cancel_jobs": lambda conn, x: admin.cancel_jobs(conn, [x]),
    "delete_jobs": lambda conn, x: admin.delete_jobs(conn, [x]),
    "job_statuses": lambda conn, x: admin.job_statuses(conn, [x]),
    "get_job": lambda conn, x: admin.get_job(conn, x),
    "list_jobs(limit)": lambda conn, x: admin.list_jobs(conn, limit=x),
    "list_jobs(before)": lambda conn, x: admin.list_jobs(conn, before=x),
    "queue_depth": lambda conn, x: admin.queue_depth(conn, "default", x),
}


@pytest.mark.parametrize("call", sorted(ADMIN_CALLS))
@given(given=number)
@example(given=99999999999999 * 604800)
@example(given=2**63)
def test_admin_numbers_give_a_result_or_our_own_error(
    engine: Engine, call: str, given: Any
) -> None:
    settle(engine, lambda conn: ADMIN_CALLS[call](conn, given))


@pytest.mark.parametrize("field", ["priority", "delay", "max_attempts"])
@given(given=number)
@example(given=2**31)
@example(given=dt.timedelta.max)
def test_enqueue_numbers_give_a_job_or_an_invalid_job_error(
    engine: Engine, field: str, given: Any
) -> None:
    with Session(engine) as session:
        try:
            enqueue(session, "t", {}, **{field: given})
            session.flush()
        except SqlaQueueError:
            pass
        finally:
            session.rollback()


WORKER_FIELDS = [
    "concurrency",
    "batch",
    "max_batch",
    "lease",
    "poll_interval",
    "shutdown_timeout",
    "heartbeat",
    "dead_after",
    "give_up_after",
    "vacuum_threshold",
]


@pytest.mark.parametrize("field", WORKER_FIELDS)
@given(given=number)
@example(given=2**31)
def test_worker_config_numbers_are_taken_or_a_configuration_error(field: str, given: Any) -> None:
    with contextlib.suppress(SqlaQueueError):
        WorkerConfig(**{field: given})


@pytest.mark.parametrize("field", ["max_attempts", "timeout", "lease", "priority"])
@given(given=number)
def test_task_numbers_are_taken_or_a_configuration_error(field: str, given: Any) -> None:
    with contextlib.suppress(SqlaQueueError):
        Registry().task(name="t", **{field: given})(lambda: None)
