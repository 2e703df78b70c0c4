"""`sqla_queue.admin` job functions and `sqla-queue jobs list/show/retry/delete` (issue 9)."""

from __future__ import annotations

import functools
import json
import threading

import pytest
from helpers import support
from helpers.support import cli, enqueue_jobs, jobs_by_id
from sqlalchemy import Engine, text

from sqla_queue import admin
from sqla_queue.db import queries
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.validation import MAX_ATTEMPTS

TRACEBACK = "Traceback (most recent call last):\n  boom"
set_status = functools.partial(support.set_status, attempts=5, max_attempts=5, error=TRACEBACK)
"""This file's jobs as a worker leaves them: five attempts of five by default, a traceback."""


def test_list_jobs_filters_by_queue_task_and_status_newest_first(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail")
    a = enqueue_jobs(engine, "app.a", 3)
    b = enqueue_jobs(engine, "app.b", 2, queue="mail")
    set_status(engine, a[:1], "failed")
    with engine.connect() as conn:
        every = admin.list_jobs(conn)
        assert [j.id for j in every] == sorted(a + b, reverse=True)
        assert [j.id for j in admin.list_jobs(conn, queue="mail")] == sorted(b, reverse=True)
        assert [j.id for j in admin.list_jobs(conn, task="app.a")] == sorted(a, reverse=True)
        failed = admin.list_jobs(conn, status="failed")
        assert [(j.id, j.status, j.attempts) for j in failed] == [(a[0], "failed", 5)]
        assert admin.list_jobs(conn, task="app.a", queue="mail") == []


def test_list_jobs_pages_by_id_without_gaps_or_repeats(engine: Engine) -> None:
    ids = enqueue_jobs(engine, "app.a", 23)
    seen: list[int] = []
    before = None
    with engine.connect() as conn:
        while True:
            page = admin.list_jobs(conn, limit=5, before=before)
            if not page:
                break
            assert len(page) <= 5
            seen += [j.id for j in page]
            before = page[-1].id
    assert seen == sorted(ids, reverse=True)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"status": "finished"}, "status 'finished' is not one of: queued"),
        ({"limit": 0}, "limit must be an int from 1 to 1000"),
        ({"limit": 5000}, "limit must be an int from 1 to 1000"),
        ({"before": -3}, "job id must be a whole number from 1 to 9223372036854775807, got -3"),
    ],
)
def test_list_jobs_refuses_bad_filters_by_name(
    engine: Engine, kwargs: dict[str, object], fragment: str
) -> None:
    with engine.connect() as conn, pytest.raises(ConfigurationError, match=fragment):
        admin.list_jobs(conn, **kwargs)  # type: ignore[arg-type]


def test_get_job_shows_args_last_error_and_timings_also_of_an_archived_job(
    engine: Engine,
) -> None:
    (job_id,) = enqueue_jobs(engine, "app.a", 1, args={"order": 7})
    set_status(engine, [job_id], "failed")
    with engine.connect() as conn:
        job = admin.get_job(conn, job_id)
        assert job is not None
        assert (job.args, job.status, job.attempts, job.archived) == (
            {"order": 7},
            "failed",
            5,
            False,
        )
        assert job.last_error is not None
        assert "Traceback" in job.last_error
        assert job.finished_at is not None
        assert job.created_at <= job.finished_at
        assert admin.get_job(conn, job_id + 1000) is None
    with engine.begin() as conn:
        conn.execute(
            text(
                "WITH moved AS (DELETE FROM sqla_queue.jobs WHERE id = :id RETURNING *) "
                "INSERT INTO sqla_queue.jobs_history (id, queue, task, args, status, priority, "
                "run_at, attempts, max_attempts, created_at, finished_at) SELECT id, queue, "
                "task, args, 'done', priority, run_at, attempts, max_attempts, created_at, now() "
                "FROM moved"
            ),
            {"id": job_id},
        )
    with engine.connect() as conn:
        archived = admin.get_job(conn, job_id)
    assert archived is not None
    assert (archived.archived, archived.status) == (True, "done")
    assert archived.lease_expires_at is None


