"""`--log-format json`: one JSON object per line, one line per finished job with its fields."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from apps.support import REPO_ROOT, enqueue_jobs, subprocess_env
from sqlalchemy import Engine


def run_worker(database_url: str, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_queue", *options],
        env=subprocess_env(database_url, **env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of `stderr` as a JSON object (fails on any line that is not one)."""
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def test_json_log_lines_carry_each_finished_jobs_fields(engine: Engine, database_url: str) -> None:
    (ok_id,) = enqueue_jobs(engine, "ok", 1)
    (flaky_id,) = enqueue_jobs(engine, "flaky", 1)
    (boom_id,) = enqueue_jobs(engine, "boom", 1)

    result = run_worker(
        database_url, "worker", "--app", "apps.observed:registry", "--burst", "--log-format", "json"
    )

    assert result.returncode == 0, result.stderr
    records = json_lines(result.stderr)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(" started: " in r["message"] for r in records)
    jobs = [r for r in records if r["logger"] == "sqla_queue.jobs"]
    seen = {(r["job_id"], r["attempt"]): r for r in jobs}
    assert set(seen) == {(ok_id, 1), (flaky_id, 1), (boom_id, 1)}
    assert seen[ok_id, 1]["outcome"] == "succeeded"
    assert seen[ok_id, 1]["task"] == "ok"
    assert seen[ok_id, 1]["queue"] == "default"
    assert seen[flaky_id, 1]["outcome"] == "retried"
    assert seen[boom_id, 1]["outcome"] == "failed"
    assert all(0 <= r["duration_seconds"] < 60 for r in jobs)
    (done,) = [r for r in records if r["message"].startswith("done: ")]
    assert (done["succeeded"], done["retried"], done["failed"]) == (1, 1, 1)

    # A burst worker stops once its last claim found nothing, before the retry it wrote
    # is claimed: the next run takes the second attempt.
    again = run_worker(
        database_url, "worker", "--app", "apps.observed:registry", "--burst", "--log-format", "json"
    )
    retried = [r for r in json_lines(again.stderr) if r["logger"] == "sqla_queue.jobs"]
    assert [(r["job_id"], r["attempt"], r["outcome"]) for r in retried] == [
        (flaky_id, 2, "succeeded")
    ]


def test_the_log_format_may_be_given_to_sqla_queue_itself_or_by_environment(
    engine: Engine, database_url: str
) -> None:
    enqueue_jobs(engine, "ok", 1)
    before = run_worker(
        database_url, "--log-format", "json", "worker", "--app", "apps.observed:registry", "--burst"
    )
    assert before.returncode == 0, before.stderr
    assert [r["outcome"] for r in json_lines(before.stderr) if "outcome" in r] == ["succeeded"]

    by_env = run_worker(
        database_url,
        *("worker", "--app", "apps.observed:registry", "--burst"),
        SQLA_QUEUE_LOG_FORMAT="json",
    )
    assert by_env.returncode == 0, by_env.stderr
    assert json_lines(by_env.stderr)


def test_the_default_log_format_stays_human_readable(engine: Engine, database_url: str) -> None:
    enqueue_jobs(engine, "ok", 1)
    result = run_worker(database_url, "worker", "--app", "apps.observed:registry", "--burst")
    assert result.returncode == 0, result.stderr
    started = [line for line in result.stderr.splitlines() if " started: " in line]
    assert started
    assert not started[0].lstrip().startswith("{")
    assert "done: 1 succeeded, 0 retried, 0 failed" in result.stderr
