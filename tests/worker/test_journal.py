"""A job's progress and its handler's log lines (issue 38): `ctx.progress`, fenced on the
attempt, throttled, kept outside the jobs row; the log lines of each attempt, capped; both
shown by `jobs show` and deleted with the job by every path that deletes it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest
from helpers.apps import journaled
from helpers.support import cli, enqueue_jobs, make_due, set_status
from sqlalchemy import Engine, text

from sqla_queue import admin
from sqla_queue.job import journal
from sqla_queue.job.context import JobContext
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig
from sqla_queue.worker.journal import DatabaseJournal

APP = "helpers.apps.journaled:registry"


def journal_rows(engine: Engine, table: str) -> list[tuple[int, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(f"SELECT * FROM sqla_queue.{table}"))]


def keep_done_jobs(engine: Engine) -> None:
    with engine.begin() as conn:
        if not admin.create_queue(conn, "default", retention="keep"):
            admin.set_retention(conn, "default", "keep")


# -- progress ---------------------------------------------------------------------------------


def test_progress_is_kept_with_the_job_and_shown_by_jobs_show(
    engine: Engine, database_url: str
) -> None:
    keep_done_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.resize", 1)
    journaled.run_journaled(engine)
    with engine.connect() as conn:
        view = admin.job_journal(conn, job_id)
    assert view.progress is not None
    assert (view.progress.attempt, view.progress.fraction, view.progress.message) == (
        1,
        1.0,
        "resized 10 of 10",
    )
    shown = cli("jobs", "show", str(job_id), url=database_url)
    assert shown.exit_code == 0, shown.output
    assert "progress: 100% resized 10 of 10 (attempt 1, at " in shown.output
    as_json = json.loads(cli("jobs", "show", str(job_id), "--json", url=database_url).output)
    assert as_json["progress"]["fraction"] == 1.0
    assert as_json["progress"]["message"] == "resized 10 of 10"
    assert [line["message"] for line in as_json["logs"][0]["lines"]] == [
        f"resized image {n}" for n in range(1, 11)
    ]


def test_a_tight_loop_writes_progress_at_most_once_a_second_and_its_last_value(
    engine: Engine,
) -> None:
    keep_done_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.tight", 1, args={"calls": 20_000})
    journaled.run_journaled(engine)
    with engine.connect() as conn:
        job = admin.get_job(conn, job_id)
        view = admin.job_journal(conn, job_id)
    assert job is not None
    assert job.status == "done"
    # the journal's own decisions: one write per started second of the loop, plus the last
    assert job.result["writes"] <= int(job.result["seconds"] / journal.PROGRESS_EVERY) + 2
    assert view.progress is not None
    assert (view.progress.fraction, view.progress.message) == (1.0, "call 20000")


class RecordingSink:
    def __init__(self) -> None:
        self.progress: list[tuple[float | None, str | None]] = []
        self.logs: list[tuple[int, int]] = []

    def write_progress(
        self, job_id: int, attempt: int, fraction: float | None, message: str | None
    ) -> None:
        self.progress.append((fraction, message))

    def write_logs(self, job_id: int, attempt: int, lines: list[object], dropped: int) -> None:
        self.logs.append((len(lines), dropped))


def test_progress_is_throttled_by_the_clock_and_the_last_value_written_at_close() -> None:
    now = [100.0]
    sink = RecordingSink()
    kept = journal.JobJournal(sink, 1, 1, clock=lambda: now[0])
    for step in range(1, 11):
        kept.progress(step / 10, f"step {step}")
        now[0] += 0.25  # 10 calls over 2.5 s
    kept.close()
    assert sink.progress == [(0.1, "step 1"), (0.5, "step 5"), (0.9, "step 9"), (1.0, "step 10")]
    kept.close()  # nothing pending: nothing written again
    assert len(sink.progress) == 4


def test_an_async_handlers_progress_is_written_off_the_event_loop_and_the_last_value_last() -> None:
    now = [100.0]
    written: list[tuple[str, float | None]] = []

    class ThreadRecordingSink(RecordingSink):
        def write_progress(
            self, job_id: int, attempt: int, fraction: float | None, message: str | None
        ) -> None:
            time.sleep(0.05)  # a slow database: the loop must not wait for it
            written.append((threading.current_thread().name, fraction))

    kept = journal.JobJournal(ThreadRecordingSink(), 1, 1, clock=lambda: now[0])

    async def handler() -> None:
        for step in range(1, 11):
            kept.progress(step / 10, None)
            now[0] += 0.25
            await asyncio.sleep(0)

    asyncio.run(handler())
    kept.close()  # on the handler thread, after the coroutine: waits for the one in flight
    fractions = [fraction for _, fraction in written]
    assert fractions == sorted(fractions)  # one write in flight per job: never out of order
    assert fractions[0] == 0.1
    assert fractions[-1] == 1.0  # the last value, last
    assert len(fractions) <= 4
    assert written[0][0].startswith("sqla-queue-progress")  # not the loop's thread


@pytest.mark.parametrize("fraction", [1.5, -0.1, float("nan"), "half", True])
def test_progress_out_of_range_is_one_clear_error(fraction: object) -> None:
    ctx = JobContext(1, "t", "default", 1)
    with pytest.raises(ValueError, match=r"ctx\.progress\(fraction\) must be"):
        ctx.progress(fraction)  # type: ignore[arg-type]


def test_a_bad_progress_value_fails_the_job_with_a_line_that_names_it(engine: Engine) -> None:
    keep_done_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.bad_progress", 1, args={"fraction": 40})
    journaled.run_journaled(engine)
    with engine.connect() as conn:
        job = admin.get_job(conn, job_id)
    assert job is not None
    assert job.status == "failed"
    assert "ctx.progress(fraction) must be from 0 to 1 (0.4 is 40%), got 40.0" in (
        job.last_error or ""
    )


def test_progress_of_a_stale_attempt_is_dropped_and_never_overwrites_a_newer_one(
    engine: Engine,
) -> None:
    (job_id,) = enqueue_jobs(engine, "journal.resize", 1)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'running', attempts = 2 WHERE id = :id"),
            {"id": job_id},
        )
    sink = DatabaseJournal(engine)
    sink.write_progress(job_id, 1, 0.9, "stale attempt 1")  # reaped, re-claimed: not its job
    assert journal_rows(engine, "job_progress") == []
    sink.write_progress(job_id, 2, 0.2, "attempt 2")
    assert [row[:4] for row in journal_rows(engine, "job_progress")] == [
        (job_id, 2, 0.2, "attempt 2")
    ]
    set_status(engine, [job_id], "queued", attempts=2)  # reaped: the attempt no longer holds it
    sink.write_progress(job_id, 2, 0.3, "after the reap")
    assert [row[3] for row in journal_rows(engine, "job_progress")] == ["attempt 2"]


def test_an_attempts_log_lines_are_kept_while_its_job_exists_and_a_rerun_appends(
    engine: Engine,
) -> None:
    (job_id,) = enqueue_jobs(engine, "journal.resize", 1)
    set_status(engine, [job_id], "running", attempts=2)
    sink = DatabaseJournal(engine)
    sink.write_logs(job_id, 1, [{"message": "attempt 1, written late"}], 0)  # still its lines
    sink.write_logs(job_id, 3, [{"message": "an attempt not made"}], 0)
    sink.write_logs(job_id + 1, 1, [{"message": "no such job"}], 0)
    assert [(row[0], row[1]) for row in journal_rows(engine, "job_logs")] == [(job_id, 1)]
    full = [{"message": str(n)} for n in range(journal.MAX_LOG_LINES - 1)]
    sink.write_logs(job_id, 2, full, 5)
    sink.write_logs(job_id, 2, [{"message": "snoozed, ran again"}], 0)  # same attempt: added
    sink.write_logs(job_id, 2, [{"message": "a"}, {"message": "b"}], 1)  # past the cap
    with engine.connect() as conn:
        logs = {log.attempt: log for log in admin.job_journal(conn, job_id).logs}
    assert len(logs[2].lines) == journal.MAX_LOG_LINES
    assert logs[2].lines[-1]["message"] == "snoozed, ran again"
    assert logs[2].dropped == 5 + 2 + 1


def test_the_journal_tables_have_no_foreign_key_to_the_job_row(engine: Engine) -> None:
    with engine.connect() as conn:
        keys = conn.execute(
            text(
                "SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' "
                "AND conrelid IN ('sqla_queue.job_progress'::regclass, "
                "'sqla_queue.job_logs'::regclass)"
            )
        ).all()
    assert keys == []


# -- log lines --------------------------------------------------------------------------------


def test_each_attempts_log_lines_are_kept_capped_and_shown_with_it(
    engine: Engine, database_url: str
) -> None:
    keep_done_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.chatty", 1)
    journaled.run_journaled(engine)
    make_due(engine)
    journaled.run_journaled(engine)
    with engine.connect() as conn:
        job = admin.get_job(conn, job_id)
        view = admin.job_journal(conn, job_id)
    assert job is not None
    assert (job.status, job.attempts) == ("done", 2)
    assert [log.attempt for log in view.logs] == [1, 2]
    for log in view.logs:
        assert len(log.lines) == journal.MAX_LOG_LINES
        assert log.dropped == journaled.LINES + 3 - journal.MAX_LOG_LINES
        first, long, failed = log.lines[:3]
        assert (first["level"], first["logger"]) == ("WARNING", "journaled.app")
        assert first["message"] == f"attempt {log.attempt} starts"
        assert len(long["message"]) == journal.MAX_LOG_LINE_CHARS
        assert failed["message"].startswith("lookup failed\nTraceback (most recent call last):")
        assert failed["message"].endswith("KeyError: 'order'")
    # the worker's own records (its start, the retry) are not the job's
    assert all(line["logger"] == "journaled.app" for log in view.logs for line in log.lines)
    shown = cli("jobs", "show", str(job_id), url=database_url).output
    assert f"logs of attempt 1 ({journal.MAX_LOG_LINES} lines, 103 more not kept):" in shown
    assert "WARNING journaled.app: attempt 2 starts" in shown
    assert "ERROR journaled.app: lookup failed\\nTraceback" in shown


def test_a_worker_with_job_logs_off_keeps_progress_and_no_lines(engine: Engine) -> None:
    keep_done_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.resize", 1)
    config = WorkerConfig(concurrency=1, poll_only=True, job_logs=False)
    run_until_empty(engine, journaled.registry, config)
    view = journal_rows(engine, "job_progress")
    assert [(row[0], row[3]) for row in view] == [(job_id, "resized 10 of 10")]
    assert journal_rows(engine, "job_logs") == []


def test_an_async_handlers_log_lines_and_progress_are_its_own(engine: Engine) -> None:
    keep_done_jobs(engine)
    ids = enqueue_jobs(engine, "journal.async_steps", 3)
    journaled.run_journaled(engine, concurrency=3)
    with engine.connect() as conn:
        views = {job_id: admin.job_journal(conn, job_id) for job_id in ids}
    for view in views.values():
        assert [line["message"] for line in view.logs[0].lines] == [
            "async step one",
            "async step two",
        ]
        assert view.progress is not None
        assert view.progress.message == "half way"


# -- deleted with the job ---------------------------------------------------------------------


def test_progress_and_logs_go_with_the_job_on_every_path_that_deletes_it(
    engine: Engine, database_url: str
) -> None:
    keep_done_jobs(engine)
    deleted, pruned, kept = enqueue_jobs(engine, "journal.resize", 3)
    journaled.run_journaled(engine)
    assert len(journal_rows(engine, "job_progress")) == 3
    assert len(journal_rows(engine, "job_logs")) == 3
    assert cli("jobs", "delete", str(deleted), url=database_url).exit_code == 0
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs_history SET finished_at = now() - interval '2 days' "
                "WHERE id = :id"
            ),
            {"id": pruned},
        )
    assert cli("prune", "--older-than", "1d", url=database_url).exit_code == 0
    assert {row[0] for row in journal_rows(engine, "job_progress")} == {kept}
    assert {row[0] for row in journal_rows(engine, "job_logs")} == {kept}


def test_a_job_deleted_by_its_retention_on_completion_leaves_no_journal(engine: Engine) -> None:
    enqueue_jobs(engine, "journal.resize", 5)  # the default queue deletes finished jobs
    journaled.run_journaled(engine, concurrency=2)
    with engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM sqla_queue.jobs")).scalar_one()
    assert left == 0
    assert journal_rows(engine, "job_progress") == []
    assert journal_rows(engine, "job_logs") == []


def test_one_trigger_takes_each_jobs_steps_progress_and_logs_whichever_tables_hold_rows(
    engine: Engine,
) -> None:
    # sqlaq_0026: one journal trigger, which skips a table holding no row at all; a job
    # with only steps, one with only progress, one with only logs and plain jobs are
    # deleted by one statement, beside a job whose rows stay
    ids = enqueue_jobs(engine, "journal.resize", 6)
    steps_only, progress_only, logs_only, plain, kept, later = ids
    with engine.begin() as conn:
        for job_id in (steps_only, kept):
            conn.execute(
                text(
                    "INSERT INTO sqla_queue.job_steps (job_id, name, status, attempt, result, "
                    "started_at) VALUES (:id, 'charge', 'done', 1, '1', now())"
                ),
                {"id": job_id},
            )
        for job_id in (progress_only, kept):
            conn.execute(
                text(
                    "INSERT INTO sqla_queue.job_progress (job_id, attempt, fraction) "
                    "VALUES (:id, 1, 0.5)"
                ),
                {"id": job_id},
            )
        for job_id in (logs_only, kept):
            conn.execute(
                text(
                    "INSERT INTO sqla_queue.job_logs (job_id, attempt, lines) VALUES (:id, 1, '[]')"
                ),
                {"id": job_id},
            )
        triggers = conn.execute(
            text(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'sqla_queue.jobs'::regclass "
                "AND NOT tgisinternal AND tgoldtable IS NOT NULL"
            )
        ).scalars()
        assert list(triggers) == ["job_journal_gone"]  # one transition table, one call
    with engine.begin() as conn:
        conn.execute(
            text("DELETE FROM sqla_queue.jobs WHERE id = ANY(:ids)"),
            {"ids": [steps_only, progress_only, logs_only, plain]},
        )
    for table in ("job_steps", "job_progress", "job_logs"):
        assert {row[0] for row in journal_rows(engine, table)} == {kept}, table
    # with every journal table empty, a delete passes the trigger and still deletes its job
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_queue.jobs WHERE id = :id"), {"id": kept})
        conn.execute(text("DELETE FROM sqla_queue.jobs WHERE id = :id"), {"id": later})
        assert conn.execute(text("SELECT count(*) FROM sqla_queue.jobs")).scalar_one() == 0
    for table in ("job_steps", "job_progress", "job_logs"):
        assert journal_rows(engine, table) == [], table


def test_capturing_job_logs_leaves_an_unconfigured_process_its_warnings_on_stderr() -> None:
    # a root handler would have silenced logging's last resort (warnings on stderr)
    script = (
        "import logging\n"
        "from sqla_queue.job.journal import capture_job_logs\n"
        "capture_job_logs()\n"
        "capture_job_logs()\n"
        "logging.getLogger('app').warning('still shown')\n"
        "assert logging.getLogger().handlers == []\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "still shown"
