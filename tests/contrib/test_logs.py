"""`--log-format json`: one JSON object per line, one line per finished job with its fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from helpers.fault_kit import run_cli
from helpers.support import enqueue_jobs
from sqlalchemy import Engine


def run_worker(database_url: str, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(options, database_url, timeout=120, **env)


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of `stderr` as a JSON object (fails on any line that is not one)."""
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def test_json_log_lines_carry_each_finished_jobs_fields(engine: Engine, database_url: str) -> None:
    (ok_id,) = enqueue_jobs(engine, "ok", 1)
    (flaky_id,) = enqueue_jobs(engine, "flaky", 1)
    (boom_id,) = enqueue_jobs(engine, "boom", 1)
    burst = ("worker", "--app", "helpers.apps.observed:registry", "--burst", "--log-format", "json")

    result = run_worker(database_url, *burst)
    # A burst worker may stop before it claims the retry it wrote: a second run takes it.
    again = run_worker(database_url, *burst)

    assert result.returncode == 0, result.stderr
    assert again.returncode == 0, again.stderr
    records = json_lines(result.stderr) + json_lines(again.stderr)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(" started: " in r["message"] for r in records)
    jobs = [r for r in records if r["logger"] == "sqla_queue.jobs"]
    seen = {(r["job_id"], r["attempt"]): r for r in jobs}
    assert len(jobs) == len(seen) == 4
    assert set(seen) == {(ok_id, 1), (flaky_id, 1), (flaky_id, 2), (boom_id, 1)}
    assert seen[ok_id, 1]["outcome"] == "succeeded"
    assert seen[ok_id, 1]["task"] == "ok"
    assert seen[ok_id, 1]["queue"] == "default"
    assert seen[flaky_id, 1]["outcome"] == "retried"
    assert seen[flaky_id, 2]["outcome"] == "succeeded"
    assert seen[boom_id, 1]["outcome"] == "failed"
    assert all(0 <= r["duration_seconds"] < 60 for r in jobs)
    done = [r for r in records if r["message"].startswith("done: ")]
    assert len(done) == 2
    assert sum(r["succeeded"] for r in done) == 2
    assert sum(r["retried"] for r in done) == 1
    assert sum(r["failed"] for r in done) == 1


def test_the_log_format_may_be_given_to_sqla_queue_itself_or_by_environment(
    engine: Engine, database_url: str
) -> None:
    enqueue_jobs(engine, "ok", 1)
    before = run_worker(
        database_url,
        "--log-format",
        "json",
        "worker",
        "--app",
        "helpers.apps.observed:registry",
        "--burst",
    )
    assert before.returncode == 0, before.stderr
    assert [r["outcome"] for r in json_lines(before.stderr) if "outcome" in r] == ["succeeded"]

    by_env = run_worker(
        database_url,
        *("worker", "--app", "helpers.apps.observed:registry", "--burst"),
        SQLA_QUEUE_LOG_FORMAT="json",
    )
    assert by_env.returncode == 0, by_env.stderr
    assert json_lines(by_env.stderr)


def test_the_default_log_format_stays_human_readable(engine: Engine, database_url: str) -> None:
    enqueue_jobs(engine, "ok", 1)
    result = run_worker(
        database_url, "worker", "--app", "helpers.apps.observed:registry", "--burst"
    )
    assert result.returncode == 0, result.stderr
    started = [line for line in result.stderr.splitlines() if " started: " in line]
    assert started
    assert not started[0].lstrip().startswith("{")
    assert "done: 1 succeeded, 0 retried, 0 failed" in result.stderr


TEXT_LOG_SCRIPT = """
import logging
from sqla_queue.contrib.logs import configure_logging
configure_logging("info", "text")
log = logging.getLogger("app.mail")
log.warning("%s", "x" * 300)
try:
    raise KeyError("smtp")
except KeyError:
    log.exception("sending failed\\nsecond line")
log.info("after")
"""


def test_text_logs_off_a_terminal_are_one_line_per_record_with_tracebacks_indented() -> None:
    # stderr is a pipe, as under systemd or Docker: no 80-column wrap, no rich layout
    result = subprocess.run(
        [sys.executable, "-c", TEXT_LOG_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    records = [line for line in lines if not line.startswith(" ")]
    assert len(records) == 3, lines
    assert records[0].endswith("WARNING app.mail: " + "x" * 300)
    assert records[1].endswith("ERROR   app.mail: sending failed\\nsecond line")
    assert records[2].endswith("INFO    app.mail: after")
    traceback = lines[lines.index(records[1]) + 1 : lines.index(records[2])]
    assert traceback[0] == "    Traceback (most recent call last):"
    assert traceback[-1] == "    KeyError: 'smtp'"
    assert all(line.startswith("    ") for line in traceback)
