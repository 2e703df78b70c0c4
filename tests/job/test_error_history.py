"""Every attempt's error, kept: a job's `errors` history (sqla_queue.job.history), written
by real workers in the statement that retries or fails the job, bounded, trimmed of the
queue's own frames, shown by `jobs show` and the dashboard."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from helpers.support import WorkerThread, cli, enqueue_jobs, jobs_by_id, wait_for
from sqlalchemy import Engine, text

from sqla_queue import JobContext, Registry, RetryPolicy, Snooze, admin
from sqla_queue.db import queries
from sqla_queue.job.history import MAX_ENTRIES, MAX_TRACEBACK_CHARS
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig

NOW = RetryPolicy(base=0, jitter=0)
BURST = WorkerConfig(concurrency=2, batch=10, poll_only=True)


class PaymentDeclined(Exception):
    pass


def keep_queue(engine: Engine, name: str = "kept") -> str:
    with engine.begin() as conn:
        admin.create_queue(conn, name, "keep")
    return name


def errors_of(engine: Engine, job_id: int) -> list[dict[str, Any]] | None:
    return jobs_by_id(engine, [job_id])[job_id].errors


def test_three_failures_then_a_success_keep_three_entries(engine: Engine) -> None:
    queue = keep_queue(engine)
    registry = Registry()

    @registry.task(name="flaky", queue=queue, retry=NOW, max_attempts=5, pass_context=True)
    def flaky(ctx: JobContext) -> str:
        if ctx.attempt <= 3:
            raise PaymentDeclined(f"declined on attempt {ctx.attempt}")
        return "paid"

    (job_id,) = enqueue_jobs(engine, "flaky", 1, queue=queue)
    run_until_empty(engine, registry, BURST)
    job = jobs_by_id(engine, [job_id])[job_id]
    assert job.status == "done"
    assert job.errors is not None
    assert [e["attempt"] for e in job.errors] == [1, 2, 3]
    assert {e["class"] for e in job.errors} == {f"{__name__}.PaymentDeclined"}
    assert [e["message"] for e in job.errors] == [f"declined on attempt {n}" for n in (1, 2, 3)]
    for entry in job.errors:
        assert entry["worker"]  # the locked_by of that attempt
        started = dt.datetime.fromisoformat(entry["started_at"])
        finished = dt.datetime.fromisoformat(entry["finished_at"])
        assert started <= finished
        assert entry["traceback"].rstrip().endswith(f"PaymentDeclined: {entry['message']}")


def test_a_job_that_never_fails_and_a_snoozed_one_keep_no_history(engine: Engine) -> None:
    queue = keep_queue(engine)
    registry = Registry()

    @registry.task(name="fine", queue=queue)
    def fine() -> None:
        pass

    @registry.task(name="sleepy", queue=queue, pass_context=True)
    def sleepy(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise Snooze(0)

    ids = enqueue_jobs(engine, "fine", 1, queue=queue) + enqueue_jobs(
        engine, "sleepy", 1, queue=queue
    )
    run_until_empty(engine, registry, BURST)
    with engine.begin() as conn:  # the snoozed one is due in 0 s, but make sure
        conn.execute(text("UPDATE sqla_queue.jobs SET run_at = now() WHERE status = 'queued'"))
    run_until_empty(engine, registry, BURST)
    found = jobs_by_id(engine, ids)
    assert [found[i].status for i in ids] == ["done", "done"]
    assert [found[i].errors for i in ids] == [None, None]  # NULL: success never touches it


def test_a_job_failing_for_good_keeps_every_attempt_and_its_last_error(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="doomed", retry=NOW, max_attempts=4, pass_context=True)
    def doomed(ctx: JobContext) -> None:
        raise KeyError(f"missing {ctx.attempt}")

    (job_id,) = enqueue_jobs(engine, "doomed", 1)
    run_until_empty(engine, registry, BURST)
    job = jobs_by_id(engine, [job_id])[job_id]
    assert job.status == "failed"
    assert job.errors is not None
    assert [(e["attempt"], e["class"]) for e in job.errors] == [
        (n, "KeyError") for n in range(1, 5)
    ]
    assert job.errors[-1]["message"] == "'missing 4'"
    assert job.last_error is not None
    assert "missing 4" in job.last_error


def test_the_history_keeps_the_first_entry_and_the_latest(engine: Engine) -> None:
    registry = Registry()
    attempts = 30

    @registry.task(name="stubborn", retry=NOW, max_attempts=attempts, pass_context=True)
    def stubborn(ctx: JobContext) -> None:
        raise RuntimeError(f"attempt {ctx.attempt}")

    (job_id,) = enqueue_jobs(engine, "stubborn", 1, max_attempts=attempts)
    run_until_empty(engine, registry, BURST)
    job = jobs_by_id(engine, [job_id])[job_id]
    assert job.status == "failed"
    assert job.attempts == attempts
    assert job.errors is not None
    kept = [e["attempt"] for e in job.errors]
    assert len(kept) == MAX_ENTRIES
    assert kept == [1, *range(attempts - MAX_ENTRIES + 2, attempts + 1)]
    assert [e["message"] for e in job.errors] == [f"attempt {n}" for n in kept]


def deep(n: int, size: int) -> None:
    if n == 0:
        raise ValueError("x" * size)
    deep(n - 1, size)


def test_a_huge_traceback_is_trimmed_and_starts_at_the_handler(engine: Engine) -> None:
    registry = Registry()

    def middleware(ctx: JobContext, call_next: Any) -> Any:
        return call_next(ctx)

    @registry.task(name="huge", max_attempts=1)
    def huge() -> None:
        try:
            deep(200, 50_000)  # 200 frames and a 50,000-character message
        except ValueError as exc:
            raise LookupError("while looking it up") from exc

    @registry.task(name="wrapped", max_attempts=1, middleware=[middleware])
    def wrapped() -> None:
        raise ValueError("inside a middleware")

    huge_id, wrapped_id = enqueue_jobs(engine, "huge", 1)[0], enqueue_jobs(engine, "wrapped", 1)[0]
    run_until_empty(engine, registry, BURST)
    found = jobs_by_id(engine, [huge_id, wrapped_id])
    (entry,) = found[huge_id].errors or []
    assert entry["class"] == "LookupError"
    assert entry["message"] == "while looking it up"
    tb = entry["traceback"]
    assert len(tb) <= MAX_TRACEBACK_CHARS + 100  # its head, the cut's note, its tail
    assert "characters cut ..." in tb
    # it starts at the handler: no sqla_queue frame above it; the chain is kept
    first_frame = tb.split("File ", 2)[1]
    assert __file__ in first_frame
    assert "in huge" in first_frame
    assert "The above exception was the direct cause" in tb
    assert tb.rstrip().endswith("LookupError: while looking it up")
    assert "/sqla_queue/" not in tb
    (wrapped_entry,) = found[wrapped_id].errors or []
    # with a middleware of the app's own, it starts there (the queue's frames between stay)
    assert "in middleware" in wrapped_entry["traceback"].split("File ", 2)[1]
    assert len(found[huge_id].last_error or "") > MAX_TRACEBACK_CHARS  # last_error unchanged


def test_a_timed_out_attempt_is_an_entry(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="slow", timeout=0.1, max_attempts=1)
    def slow() -> None:
        import time

        time.sleep(0.5)

    (job_id,) = enqueue_jobs(engine, "slow", 1)
    run_until_empty(engine, registry, BURST)
    (entry,) = errors_of(engine, job_id) or []
    assert entry["class"] == "sqla_queue.errors.JobTimeoutError"
    assert entry["attempt"] == 1


def test_a_lost_job_reaped_gets_an_entry(engine: Engine) -> None:
    registry = Registry()
    release: list[bool] = []

    @registry.task(name="hang", retry=NOW, max_attempts=3)
    def hang() -> None:
        wait_for(lambda: release, timeout=60)

    (job_id,) = enqueue_jobs(engine, "hang", 1)
    worker = WorkerThread(engine, registry, heartbeat=0.2, dead_after=1.0)
    with worker:
        wait_for(lambda: jobs_by_id(engine, [job_id])[job_id].started_at is not None)
        holder = jobs_by_id(engine, [job_id])[job_id].locked_by
        # its worker looks dead to a reaper: its lease expired
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE sqla_queue.workers SET expires_at = now() - interval '1 hour';"
                    "UPDATE sqla_queue.jobs SET lease_expires_at = now() - interval '1 hour'"
                )
            )
            reaped = conn.execute(queries.reap_stale_jobs(), {"task_max_attempts": None}).all()
            assert [row.id for row in reaped] == [job_id]
        release.append(True)
    (entry,) = errors_of(engine, job_id) or []
    assert entry["class"] == "JobLost"
    assert entry["attempt"] == 1
    assert entry["worker"] == holder
    assert entry["message"] == f"lease expired: worker {holder} stopped heartbeating"
    assert entry["traceback"] is None


def test_the_archive_keeps_the_history(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "archived", "archive")
    registry = Registry()

    @registry.task(name="once", queue="archived", retry=NOW, pass_context=True)
    def once(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise ValueError("first try")

    (job_id,) = enqueue_jobs(engine, "once", 1, queue="archived")
    run_until_empty(engine, registry, BURST)
    with engine.connect() as conn:
        job = admin.get_job(conn, job_id)
    assert job is not None
    assert job.archived
    assert [(e["attempt"], e["message"]) for e in job.errors or []] == [(1, "first try")]


def failed_job(engine: Engine, message: str, attempts: int = 2) -> int:
    registry = Registry()

    @registry.task(name="bad", retry=NOW, max_attempts=attempts)
    def bad() -> None:
        raise ValueError(message)

    (job_id,) = enqueue_jobs(engine, "bad", 1, max_attempts=attempts)
    run_until_empty(engine, registry, BURST)
    return job_id


def test_jobs_show_prints_each_attempt(database_url: str, engine: Engine) -> None:
    job_id = failed_job(engine, "no such account")
    shown = cli("jobs", "show", str(job_id), url=database_url, catch=True)
    assert shown.exit_code == 0, shown.output
    history = shown.output.split("errors (2 kept):\n", 1)[1]
    lines = history.splitlines()
    assert lines[0].startswith("  attempt 1 ")
    assert lines[0].endswith("ValueError: no such account")
    assert lines[1].startswith("  attempt 2 ")
    assert "Traceback" not in history.split("last_error:")[0]  # one line each by default
    full = cli("jobs", "show", str(job_id), "--traceback", url=database_url, catch=True)
    assert full.exit_code == 0, full.output
    assert full.output.count("Traceback (most recent call last)") >= 3  # 2 entries + last_error
    as_json = json.loads(
        cli("jobs", "show", str(job_id), "--json", url=database_url, catch=True).output
    )
    assert [e["attempt"] for e in as_json["errors"]] == [1, 2]


def test_the_dashboard_lists_each_attempt_escaped(engine: Engine) -> None:
    from starlette.testclient import TestClient

    from sqla_queue.dashboard import create_app

    job_id = failed_job(engine, "<script>alert(1)</script>")
    client = TestClient(create_app(engine))
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert "<script>alert(1)</script>" not in page.text
    assert page.text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 2 * 2  # message, trace
    assert page.text.count('<tr data-attempt="') == 2
    assert page.text.count("<details><summary>traceback") == 2  # each attempt's, folded
