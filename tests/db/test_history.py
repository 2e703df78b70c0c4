"""The history of finished jobs (issue 35, item 4; migration sqlaq_0030_history): a succeeded
job of a `keep` or `archive` queue moves out of the hot `jobs` table into `jobs_history`,
partitioned by finish time; every read of a finished job reads it there; prune drops whole
partitions; the keeper makes partitions ahead and moves an earlier release's rows in."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.dashboard_kit import client
from helpers.statements import claim_all, succeed
from helpers.support import (
    WorkerThread,
    cli,
    count_hot_where,
    count_where,
    enqueue_jobs,
    wait_for,
)
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqla_queue import Registry, Unique, admin, enqueue
from sqla_queue import wait_for as wait_for_result
from sqla_queue.admin.filters import JobFilter, bulk_delete
from sqla_queue.db import queries
from sqla_queue.db.models import JobStatus
from sqla_queue.doctor import DoctorOptions, Severity, diagnose
from sqla_queue.worker import WorkerConfig

HISTORY_COLUMNS_READ = ("started_at", "finished_at", "attempts", "result", "tags", "meta")


def partitions(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [row.name for row in conn.execute(queries.history_partitions())]


def keep_history(engine: Engine, period_days: int = 1, ahead: int = 3, batch: int = 0) -> int:
    params = {"period_days": period_days, "ahead": ahead, "batch": batch}
    with engine.begin() as conn:
        return int(conn.execute(queries.keep_history(), params).scalar_one())


def put_in_history(engine: Engine, job_id: int, days_ago: float, task: str = "old") -> None:
    """A finished job of `days_ago` days, written straight into the history."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs_history (id, queue, task, args, status, priority, "
                "run_at, attempts, created_at, finished_at, started_at, result) VALUES "
                "(:id, 'default', :task, '{}', 'done', 0, now(), 1, now(), "
                "now() - make_interval(secs => :s), now() - make_interval(secs => :s), "
                "'\"r\"')"
            ),
            {"id": job_id, "task": task, "s": days_ago * 86400},
        )


def finish_kept(engine: Engine, retention: str, results: dict[int, Any] | None = None) -> list[int]:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", retention)
    ids = enqueue_jobs(engine, "t", 2, tags=["kept"])
    succeed(engine, claim_all(engine), results)
    return ids


@pytest.mark.parametrize("retention", ["keep", "archive"])
def test_an_archived_job_is_in_the_history_not_in_the_hot_table(
    engine: Engine, retention: str
) -> None:
    ids = finish_kept(engine, retention, None)
    assert count_hot_where(engine, "true") == 0
    assert count_where(engine, "status = 'done'") == 2  # sqla_queue.all_jobs reads both
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT id, {', '.join(HISTORY_COLUMNS_READ)} FROM sqla_queue.jobs_history "
                "ORDER BY id"
            )
        ).all()
    assert [row.id for row in rows] == ids
    for row in rows:
        assert row.started_at is not None
        assert row.finished_at >= row.started_at
        assert (row.attempts, row.tags) == (1, ["kept"])


def test_an_archived_job_lands_in_the_partition_of_its_finish_day(
    engine: Engine,
) -> None:
    (job_id, _) = finish_kept(engine, "archive")
    with engine.connect() as conn:
        where = conn.execute(
            text("SELECT tableoid::regclass::text FROM sqla_queue.jobs_history WHERE id = :i"),
            {"i": job_id},
        ).scalar_one()
        today = conn.execute(text("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')"))
        assert where == f"sqla_queue.jobs_history_p{today.scalar_one()}"


