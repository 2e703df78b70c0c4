"""`sqla_queue.admin.filters`: acting on every job a filter matches, in batches, and searching by it
(issue 26)."""

from __future__ import annotations

import datetime as dt

import pytest
from helpers.support import enqueue_jobs, jobs_by_id, really_failed, set_status, statuses
from sqlalchemy import Engine, text

from sqla_queue import admin
from sqla_queue.admin import filters as bulk
from sqla_queue.admin.filters import JobFilter
from sqla_queue.errors import ConfigurationError, SqlaQueueError


def matching(engine: Engine, where: JobFilter) -> set[int]:
    with engine.connect() as conn:
        return {j.id for j in bulk.search_jobs(conn, where, limit=1000)}


def test_each_filter_matches_exactly_its_jobs(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail")
    a = enqueue_jobs(engine, "app.a", 2, args={"user": {"id": 42}, "n": 1}, tags=["x", "y"])
    b = enqueue_jobs(engine, "app.b", 2, queue="mail", args={"user": {"id": 7}})
    c = enqueue_jobs(engine, "app.a", 1, workflow_id="wf-1", args={"items": [1, 2, 3]})
    set_status(engine, a[:1], "failed", "ValueError: Bad 50% Input_x")
    set_status(engine, b[:1], "failed", "KeyError: other")
    set_status(engine, c, "cancelled", "cancelled by hand")
    with engine.begin() as conn:  # an old one: finished and created two days ago
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET finished_at = now() - interval '2 days', "
                "created_at = now() - interval '2 days' WHERE id = :id"
            ),
            {"id": b[0]},
        )
    now = dt.datetime.now(dt.UTC)
    day = dt.timedelta(days=1)
    assert matching(engine, JobFilter(queue="mail")) == set(b)
    assert matching(engine, JobFilter(task="app.a")) == set(a + c)
    assert matching(engine, JobFilter(status="failed")) == {a[0], b[0]}
    assert matching(engine, JobFilter(status=("failed", "cancelled"))) == {a[0], b[0], c[0]}
    assert matching(engine, JobFilter(tag=("x", "y"))) == set(a)
    assert matching(engine, JobFilter(tag="z")) == set()
    assert matching(engine, JobFilter(workflow_id="wf-1")) == set(c)
    # substring, in any case, with LIKE's wildcards taken literally
    assert matching(engine, JobFilter(error="bad 50% input_")) == {a[0]}
    assert matching(engine, JobFilter(error="50%%")) == set()
    assert matching(engine, JobFilter(error="error")) == {a[0], b[0]}
    assert matching(engine, JobFilter(finished_before=now - day)) == {b[0]}
    assert matching(engine, JobFilter(finished_after=now - day)) == {a[0], c[0]}
    assert matching(engine, JobFilter(created_before=now - day)) == {b[0]}
    assert matching(engine, JobFilter(created_after=now - day)) == set(a + b[1:] + c)
    assert matching(engine, JobFilter(args=bulk.args_at("user.id", 42))) == set(a)
    assert matching(engine, JobFilter(args={"user": {"id": 7}}, queue="mail")) == set(b)
    assert matching(engine, JobFilter(args=bulk.args_at(["items"], [2]))) == set(c)
    assert matching(engine, JobFilter(args={"user": {"id": "42"}})) == set()  # JSON types count
    with engine.connect() as conn:
        assert bulk.count_matching(conn, JobFilter(task="app.a")) == 3
        assert bulk.count_matching(conn, JobFilter(task="app.a"), "retry") == 2
        assert bulk.count_matching(conn, JobFilter(task="app.a"), "cancel") == 1


def test_search_pages_by_id_newest_first_without_gaps(engine: Engine) -> None:
    ids = enqueue_jobs(engine, "app.a", 7, args={"k": 1})
    enqueue_jobs(engine, "app.b", 3)
    seen: list[int] = []
    before = None
    with engine.connect() as conn:
        while page := bulk.search_jobs(conn, JobFilter(args={"k": 1}), limit=3, before=before):
            seen += [j.id for j in page]
            before = page[-1].id
    assert seen == sorted(ids, reverse=True)


def test_bulk_retry_by_filter_in_batches_skips_held_unique_keys(engine: Engine) -> None:
    twins: list[int] = []
    for _ in range(2):  # a failed job frees its key: the second is enqueued, then fails
        (job_id,) = enqueue_jobs(engine, "app.u", 1, args={"n": 1}, unique=True)
        set_status(engine, [job_id], "failed")
        twins.append(job_id)
    (held,) = enqueue_jobs(engine, "app.u", 1, args={"n": 2}, unique=True)
    set_status(engine, [held], "failed")
    (holder,) = enqueue_jobs(engine, "app.u", 1, args={"n": 2}, unique=True)  # queued
    plain = enqueue_jobs(engine, "app.u", 5)
    set_status(engine, plain, "failed")
    other = enqueue_jobs(engine, "app.other", 2)
    set_status(engine, other, "failed")
    seen: list[int] = []
    result = bulk.bulk_retry(
        engine, JobFilter(task="app.u"), batch=2, progress=lambda r: seen.append(r.batches)
    )
    assert (result.acted, result.skipped, result.held) == (6, 2, 2)
    assert seen == [1, 2, 3, 4]  # 8 failed jobs of app.u, 2 a batch
    assert result.notice == "retried 6 jobs, 2 skipped: unique key held"
    now = statuses(engine)
    assert [now[i] for i in twins] == ["queued", "failed"]
    assert (now[held], now[holder]) == ("failed", "queued")
    assert {now[i] for i in plain} == {"queued"}
    assert {now[i] for i in other} == {"failed"}


