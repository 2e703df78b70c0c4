"""The checks of `sqla_queue.job.validation` raise the caller's error type: a bad queue name
given to an admin call, a queue setting or a filter is a `ConfigurationError`, the same name
given to a job is an `InvalidJobError` naming the job's task; each message has one shape,
"<what> must be <what it takes>, got <what it got>", and nothing reaches the database."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, InvalidJobError, Job, Queue, admin, enqueue
from sqla_queue.admin import partitions
from sqla_queue.admin.filters import JobFilter, search_jobs
from sqla_queue.errors import SqlaQueueError
from sqla_queue.job.validation import describe_duration, parse_duration
from sqla_queue.orm.triggers import enqueue_on_update
from sqla_queue.worker.config import WorkerConfig

BAD_NAMES = [
    ("", "queue name must be a non-empty string, got ''"),
    (
        "q" * 201,
        "queue name must be at most 200 characters (sqla_queue.limits.max_name_length), "
        "got 201 characters",
    ),
    ("a\tb", "queue name must be printable text (no tab, newline or other control characters)"),
]

ADMIN_CALLS: dict[str, Callable[[Connection, Any], object]] = {
    "create_queue": lambda conn, name: admin.create_queue(conn, name),
    "set_paused": lambda conn, name: admin.set_paused(conn, name, True),
    "set_retention": lambda conn, name: admin.set_retention(conn, name, "keep"),
    "delete_queue": lambda conn, name: admin.delete_queue(conn, name),
    "set_max_running": lambda conn, name: admin.set_max_running(conn, name, 3),
    "set_rate": lambda conn, name: admin.set_rate(conn, name, "10/s"),
    "set_result_ttl": lambda conn, name: admin.set_result_ttl(conn, name, 60),
    "set_fair": lambda conn, name: partitions.set_fair(conn, name),
    "set_partition_weight": lambda conn, name: partitions.set_partition_weight(
        conn, name, "tenant-1", 2
    ),
    "queue_depth": lambda conn, name: admin.queue_depth(conn, name),
    "list_jobs": lambda conn, name: admin.list_jobs(conn, queue=name),
    "retry_failed": lambda conn, name: admin.retry_jobs(conn, all_failed=True, queue=name),
}


def queue_names(conn: Connection) -> list[str]:
    return sorted(conn.execute(select(Queue.name)).scalars())


@pytest.mark.parametrize(("name", "message"), BAD_NAMES)
@pytest.mark.parametrize("call", ADMIN_CALLS)
def test_a_bad_queue_name_given_to_an_admin_call_is_a_configuration_error(
    engine: Engine, call: str, name: object, message: str
) -> None:
    with engine.begin() as conn:
        before = queue_names(conn)
        with pytest.raises(ConfigurationError) as refused:
            ADMIN_CALLS[call](conn, name)
        assert str(refused.value).startswith(f"The configuration is not valid: {message}")
        assert not isinstance(refused.value, InvalidJobError)
        assert "Job for task" not in str(refused.value)
        # Refused before any statement: the transaction goes on, and nothing changed.
        assert admin.create_queue(conn, "after-a-refusal") is True
        assert queue_names(conn) == sorted([*before, "after-a-refusal"])


def test_create_queue_with_an_empty_name_says_what_the_queue_name_needs(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(ConfigurationError) as refused:
        admin.create_queue(conn, "")
    assert str(refused.value) == (
        "The configuration is not valid: queue name must be a non-empty string, got ''"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"queue": ""}, "queue name must be a non-empty string, got ''"),
        ({"task": "t" * 201}, "task name must be at most 200 characters"),
        ({"tag": ["ok", "a\nb"]}, "tag must be printable text"),
        ({"workflow_id": ""}, "workflow_id must be a non-empty string, got ''"),
        ({"about": "no-colon"}, "about must be a mapped instance or '<table>:<key>' text"),
    ],
)
def test_a_bad_filter_is_a_configuration_error_as_its_docstring_says(
    engine: Engine, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        JobFilter(**fields)
    assert f"The configuration is not valid: {message}" in str(refused.value)
    assert not isinstance(refused.value, InvalidJobError)
    # A good filter of the same field searches the real table (and finds nothing).
    good: dict[str, Any] = {key: "orders:1" if key == "about" else "ok" for key in fields}
    with engine.connect() as conn:
        assert search_jobs(conn, JobFilter(**good)) == []


@pytest.mark.parametrize(("name", "message"), BAD_NAMES)
def test_the_same_bad_name_given_to_a_job_is_an_invalid_job_error_naming_its_task(
    engine: Engine, name: str, message: str
) -> None:
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidJobError) as refused:
            enqueue(session, "emails.send", {}, queue=name)
        assert str(refused.value).startswith(f"Job for task 'emails.send' is not valid: {message}")
        enqueue(session, "emails.send", {})  # the transaction goes on
    with Session(engine) as session:
        assert session.scalars(select(Job.queue)).all() == ["default"]


def test_a_bad_partition_key_is_refused_alike_by_enqueue_and_by_queue_settings(
    engine: Engine,
) -> None:
    with engine.begin() as conn, pytest.raises(ConfigurationError) as setting:
        partitions.set_partition_weight(conn, "default", "a\tb", 2)
    with Session(engine) as session, pytest.raises(InvalidJobError) as job:
        enqueue(session, "t", {}, partition="a\tb")
    detail = "partition must be printable text"
    assert f"The configuration is not valid: {detail}" in str(setting.value)
    assert f"Job for task 't' is not valid: {detail}" in str(job.value)


def test_a_worker_given_a_bad_queue_name_is_misconfigured() -> None:
    with pytest.raises(ConfigurationError) as refused:
        WorkerConfig(queues=["emails", "a\nb"])
    assert "queues: queue name must be printable text" in str(refused.value)


def test_a_trigger_given_a_bad_task_or_queue_name_is_misconfigured() -> None:
    with pytest.raises(ConfigurationError, match="task name must be at most 200 characters"):
        enqueue_on_update("orders", ["id"], "status", "paid", "t" * 201)
    with pytest.raises(ConfigurationError, match="queue name must be at most 200 characters"):
        enqueue_on_update("orders", ["id"], "status", "paid", "shop.receipt", "q" * 201)


def test_every_refusal_is_an_sqla_queue_error_with_one_line() -> None:
    for name, _message in BAD_NAMES:
        with pytest.raises(SqlaQueueError) as refused:
            JobFilter(queue=name)
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("seconds", [1.5, 30.0, 60.0, 90.0, 300.0, 5400.0, 86400.0, 604800.0])
def test_describe_duration_writes_what_parse_duration_reads_back(seconds: float) -> None:
    assert parse_duration(describe_duration(seconds)) == seconds