def test_retry_gives_failed_and_cancelled_jobs_a_fresh_budget_and_keeps_the_attempt_number(
    engine: Engine,
) -> None:
    ids = enqueue_jobs(engine, "app.a", 5)
    set_status(engine, ids[0:1], "failed")
    set_status(engine, ids[1:2], "cancelled", attempts=2)
    set_status(engine, ids[2:3], "running", attempts=1)
    set_status(engine, ids[3:4], "done", attempts=1)
    with engine.begin() as conn:
        retried = admin.retry_jobs(conn, ids)
    assert retried == {ids[0]: "failed", ids[1]: "cancelled"}
    rows = jobs_by_id(engine, ids)
    # The attempt number is the fencing token a late worker is held to: it keeps counting.
    assert (rows[ids[0]].status, rows[ids[0]].attempts, rows[ids[0]].max_attempts) == (
        "queued",
        5,
        10,
    )
    assert (rows[ids[1]].status, rows[ids[1]].attempts, rows[ids[1]].max_attempts) == (
        "queued",
        2,
        7,
    )
    assert rows[ids[0]].finished_at is None
    assert rows[ids[0]].locked_by is None
    assert [rows[i].status for i in ids[2:]] == ["running", "done", "queued"]
    with engine.begin() as conn:
        set_status(engine, ids[0:1], "failed", attempts=10)
        assert admin.retry_jobs(conn, ids[0:1], attempts=1) == {ids[0]: "failed"}
    assert jobs_by_id(engine, ids[0:1])[ids[0]].max_attempts == 11


def test_retry_all_failed_of_one_queue_leaves_other_queues_and_cancelled_jobs(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail")
    mail = enqueue_jobs(engine, "app.a", 3, queue="mail")
    other = enqueue_jobs(engine, "app.a", 2)
    set_status(engine, mail[:2] + other, "failed")
    set_status(engine, mail[2:], "cancelled")
    with engine.begin() as conn:
        assert set(admin.retry_jobs(conn, all_failed=True, queue="mail")) == set(mail[:2])
    statuses = {i: j.status for i, j in jobs_by_id(engine).items()}
    assert [statuses[i] for i in mail] == ["queued", "queued", "cancelled"]
    assert [statuses[i] for i in other] == ["failed", "failed"]
    with engine.begin() as conn:
        assert set(admin.retry_jobs(conn, all_failed=True)) == set(other)


def test_retry_is_fenced_against_a_concurrent_change(engine: Engine) -> None:
    (job_id,) = enqueue_jobs(engine, "app.a", 1)
    set_status(engine, [job_id], "failed")
    result: dict[int, str] = {}
    with engine.connect() as first:
        first.begin()
        assert admin.retry_jobs(first, [job_id]) == {job_id: "failed"}

        def second_retry() -> None:
            with engine.begin() as second:
                result.update(admin.retry_jobs(second, [job_id]))

        thread = threading.Thread(target=second_retry)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # waiting on the first one's row lock
        first.commit()
    thread.join(60)
    assert result == {}  # the row it waited for is queued now: left alone
    assert jobs_by_id(engine, [job_id])[job_id].max_attempts == 10  # one budget, not two


@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        ((), {}, "pass job ids or all_failed=True"),
        (([1],), {"all_failed": True}, "pass job ids or all_failed=True"),
        (([1],), {"queue": "mail"}, "queue= filters all_failed=True only"),
        (([1],), {"attempts": 0}, "attempts must be a whole number from 1 to 1000000"),
        ((["7"],), {}, "job id must be a whole number from 1 to 9223372036854775807, got '7'"),
    ],
)
def test_retry_refuses_bad_input_by_name(
    engine: Engine, args: tuple[object, ...], kwargs: dict[str, object], fragment: str
) -> None:
    with engine.begin() as conn, pytest.raises(ConfigurationError, match=fragment):
        admin.retry_jobs(conn, *args, **kwargs)  # type: ignore[arg-type]