def test_bulk_retry_of_twins_in_one_batch_retries_the_lowest_id(engine: Engine) -> None:
    twins: list[int] = []
    for _ in range(2):
        (job_id,) = enqueue_jobs(engine, "app.u", 1, args={"n": 1}, unique=True)
        set_status(engine, [job_id], "failed")
        twins.append(job_id)
    result = bulk.bulk_retry(engine, JobFilter(status="failed"), attempts=3)
    assert (result.acted, result.held, result.batches) == (1, 1, 1)
    rows = jobs_by_id(engine, twins)
    assert [rows[i].status for i in twins] == ["queued", "failed"]
    assert rows[twins[0]].max_attempts == 4  # attempts 1, plus a fresh budget of 3


def test_bulk_cancel_takes_unfinished_jobs_and_tells_nothing_else(engine: Engine) -> None:
    ids = enqueue_jobs(engine, "app.a", 6, tags=["batch-7"])
    set_status(engine, ids[0:1], "running")
    set_status(engine, ids[1:2], "done")
    set_status(engine, ids[2:3], "failed")
    (untagged,) = enqueue_jobs(engine, "app.a", 1)
    result = bulk.bulk_cancel(engine, JobFilter(tag="batch-7"), batch=2)
    assert (result.acted, result.skipped, result.batches) == (4, 0, 2)
    assert result.notice == "cancelled 4 jobs"
    now = statuses(engine)
    assert [now[i] for i in ids] == ["cancelled", "done", "failed", *["cancelled"] * 3]
    assert now[untagged] == "queued"


def test_bulk_delete_refuses_running_jobs(engine: Engine) -> None:
    ids = enqueue_jobs(engine, "app.a", 5)
    set_status(engine, ids[0:1], "running")
    set_status(engine, ids[1:3], "failed", "TimeoutError: read")
    (kept,) = enqueue_jobs(engine, "app.b", 1)
    result = bulk.bulk_delete(engine, JobFilter(task="app.a"), batch=3)
    assert (result.acted, result.skipped, result.batches) == (4, 0, 2)
    assert statuses(engine) == {ids[0]: "running", kept: "queued"}
    with pytest.raises(ConfigurationError, match="status is running: nothing to delete"):
        bulk.bulk_delete(engine, JobFilter(task="app.a", status="running"))


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: JobFilter(status="finished"), "status 'finished' is not one of: queued"),
        (lambda: JobFilter(queue=""), "queue name must be a non-empty string"),
        (lambda: JobFilter(error=""), "error text must be 1 to 1000 characters"),
        (lambda: JobFilter(error="x\x00"), "without NUL"),
        (
            lambda: JobFilter(finished_before=dt.datetime(2026, 1, 1)),
            "finished_before 2026-01-01T00:00:00 has no time zone: give one",
        ),
        (
            lambda: JobFilter(
                created_after=dt.datetime(2026, 2, 1, tzinfo=dt.UTC),
                created_before=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            ),
            "created_after (2026-02-01T00:00:00+00:00) must be earlier than created_before",
        ),
        (lambda: JobFilter(args=[1]), "args must be a JSON object the job's args contain"),  # type: ignore[arg-type]
        (lambda: JobFilter(args={"x": float("nan")}), "is not JSON"),
        (lambda: bulk.args_at("user..id", 1), "args path 'user..id' must be keys joined by dots"),
        (lambda: JobFilter(workflow_id=""), "workflow_id"),
    ],
)
def test_bad_filters_are_refused_by_name(make: object, fragment: str) -> None:
    with pytest.raises(SqlaQueueError, match=None) as caught:
        make()  # type: ignore[operator]
    assert fragment in str(caught.value)


def test_bad_actions_are_refused_by_name(engine: Engine) -> None:
    with pytest.raises(ConfigurationError, match="retry takes failed, cancelled jobs, and the"):
        bulk.bulk_retry(engine, JobFilter(status="queued"))
    with pytest.raises(ConfigurationError, match="batch must be"):
        bulk.bulk_cancel(engine, JobFilter(), batch=0)
    with engine.connect() as conn, pytest.raises(ConfigurationError, match="takes an Engine"):
        bulk.bulk_delete(conn, JobFilter())  # type: ignore[arg-type]


def test_error_matches_the_class_and_message_and_traceback_the_rest(engine: Engine) -> None:
    key_error, smtp, reason = really_failed(engine)
    assert "smtp_send" in jobs_by_id(engine, [key_error])[key_error].last_error  # its frames
    assert matching(engine, JobFilter(error="smtp")) == {smtp}
    assert matching(engine, JobFilter(error="keyerror: 'order'")) == {key_error}
    assert matching(engine, JobFilter(error="ConnectionError")) == {smtp}
    assert matching(engine, JobFilter(error="support.py")) == set()  # a file path
    assert matching(engine, JobFilter(error="row it was about")) == {reason}  # a reason
    assert matching(engine, JobFilter(traceback="in smtp_send")) == {key_error}
    assert matching(engine, JobFilter(traceback="support.py")) == {key_error, smtp}
    where = JobFilter(status="failed", error="smtp")
    with engine.connect() as conn:
        (shown,) = bulk.sample_matching(conn, where, "retry")
    assert (shown.id, shown.task) == (smtp, "mail")
    assert shown.error == "ConnectionError: SMTP server said 421: try later"
    assert bulk.bulk_retry(engine, where).acted == 1
    assert statuses(engine) == {key_error: "failed", smtp: "queued", reason: "cancelled"}