def test_wait_for_show_and_list_read_a_job_in_the_history(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "archive")
    (live,) = enqueue_jobs(engine, "t", 1)
    (job_id,) = enqueue_jobs(engine, "t", 1)
    claimed = claim_all(engine)
    del claimed[live]
    succeed(engine, claimed, {job_id: {"pdf": "receipt-7"}})
    put_in_history(engine, 10_000_000, days_ago=2)  # the DEFAULT partition
    keep_history(engine)  # now in a partition of its own, two days ago
    assert wait_for_result(engine, job_id, timeout=5) == {"pdf": "receipt-7"}
    assert wait_for_result(engine, 10_000_000, timeout=5) == "r"
    with engine.connect() as conn:
        shown = admin.get_job(conn, job_id)
        listed = admin.list_jobs(conn, limit=10)
        done = admin.list_jobs(conn, status=JobStatus.done, limit=10)
    assert shown is not None
    assert (shown.status, shown.archived) == ("done", True)
    assert shown.started_at is not None
    assert [j.id for j in listed] == [10_000_000, job_id, live]  # newest first, both tables
    assert [j.id for j in done] == [10_000_000, job_id]
    shown_cli = cli("jobs", "show", str(job_id), url=str(engine.url.render_as_string(False)))
    assert shown_cli.exit_code == 0, shown_cli.output
    assert "done" in shown_cli.output


def test_cancel_of_a_job_in_the_history_says_it_already_finished(engine: Engine) -> None:
    (job_id, _) = finish_kept(engine, "archive")
    with engine.begin() as conn:
        assert admin.cancel_jobs(conn, [job_id]) == {}
        assert admin.job_statuses(conn, [job_id, 999_999]) == {job_id: "done"}
    url = engine.url.render_as_string(False)
    answer = cli("jobs", "cancel", str(job_id), url=url)
    assert answer.exit_code == 1
    assert answer.stdout.strip() == f"job {job_id}: not cancelled, it already finished (done)"


@pytest.mark.parametrize("retention", ["keep", "archive"])
def test_the_dashboards_job_list_pages_through_the_history(engine: Engine, retention: str) -> None:
    ids = finish_kept(engine, retention)
    (queued,) = enqueue_jobs(engine, "t", 1)
    page = client(engine).get("/jobs")
    assert page.status_code == 200
    for job_id in (*ids, queued):
        assert f"/jobs/{job_id}" in page.text
    detail = client(engine).get(f"/jobs/{ids[0]}")
    assert detail.status_code == 200
    assert "done" in detail.text
    assert '">in the history</span>' in detail.text  # a keep queue's job too, not "archived"
    live = client(engine).get(f"/jobs/{queued}")
    assert "in the history" not in live.text


def test_a_bulk_delete_by_filter_takes_jobs_of_every_partition(engine: Engine) -> None:
    finish_kept(engine, "archive")
    put_in_history(engine, 10_000_001, days_ago=3)
    put_in_history(engine, 10_000_002, days_ago=5, task="other")
    keep_history(engine)
    assert len(partitions(engine)) >= 3
    result = bulk_delete(engine, JobFilter(task="old", status="done"), batch=1)
    assert result.acted == 1
    assert count_where(engine, "task = 'old'") == 0
    result = bulk_delete(engine, JobFilter(status="done"))
    assert result.acted == 3
    assert count_where(engine, "true") == 0


def test_prune_drops_the_partitions_older_than_the_cut_off(engine: Engine) -> None:
    for n in range(3):
        put_in_history(engine, 20_000_000 + n, days_ago=4)
    put_in_history(engine, 20_000_010, days_ago=2)
    keep_history(engine)
    with engine.connect() as conn:
        four_days = conn.execute(
            text("SELECT to_char((now() - interval '4 days') AT TIME ZONE 'UTC', 'YYYYMMDD')")
        ).scalar_one()
    old = f"jobs_history_p{four_days}"
    assert old in partitions(engine)
    with engine.begin() as conn:
        assert admin.prune(conn, 3 * 86400) == 3
    assert old not in partitions(engine)  # dropped, not emptied row by row
    assert count_where(engine, "true") == 1
    with engine.begin() as conn:  # the cut-off falls inside a partition: those rows go
        assert admin.prune(conn, 0) == 1
    assert count_where(engine, "true") == 0