def test_delete_jobs_deletes_all_but_running_ones(engine: Engine) -> None:
    ids = enqueue_jobs(engine, "app.a", 3)
    set_status(engine, ids[:1], "running", attempts=1)
    set_status(engine, ids[1:2], "failed")
    with engine.begin() as conn:
        assert admin.delete_jobs(conn, ids) == {ids[1]: "failed", ids[2]: "queued"}
    assert list(jobs_by_id(engine)) == ids[:1]


def test_queue_depth_counts_due_scheduled_and_running_of_one_queue_up_to_the_cap(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail")
    due = enqueue_jobs(engine, "app.a", 7, queue="mail")
    enqueue_jobs(engine, "app.a", 3, queue="mail", delay=3600)
    enqueue_jobs(engine, "app.a", 4)
    set_status(engine, due[:2], "running", attempts=1)
    with engine.connect() as conn:
        depth = admin.queue_depth(conn, "mail")
        assert (depth.due, depth.scheduled, depth.running, depth.capped) == (5, 3, 2, False)
        capped = admin.queue_depth(conn, "mail", cap=4)
        assert (capped.due, capped.scheduled, capped.capped) == (4, 3, True)
        assert admin.queue_depth(conn, "nothing-here").due == 0
        compiled = queries.queue_depth().compile(dialect=conn.dialect)
        params = {**compiled.params, "queue": "mail", "cap": 10}
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", params).scalars())
    assert "ix_jobs_claim" in plan, plan


def test_cli_jobs_list_json_show_retry_and_delete(database_url: str, engine: Engine) -> None:
    ids = enqueue_jobs(engine, "app.a", 3, args={"n": 1})
    set_status(engine, ids[:1], "failed")
    listed = cli("jobs", "list", "--json", "--status", "failed", url=database_url)
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert {"id", "task", "queue", "status", "attempts", "run_at"} <= set(row)
    assert (row["id"], row["status"], row["attempts"]) == (ids[0], "failed", 5)
    shown = cli("jobs", "show", str(ids[0]), url=database_url)
    assert shown.exit_code == 0
    assert "Traceback" in shown.stdout
    assert '"n": 1' in shown.stdout
    as_json = json.loads(cli("jobs", "show", "--json", str(ids[0]), url=database_url).stdout)
    assert as_json["args"] == {"n": 1}
    assert as_json["status"] == "failed"
    retried = cli("jobs", "retry", str(ids[0]), str(ids[1]), url=database_url)
    assert retried.exit_code == 1  # ids[1] is queued: refused, and said so
    assert f"job {ids[0]}: retried (was failed)" in retried.stdout
    assert (
        f"job {ids[1]}: not retried, it is not failed or cancelled, or its handler still runs "
        "(queued)" in retried.stdout
    )
    deleted = cli("jobs", "delete", "--json", str(ids[2]), url=database_url)
    assert deleted.exit_code == 0
    assert json.loads(deleted.stdout) == {str(ids[2]): "queued"}
    assert sorted(jobs_by_id(engine)) == ids[:2]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("jobs", "list", "--status", "finished"), "'finished' is not one of"),
        (("jobs", "list", "--limit", "0"), "must be a whole number from 1 to 1000, got 0"),
        (("jobs", "show", "x"), "'x' is not a valid integer"),
        (("jobs", "show", "999999"), "no job 999999"),
        (("jobs", "retry"), "pass job ids or --failed"),
        (("jobs", "retry", "--queue", "q", "3"), "--queue goes with --failed"),
        (("jobs", "delete", "0"), "must be a job id, a whole number from 1 to"),
    ],
)
def test_cli_jobs_commands_refuse_bad_input_in_one_line(
    database_url: str, args: tuple[str, ...], fragment: str
) -> None:
    result = cli(*args, url=database_url)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert fragment in result.stderr, result.stderr


