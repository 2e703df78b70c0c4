"""The dashboard's job page explains the job (issue 38): its kept result, its attempts and
their budget, the error that matters (a done job's old error under its history), tracebacks
from the user's frame (the queue's own folded), its progress and its attempts' log lines;
the jobs page's dates compact, with the exact time on hover."""

from __future__ import annotations

import datetime as dt
import re

from helpers.apps import journaled
from helpers.dashboard_kit import client
from helpers.support import enqueue_jobs, keep_jobs, make_due
from sqlalchemy import Engine, text

from sqla_queue.dashboard.rendering import HEADLINE_CHARS, ago, headline, traceback_parts


def section(page: str, heading: str) -> str:
    """The page's text from `<h2>heading</h2>` to the next heading."""
    found = re.search(rf"<h2>{re.escape(heading)}</h2>(.*?)(?=<h2>|$)", page, re.S)
    assert found, f"no section {heading!r}"
    return found.group(1)


def test_the_job_page_shows_the_kept_result_progress_and_attempts_of_their_budget(
    engine: Engine,
) -> None:
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.tight", 1, args={"calls": 50}, max_attempts=5)
    journaled.run_journaled(engine)
    page = client(engine).get(f"/jobs/{job_id}").text
    assert '<dd id="attempts">1 of 5</dd>' in page
    assert "&#34;writes&#34;: 1" in section(page, "Result")
    progress = section(page, "Progress")
    assert '<progress max="1" value="1.0">' in progress
    assert "100%" in progress
    assert "call 50" in progress
    assert "(attempt 1, " in progress


def test_a_done_jobs_old_error_is_under_its_history_and_its_logs_per_attempt(
    engine: Engine,
) -> None:
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.chatty", 1)
    journaled.run_journaled(engine)
    make_due(engine)
    journaled.run_journaled(engine)
    page = client(engine).get(f"/jobs/{job_id}").text
    assert "<h2>Error</h2>" not in page  # it succeeded: no error stands as the job's
    history = section(page, "Attempts that failed")
    assert "It succeeded since" in history
    assert "RuntimeError</span>: first attempt fails" in history
    for attempt in (1, 2):
        log = section(page, f"Log of attempt {attempt}")
        assert f"attempt {attempt} starts" in log
        assert "lookup failed\nTraceback (most recent call last):" in log
        assert "103 more line(s) not kept" in log


def test_a_failed_jobs_error_starts_at_the_users_frame_with_the_queues_frames_folded(
    engine: Engine,
) -> None:
    keep_jobs(engine)
    (job_id,) = enqueue_jobs(engine, "journal.bad_progress", 1, args={"fraction": 2})
    journaled.run_journaled(engine)
    page = client(engine).get(f"/jobs/{job_id}").text
    error = section(page, "Error")
    folded = re.findall(
        r'<details class="queue-frames"><summary>(\d+) frame\(s\) of sqla-queue', error
    )
    assert folded, error
    shown = re.sub(r'<details class="queue-frames">.*?</details>', "", error, flags=re.S)
    assert "journaled.py" in shown  # the user's frame, outside the fold
    assert "sqla_queue/job/run.py" not in shown
    assert "ValueError: ctx.progress(fraction) must be from 0 to 1" in shown


def test_traceback_parts_fold_runs_of_the_queues_frames_only() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/srv/venv/lib/sqla_queue/job/run.py", line 150, in _run\n'
        "    result = func(**job.args)\n"
        "             ^^^^^^^^^^^^^^^^\n"
        '  File "/srv/app/mail.py", line 9, in send\n'
        "    raise KeyError('smtp')\n"
        "KeyError: 'smtp'"
    )
    parts = traceback_parts(text)
    assert [kind for kind, _ in parts] == ["user", "queue", "user"]
    assert parts[1][1].count('File "') == 1
    assert parts[2][1].endswith("KeyError: 'smtp'")
    assert "\n".join(lines for _, lines in parts) == text  # nothing lost


def test_the_jobs_page_shows_dates_compact_with_the_exact_time_on_hover(engine: Engine) -> None:
    enqueue_jobs(engine, "journal.resize", 1, delay=7200)
    page = client(engine).get("/jobs").text
    cell = re.search(
        r'<td class="when"><time datetime="[^"]+" title="([^"]+)">([^<]+)</time>', page
    )
    assert cell, page
    assert cell.group(1).endswith(" UTC")
    assert cell.group(2) in ("in 2.0 h", "in 120 min", "in 119 min")
    now = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
    assert "42 s ago" in ago(now - dt.timedelta(seconds=42), now)
    assert "in 5 min" in ago(now + dt.timedelta(minutes=5), now)


# -- the doctor page ----------------------------------------------------------------------------


def test_doctor_findings_are_a_short_headline_and_a_fix_with_the_figures_folded(
    engine: Engine,
) -> None:
    failed_ids = enqueue_jobs(engine, "journal.resize", 3)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'failed', attempts = 1, "
                "finished_at = now() - interval '8 days', last_error = 'boom' WHERE id = ANY(:ids)"
            ),
            {"ids": failed_ids},
        )
    page = client(engine).get("/doctor").text
    rows = re.findall(r'<tr class="(\w+)" data-check="(\w+)">(.*?)</tr>', page, re.S)
    assert len(rows) > 10
    severities = [severity for severity, _, _ in rows]
    assert severities == sorted(severities, key=["critical", "warn", "ok"].index)  # worst first
    for _, name, row in rows:
        head = re.search(r'<div class="headline">(.*?)</div>', row, re.S)
        assert head, name
        assert len(head.group(1)) <= HEADLINE_CHARS + 2, (name, head.group(1))
    failed = {name: row for _, name, row in rows}["failed_jobs"]
    assert "<strong>Fix:</strong>" in failed
    assert "sqla-queue prune --status failed --older-than 7d" in failed


def test_a_long_finding_is_cut_after_its_first_clause() -> None:
    text = (
        "3 table(s) of the queue are above their bloat bound: "
        "sqla_queue.jobs 120 MB of which 80 MB dead, "
        "sqla_queue.jobs_archive 3 GB, sqla_queue.job_counts 40 MB; autovacuum last ran 3 d ago"
    )
    head, rest = headline(text)
    assert head == "3 table(s) of the queue are above their bloat bound …"
    assert rest.startswith("sqla_queue.jobs 120 MB")
    assert headline("short") == ("short", "")
