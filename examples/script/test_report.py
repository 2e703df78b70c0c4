"""The plain script's tests: its function on a database of the test's own, and the script itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sqla_queue.testing import assert_not_enqueued

from .report import REGIONS, Tally, main, run_report

REPO_ROOT = Path(__file__).resolve().parents[2]


def _tallies(engine: Engine) -> list[tuple[str, str]]:
    with Session(engine) as session:
        return sorted(
            (day, region) for day, region in session.execute(select(Tally.day, Tally.region))
        )


def test_report_tallies_every_region_once(sqla_queue_engine: Engine) -> None:
    stats = run_report(sqla_queue_engine, "2026-11-30")
    assert (stats.succeeded, stats.failed) == (len(REGIONS), 0)
    assert _tallies(sqla_queue_engine) == sorted(("2026-11-30", r) for r in REGIONS)
    assert_not_enqueued(sqla_queue_engine, status=None)


def test_main_reports_and_a_second_day_adds_its_own(
    sqla_queue_engine: Engine, sqla_queue_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", sqla_queue_database_url, "--day", "2026-11-29"]) == 0
    assert main(["--database-url", sqla_queue_database_url, "--day", "2026-11-30"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "2026-11-29: 4 regions tallied, 0 failed",
        "2026-11-30: 4 regions tallied, 0 failed",
    ]
    assert len(_tallies(sqla_queue_engine)) == 2 * len(REGIONS)


def test_the_script_runs_as_a_module(sqla_queue_database_url: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "examples.script.report", "--day", "2026-01-01"],
        cwd=REPO_ROOT,
        env={"SQLA_QUEUE_DATABASE_URL": sqla_queue_database_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "2026-01-01: 4 regions tallied, 0 failed"