def test_cli_retry_names_each_job_whose_unique_key_is_held_and_retries_the_rest(
    database_url: str, engine: Engine
) -> None:
    ids: list[int] = []
    for _ in range(2):  # a failed job frees its key: the second one is enqueued, then fails
        (job_id,) = enqueue_jobs(engine, "app.a", 1, args={"n": 1}, unique=True)
        set_status(engine, [job_id], "failed")
        ids.append(job_id)
    (plain,) = enqueue_jobs(engine, "app.a", 1)
    set_status(engine, [plain], "failed")
    result = cli("jobs", "retry", "--failed", url=database_url)
    assert result.exit_code == 1, result.output
    assert "retried 2 failed job(s)" in result.stdout
    assert f"job {ids[1]}: not retried, its unique key is held by job {ids[0]} (failed)" in (
        result.stdout
    )
    assert "Traceback" not in result.output
    assert {i: j.status for i, j in jobs_by_id(engine).items()} == {
        ids[0]: "queued",
        ids[1]: "failed",
        plain: "queued",
    }
    by_id = cli("jobs", "retry", "--json", str(ids[1]), url=database_url)
    assert by_id.exit_code == 1
    assert json.loads(by_id.stdout) == {}
    assert f"job {ids[1]}: not retried, its unique key is held by job {ids[0]}" in by_id.stderr
    assert "not failed or cancelled" not in by_id.stderr


def test_retry_of_a_job_with_a_huge_budget_caps_max_attempts_instead_of_overflowing(
    engine: Engine,
) -> None:
    ids = enqueue_jobs(engine, "app.a", 2)
    set_status(engine, ids, "failed", attempts=3)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET max_attempts = 2147483646 WHERE id = :i"),
            {"i": ids[0]},
        )
        assert admin.retry_jobs(conn, ids[:1]) == {ids[0]: "failed"}  # 3 + that > int4
        # a job retried so often its attempts near int4: the largest budget input allows
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET attempts = 2147483000, max_attempts = 2147483000 "
                "WHERE id = :i"
            ),
            {"i": ids[1]},
        )
        assert admin.retry_jobs(conn, ids[1:], attempts=MAX_ATTEMPTS) == {ids[1]: "failed"}
    rows = jobs_by_id(engine, ids)
    assert [rows[i].max_attempts for i in ids] == [2**31 - 1, 2**31 - 1]


def test_jobs_list_piped_prints_every_task_name_whole(database_url: str, engine: Engine) -> None:
    name = "reports.monthly." + "long_segment_" * 10  # 146 characters
    (job_id,) = enqueue_jobs(engine, name, 1)
    listed = cli("jobs", "list", url=database_url)  # CliRunner's stdout is not a terminal
    assert listed.exit_code == 0, listed.output
    (row,) = [line for line in listed.stdout.splitlines() if name in line]
    assert str(job_id) in row


def test_jobs_show_shows_a_kept_result_and_the_attempts_the_worker_allows(
    database_url: str, engine: Engine
) -> None:
    """The budget `jobs show` and `jobs list` print is the one the worker logs ("attempt 1
    of 4"): the task's max_attempts, written when a worker that knows the task claims it."""
    from sqla_queue import Registry
    from sqla_queue.testing import run_until_empty

    registry = Registry()

    @registry.task(name="calc", keep_result=True, max_attempts=4)
    def calc(n: int) -> dict[str, int]:
        return {"double": 2 * n}

    (job_id,) = enqueue_jobs(engine, "calc", 1, args={"n": 21})
    run_until_empty(engine, registry)
    shown = cli("jobs", "show", str(job_id), url=database_url)
    assert shown.exit_code == 0, shown.output
    assert "attempts: 1 of 4\n" in shown.stdout
    assert 'result: {"double": 42}\n' in shown.stdout
    as_json = json.loads(cli("jobs", "show", "--json", str(job_id), url=database_url).stdout)
    assert (as_json["attempts"], as_json["max_attempts"]) == (1, 4)
    assert as_json["result"] == {"double": 42}
    listed = cli("jobs", "list", "--task", "calc", url=database_url)
    assert "1/4" in listed.stdout
    assert "1/-" not in listed.stdout
