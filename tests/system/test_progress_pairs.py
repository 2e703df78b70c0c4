"""Progress and per-job logs where they meet the other features (issue 38; the `progress`
row of tests/system/pairs.toml): each enqueue path, workflows, sequences, fair queues,
unique jobs, timeouts, cancels, snoozes, ctx.session(), bulk deletes and the schema."""

from __future__ import annotations

from helpers.apps import journaled
from helpers.enqueue_paths import PATHS
from helpers.support import WorkerThread, cli, enqueue_jobs, keep_jobs, wait_for
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Unique, admin, enqueue
from sqla_queue.admin import JobJournalView, partitions


def journal_of(engine: Engine, job_id: int) -> JobJournalView:
    with engine.connect() as conn:
        return admin.job_journal(conn, job_id)


def messages(view: JobJournalView, attempt: int = 1) -> list[str]:
    return [
        str(line["message"]) for log in view.logs if log.attempt == attempt for line in log.lines
    ]


def finished(view: JobJournalView) -> bool:
    return view.progress is not None and view.progress.fraction == 1.0


def test_jobs_of_every_sync_enqueue_path_report_progress_and_keep_their_lines(
    engine: Engine,
) -> None:
    keep_jobs(engine)
    for name, write in PATHS.items():
        with Session(engine) as session, session.begin():
            write(session, {"task": "journal.resize", "args": {"images": 2}, "tags": [name]})
    journaled.run_journaled(engine, 2)
    with engine.connect() as conn:
        ids = [row[0] for row in conn.execute(text("SELECT id FROM sqla_queue.all_jobs"))]
    assert len(ids) >= len(PATHS)
    for job_id in ids:
        view = journal_of(engine, job_id)
        assert finished(view), job_id
        assert messages(view) == ["resized image 1", "resized image 2"]


def test_each_job_of_a_workflow_has_its_own_progress_and_lines(engine: Engine) -> None:
    keep_jobs(engine)
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "journal.resize", {"images": 2}, flush=True)
        child = enqueue(session, "journal.resize", {"images": 4}, depends_on=[parent], flush=True)
        parent_id, child_id = parent.id, child.id
    journaled.run_journaled(engine, 2)
    parent_view, child_view = journal_of(engine, parent_id), journal_of(engine, child_id)
    assert parent_view.progress is not None
    assert parent_view.progress.message == "resized 2 of 2"
    assert child_view.progress is not None
    assert child_view.progress.message == "resized 4 of 4"
    assert len(messages(child_view)) == 4


def test_jobs_of_a_sequence_and_of_a_fair_queues_partitions_keep_their_own(
    engine: Engine,
) -> None:
    keep_jobs(engine, "tenants")
    with engine.begin() as conn:
        partitions.set_fair(conn, "tenants")
    sequenced = enqueue_jobs(engine, "journal.resize", 2, queue="tenants", sequence="s1")
    fair = enqueue_jobs(engine, "journal.resize", 2, queue="tenants", partition="acme")
    journaled.run_journaled(engine, 2)
    for job_id in sequenced + fair:
        view = journal_of(engine, job_id)
        assert finished(view)
        assert len(messages(view)) == 10


def test_a_unique_job_reports_progress_and_a_duplicate_enqueue_leaves_it(engine: Engine) -> None:
    keep_jobs(engine)
    with Session(engine) as session, session.begin():
        job = enqueue(session, "journal.resize", {"images": 3}, unique=Unique(), flush=True)
        job_id = job.id
    journaled.run_journaled(engine, 2)
    with Session(engine) as session, session.begin():
        enqueue(session, "journal.resize", {"images": 3}, unique=Unique(), flush=True)
    view = journal_of(engine, job_id)
    assert view.progress is not None
    assert (view.progress.attempt, view.progress.message) == (1, "resized 3 of 3")


def test_progress_after_a_timeout_is_fenced_off_and_the_attempts_lines_kept(
    engine: Engine,
) -> None:
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.overrun", 1)
    with WorkerThread(engine, journaled.registry, concurrency=1):
        wait_for(lambda: len(messages(journal_of(engine, job_id))) == 2, timeout=60)
    view = journal_of(engine, job_id)
    assert view.progress is not None
    assert view.progress.message == "before the timeout"  # 0.9 came after the job failed
    assert messages(view) == ["before the timeout", "after the timeout"]
    assert admin.job_statuses(engine.connect(), [job_id]) == {job_id: "failed"}


def test_progress_after_a_cancel_is_fenced_off_and_the_attempts_lines_kept(
    engine: Engine,
) -> None:
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.until_cancelled", 1)
    with WorkerThread(engine, journaled.registry, concurrency=1):
        wait_for(lambda: journal_of(engine, job_id).progress is not None, timeout=60)
        result = cli("jobs", "cancel", str(job_id), url=str(engine.url.render_as_string(False)))
        assert result.exit_code == 0, result.output
        wait_for(lambda: len(messages(journal_of(engine, job_id))) == 2, timeout=60)
    view = journal_of(engine, job_id)
    assert view.progress is not None
    assert view.progress.message == "waiting to be cancelled"
    assert messages(view) == ["waiting to be cancelled", "after the cancel"]


def test_each_run_of_a_snoozed_job_keeps_its_lines_under_its_own_attempt(engine: Engine) -> None:
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.snoozes_once", 1)
    journaled.run_journaled(engine, concurrency=1)
    view = journal_of(engine, job_id)
    # a snooze counts the run as an attempt and gives one more (max_attempts + 1)
    assert messages(view, 1) == ["run 1 of attempt 1"]
    assert messages(view, 2) == ["run 2 of attempt 2"]
    assert view.progress is not None
    assert (view.progress.attempt, view.progress.message) == (2, "done after the snooze")


def test_progress_and_lines_after_a_ctx_session_commit_are_kept(engine: Engine) -> None:
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.in_session", 1)
    journaled.run_journaled(engine, concurrency=1)
    view = journal_of(engine, job_id)
    assert view.progress is not None
    assert view.progress.message == "after the commit"
    assert messages(view) == ["after the commit"]


def test_a_bulk_delete_by_filter_deletes_the_jobs_progress_and_lines(
    engine: Engine, database_url: str
) -> None:
    keep_jobs(engine)
    enqueue_jobs(engine, "journal.resize", 3, args={"images": 1})
    (other,) = enqueue_jobs(engine, "journal.tight", 1, args={"calls": 3})
    journaled.run_journaled(engine, 2)
    result = cli("jobs", "delete", "--task", "journal.resize", "--yes", url=database_url)
    assert result.exit_code == 0, result.output
    with engine.connect() as conn:
        left = {
            table: {row[0] for row in conn.execute(text(f"SELECT job_id FROM sqla_queue.{table}"))}
            for table in ("job_progress", "job_logs")
        }
    assert left == {"job_progress": {other}, "job_logs": set()}