def test_prune_keeps_a_partition_that_holds_jobs_of_another_status(engine: Engine) -> None:
    put_in_history(engine, 30_000_000, days_ago=4)
    put_in_history(engine, 30_000_001, days_ago=4)
    with engine.begin() as conn:
        failed = "UPDATE sqla_queue.jobs_history SET status = 'failed' WHERE id = 30000001"
        conn.execute(text(failed))
    keep_history(engine)
    before = partitions(engine)
    with engine.begin() as conn:
        assert admin.prune(conn, 3 * 86400) == 1
    assert partitions(engine) == before
    assert count_where(engine, "status = 'failed'") == 1


def test_a_kept_result_of_a_keep_queue_is_in_the_history_for_wait_for(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    (told, silent) = enqueue_jobs(engine, "t", 2)
    succeed(engine, claim_all(engine), {told: {"n": 1}})
    assert count_hot_where(engine, "true") == 0
    with engine.connect() as conn:
        assert wait_for_result(conn, told, timeout=5) == {"n": 1}
        assert wait_for_result(conn, silent, timeout=5) is None  # done, no result kept
        assert admin.job_statuses(conn, [told, silent]) == {told: "done", silent: "done"}


@pytest.mark.parametrize("retention", ["keep", "archive"])
def test_only_a_keep_queue_leaves_a_job_that_blocks_while_done_in_the_hot_table(
    engine: Engine, retention: str
) -> None:
    once = Unique(args=["n"], states=["queued", "running", "done"])
    with engine.begin() as conn:
        admin.set_retention(conn, "default", retention)
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "t", {"n": 1}, unique=once).id
        plain_id = enqueue(session, "t", {"n": 2}, unique=Unique(args=["n"])).id
    assert succeed(engine, claim_all(engine)) == 2
    assert count_where(engine, f"id IN ({job_id}, {plain_id}) AND status = 'done'") == 2
    blocks = retention == "keep"
    assert count_hot_where(engine, f"id = {job_id} AND status = 'done'") == int(blocks)
    assert count_hot_where(engine, f"id = {plain_id}") == 0  # moved whatever the retention
    with Session(engine) as session, session.begin():
        again = enqueue(session, "t", {"n": 1}, unique=once)
        assert (again.duplicate, again.id == job_id) == (blocks, blocks)


def test_the_keeper_makes_partitions_ahead_and_moves_an_earlier_releases_rows(
    engine: Engine,
) -> None:
    registry = Registry()
    registry.task(name="t")(lambda: None)
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
        # what code built for sqlaq_0029 leaves: kept jobs in jobs (they move, each with its
        # own finish time, but one whose unique key blocks while done, and one whose result
        # its handler's session has not stored yet), an archived one in the unpartitioned
        # archive (it moves)
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs (id, task, status, attempts, finished_at, "
                "locked_at, unique_key, unique_states, result) VALUES "
                "(40000000, 't', 'done', 1, now() - interval '2 days', now(), NULL, NULL, "
                "NULL), "
                "(40000002, 't', 'done', 1, now(), now(), '\\x01', 7, NULL), "
                "(40000003, 't', 'done', 1, now(), now(), NULL, NULL, "
                '\'{"sqla_queue_result": "pending"}\')'
            )
        )
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs_archive (id, queue, task, args, status, priority, "
                "run_at, attempts, created_at, finished_at) VALUES "
                "(40000001, 'default', 't', '{}', 'done', 0, now(), 1, now(), now())"
            )
        )
    with engine.connect() as conn:
        ahead = conn.execute(
            text("SELECT to_char((now() + interval '6 days') AT TIME ZONE 'UTC', 'YYYYMMDD')")
        ).scalar_one()
    with WorkerThread(engine, registry, heartbeat=0.5, history_ahead=6):
        wait_for(lambda: f"jobs_history_p{ahead}" in partitions(engine), timeout=60)
        wait_for(lambda: count_where(engine, "id = 40000001") == 1, timeout=60)
        wait_for(lambda: count_hot_where(engine, "id = 40000000") == 0, timeout=60)
    with engine.connect() as conn:
        moved = conn.execute(
            text(
                "SELECT id, finished_at < now() - interval '1 day' AS old "
                "FROM sqla_queue.jobs_history ORDER BY id"
            )
        )
        assert [tuple(row) for row in moved] == [(40000000, True), (40000001, False)]
        assert conn.execute(text("SELECT count(*) FROM sqla_queue.jobs_archive")).scalar() == 0
    assert count_hot_where(engine, "id IN (40000002, 40000003)") == 2  # they stay


