"""Real old code beside head: the package as it was at an earlier commit of this repository
(its own history, `git archive`), installed in a venv of its own, against databases head
migrated.

- new worker + old enqueuer: a job the old code enqueues on a migrated database finishes;
- old worker + new enqueuer: before the migration (the deploy's first moments), the old
  worker finishes a job head enqueued; after it, the old release refuses the newer schema
  in one line, as it was written to (releases before fleet versions know no revision
  kinds: docs/production.md, "Upgrading");
- the revisions as head rewrote them (online) give the schema the old ones gave.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.schema_catalogue import schema_catalogue
from helpers.support import REPO_ROOT, count_where, subprocess_env
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue
from sqla_queue.db import migrate
from sqla_queue.testing import run_until_empty

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the first run builds a venv

OLD_COMMIT = "aaf341e"
"""main before fleet versions: schema revision sqlaq_0017."""
OLD_REVISION = "sqlaq_0017"
OLD_HOME = Path(f"/tmp/sqlaq-old-code-{OLD_COMMIT}")

OLD_ENQUEUE = """
import sys
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqla_queue import enqueue
engine = create_engine(sys.argv[1])
with Session(engine) as session, session.begin():
    print(enqueue(session, "hello", {"who": "old"}, flush=True).id)
"""
OLD_WORKER = """
import sys
from sqlalchemy import create_engine
from sqla_queue import Registry
from sqla_queue.testing import run_until_empty
registry = Registry()
registry.task(name="hello")(lambda who: f"hello {who}")
print(run_until_empty(create_engine(sys.argv[1]), registry).succeeded)
"""
OLD_REVISION_OF = "from sqla_queue.db import migrate; print(migrate.SCHEMA_REVISION)"
OLD_MIGRATE = """
import sys
from sqlalchemy import create_engine
from sqla_queue.db.migrate import upgrade
upgrade(create_engine(sys.argv[1]))
"""


@pytest.fixture(scope="session")
def old_python() -> Path:
    """The old package's interpreter: built once per machine (a file lock keeps two runs
    from building it at once)."""
    OLD_HOME.mkdir(exist_ok=True)
    with open(OLD_HOME / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = OLD_HOME / "venv" / "bin" / "python"
        if not (OLD_HOME / "ready").exists():
            source = OLD_HOME / "src"
            source.mkdir(exist_ok=True)
            archive = subprocess.run(
                ["git", "-C", str(REPO_ROOT), "archive", OLD_COMMIT],
                capture_output=True,
                check=True,
            )
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
            subprocess.run([sys.executable, "-m", "venv", str(OLD_HOME / "venv")], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", str(source)],
                check=True,
                capture_output=True,
                timeout=900,
            )
            (OLD_HOME / "ready").touch()
    return python


def run_old(python: Path, script: str, url: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(url)
    env.pop("PYTHONPATH", None)  # the old package only, not this checkout
    return subprocess.run(
        [str(python), "-c", script, url],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )


def hello_registry() -> Registry:
    registry = Registry()
    registry.task(name="hello")(lambda who: f"hello {who}")
    return registry


@pytest.fixture
def empty_engine(empty_database_url: str) -> Iterator[Engine]:
    eng = create_engine(empty_database_url)
    yield eng
    eng.dispose()


def test_the_old_package_is_the_old_release(old_python: Path) -> None:
    found = subprocess.run(
        [
            str(old_python),
            "-c",
            "from sqla_queue.db import migrate; print(migrate.SCHEMA_REVISION)",
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert found.stdout.strip() == OLD_REVISION, found.stderr


def test_new_worker_finishes_what_the_old_code_enqueues_on_a_migrated_database(
    old_python: Path, database_url: str, engine: Engine
) -> None:
    enqueued = run_old(old_python, OLD_ENQUEUE, database_url)
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = int(enqueued.stdout.strip())
    with engine.connect() as conn:
        assert migrate.check_schema(conn) == migrate.SCHEMA_REVISION
    stats = run_until_empty(engine, hello_registry())
    assert stats.succeeded == 1
    assert count_where(engine, f"id = {job_id} AND status <> 'done'") == 0  # done, or deleted


def test_old_worker_finishes_what_head_enqueues_until_the_schema_moves_past_it(
    old_python: Path, empty_database_url: str, empty_engine: Engine
) -> None:
    migrate.upgrade(empty_engine, OLD_REVISION)  # the database as the old release left it
    with Session(empty_engine) as session, session.begin():
        enqueue(session, "hello", {"who": "new"})
    worked = run_old(old_python, OLD_WORKER, empty_database_url)
    assert worked.returncode == 0, worked.stderr
    assert worked.stdout.strip() == "1"
    assert count_where(empty_engine, "status = 'queued'") == 0

    migrate.upgrade(empty_engine)  # head migrates: the old release no longer claims
    with Session(empty_engine) as session, session.begin():
        enqueue(session, "hello", {"who": "new"})
    refused = subprocess.run(
        [
            str(old_python.with_name("sqla-queue")),
            "worker",
            "--burst",
            "--app",
            "helpers.apps.tasks:registry",
        ],
        env={**subprocess_env(empty_database_url), "PYTHONPATH": str(REPO_ROOT / "tests")},
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert refused.returncode != 0
    # one line of refusal (after INFO lines Alembic's plugins log as the old worker starts)
    lines = [line for line in refused.stderr.strip().splitlines() if " INFO " not in line]
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("Error: ")
    assert migrate.SCHEMA_REVISION in lines[0]
    assert count_where(empty_engine, "status = 'queued'") == 1  # waits for a new worker
    assert run_until_empty(empty_engine, hello_registry()).succeeded == 1


def test_the_rewritten_revisions_give_the_old_releases_schema(
    old_python: Path, empty_database_url: str, empty_engine: Engine, database_url: str
) -> None:
    made = run_old(old_python, OLD_MIGRATE, empty_database_url)
    assert made.returncode == 0, made.stderr
    ours = create_engine(database_url)
    try:
        migrate.downgrade(ours, OLD_REVISION)
        old, new = schema_catalogue(empty_engine), schema_catalogue(ours)
    finally:
        ours.dispose()
    for kind in old:
        assert new[kind] == old[kind], kind