def test_a_row_without_a_partition_goes_to_default_and_moves_out_once_one_is_made(
    engine: Engine,
) -> None:
    put_in_history(engine, 50_000_000, days_ago=30)
    with engine.connect() as conn:
        stray = conn.execute(queries.history_default_rows()).one()
    assert stray.rows == 1
    keep_history(engine)
    with engine.connect() as conn:
        assert conn.execute(queries.history_default_rows()).one().rows == 0
    assert count_where(engine, "id = 50000000") == 1


def test_a_passed_partition_is_analyzed_once(engine: Engine) -> None:
    put_in_history(engine, 60_000_000, days_ago=2)
    keep_history(engine)
    with engine.connect() as conn:
        analyzed = conn.execute(
            text(
                "SELECT c.relname FROM pg_stat_user_tables t JOIN pg_class c ON c.oid = t.relid "
                "WHERE c.relname LIKE 'jobs_history_p%' AND t.last_analyze IS NOT NULL"
            )
        ).scalars()
        two_days = conn.execute(
            text("SELECT to_char((now() - interval '2 days') AT TIME ZONE 'UTC', 'YYYYMMDD')")
        ).scalar_one()
    assert f"jobs_history_p{two_days}" in set(analyzed)


def test_history_period_days_is_checked() -> None:
    with pytest.raises(Exception, match="history_period_days"):
        WorkerConfig(history_period_days=0)


def test_doctor_names_the_rows_of_the_default_partition(engine: Engine) -> None:
    (found,) = [f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "history"]
    assert found.severity is Severity.ok
    assert found.details["made_until"] is not None
    put_in_history(engine, 70_000_000, days_ago=40)
    (found,) = [f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "history"]
    assert found.severity is Severity.warn
    assert "1 finished job(s) in the history's DEFAULT partition" in found.value
    assert found.details["default_rows"] == 1


def test_an_archived_job_keeps_its_progress_until_it_is_deleted(engine: Engine) -> None:
    (job_id, other) = finish_kept(engine, "archive")
    with engine.begin() as conn:
        for n in (job_id, other):
            conn.execute(
                text(
                    "INSERT INTO sqla_queue.job_progress (job_id, attempt, fraction) "
                    "VALUES (:j, 1, 1)"
                ),
                {"j": n},
            )
    with engine.begin() as conn:
        assert admin.delete_jobs(conn, [job_id]) == {job_id: "done"}
    with engine.connect() as conn:
        left = conn.execute(text("SELECT job_id FROM sqla_queue.job_progress")).scalars().all()
    assert left == [other]  # the history's journal trigger took the deleted job's


def test_the_history_upkeep_refuses_bounds_past_the_workers_own(engine: Engine) -> None:
    """`keep_history` runs as the schema's owner and any role with USAGE on the schema may
    call it: it takes only what `WorkerConfig` takes, so no caller makes it create
    thousands of partitions."""
    for args in ((1, 10_000, 0), (0, 1, 0), (1, 1, 10**7)):
        with engine.begin() as conn, pytest.raises(DBAPIError, match="keep_history: period_days"):
            conn.execute(
                text("SELECT sqla_queue.keep_history(:p, :a, :b)"),
                dict(zip("pab", args, strict=True)),
            )
    with engine.begin() as conn:
        conn.execute(text("SELECT sqla_queue.keep_history(1, 20, 0)"))
        made = conn.execute(
            text(
                "SELECT count(*) FROM pg_inherits "
                "WHERE inhparent = 'sqla_queue.jobs_history'::regclass"
            )
        ).scalar_one()
    assert 22 <= made <= 25  # today's, 20 ahead, the DEFAULT (and any made before)
