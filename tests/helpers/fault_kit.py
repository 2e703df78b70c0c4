"""Helpers of the fault-injection tests: worker processes, the test's own record, waiting."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from helpers.apps.fault_app import create_fault_tables
from sqla_queue import admin, enqueue_many

TESTS_DIR = Path(__file__).resolve().parents[1]


def libpq_dsn(url: str) -> str:
    """The SQLAlchemy URL of a test database as a plain libpq URL, for psycopg.connect."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def cli_env(url: str | None = None, **extra: str) -> dict[str, str]:
    """Environment of a `sqla-queue` subprocess: tests/ importable, wide unwrapped log lines."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "400"
    env.pop("SQLA_QUEUE_DATABASE_URL", None)
    if url is not None:
        env["SQLA_QUEUE_DATABASE_URL"] = url
        env["FAULT_APP_DSN"] = libpq_dsn(url)
    env.update(extra)
    return env


def run_cli(
    args: Sequence[str], url: str | None = None, timeout: float = 60, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m sqla_queue ARGS` to completion; returns its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "sqla_queue", *args],
        env=cli_env(url, **extra),
        cwd=TESTS_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class WorkerProcess:
    """One `sqla-queue worker` process with its output in a log file."""

    def __init__(
        self,
        url: str,
        log_path: Path,
        *options: str,
        app: str = "helpers.apps.fault_app:registry",
        app_dsn: str | None = None,
    ):
        self.url = url
        self.app_dsn = app_dsn
        self.log_path = log_path
        self.command = [sys.executable, "-m", "sqla_queue", "worker", "--app", app, *options]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> WorkerProcess:
        log = self.log_path.open("ab")
        log.write(b"--- (re)start ---\n")
        log.flush()
        self.proc = subprocess.Popen(
            self.command,
            env=cli_env(self.url, **({"FAULT_APP_DSN": self.app_dsn} if self.app_dsn else {})),
            cwd=TESTS_DIR,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no release; only the reaper can bring its jobs back."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit status (killed if it does not exit in time)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise
        return self.proc.returncode

    def wait_started(self, timeout: float = 60) -> None:
        """Until its latest start has logged 'started' (signal handlers are in place); a start
        takes tens of seconds on a loaded machine, and the deadline only matters on failure."""
        wait_until(
            lambda: " started: " in self.log().rpartition("--- (re)start ---")[2],
            timeout,
            what=f"worker {self.pid} to start",
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def wait_until(
    condition: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll `condition` until it returns something truthy; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


class FaultDatabase:
    """A migrated test database plus the test's own record tables (see fault_app)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dsn = libpq_dsn(url)
        self.name = make_url(url).database
        create_fault_tables(self.dsn)
        self.conn = psycopg.connect(self.dsn, autocommit=True)

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def value(self, sql: str, *params: Any) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def status_counts(self) -> dict[str, int]:
        """Jobs by status, live or finished (the jobs table and the history)."""
        found = self.value("SELECT to_regclass('sqla_queue.all_jobs') IS NOT NULL")
        every_job = "sqla_queue.all_jobs" if found else "sqla_queue.jobs"  # an older schema
        return dict(self.rows(f"SELECT status, count(*) FROM {every_job} GROUP BY status"))

    def unfinished(self) -> int:
        return int(
            self.value("SELECT count(*) FROM sqla_queue.jobs WHERE status IN ('queued', 'running')")
        )

    def events(self, job_id: int) -> list[tuple[int, str]]:
        """(attempt, event) of one job, in order."""
        return [
            (attempt, event)
            for attempt, event in self.rows(
                "SELECT attempt, event FROM public.fault_runs WHERE job_id = %s ORDER BY at",
                job_id,
            )
        ]

    def close(self) -> None:
        self.conn.close()


def holding_workers(db: FaultDatabase, pool: list[WorkerProcess]) -> list[WorkerProcess]:
    """The workers of `pool` that hold a running job now (worker ids are host:pid:...)."""
    holders = {
        row[0]
        for row in db.rows(
            "SELECT DISTINCT locked_by FROM sqla_queue.jobs WHERE status = 'running'"
        )
    }
    return [w for w in pool if w.alive() and any(f":{w.pid}:" in h for h in holders)]


def fill_kept_queue(url: str, queue: str, task: str, args: list[dict[str, Any]]) -> list[int]:
    """Create `queue` (retention keep, so finished rows stay to be counted) and fill it."""
    engine = create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            admin.create_queue(session, queue, "keep")
            return enqueue_many(session, [{"task": task, "queue": queue, "args": a} for a in args])
    finally:
        engine.dispose()


def executions(db: FaultDatabase) -> dict[int, int]:
    """How many times each job's handler ran to the end, by job id."""
    return dict(
        db.rows("SELECT job_id, count(*) FROM public.fault_runs WHERE event = 'ran' GROUP BY 1")
    )


PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports that are free now, below the kernel's
    ephemeral range: a server told to listen on PORT + N (`--processes` with
    `--health-port`) must not meet a port an outgoing connection took meanwhile, nor a
    connection to a port with no listener yet that the kernel joined to itself (the
    request read back as the answer: `BadStatusLine: GET /readyz`)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(1000):
        first = rng.randrange(10_000, low - count)
        if all(port_is_free(port) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def port_is_free(port: int) -> bool:
    """Whether a server could listen on PORT now (SO_REUSEADDR, as http.server sets: the
    connections the health server closed linger in TIME_WAIT)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class PrivateCluster:
    """A PostgreSQL cluster of the test's own (initdb/pg_ctl as the `postgres` OS user in a
    temporary directory it owns, on a free port), to stop and start without touching the
    machine's main server."""

    def __init__(self, password: str | None = None) -> None:
        if os.geteuid() != 0 or not (PG_BIN / "initdb").exists() or not shutil.which("runuser"):
            pytest.skip("needs root, runuser and PostgreSQL 15 binaries to run a private cluster")
        self.dir = Path(tempfile.mkdtemp(prefix="sqlaq-cluster-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = free_port()
        self.password = password
        user = "postgres" if password is None else f"postgres:{password}"
        self.url = f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/faults"
        auth = ["-A", "trust"]
        if password is not None:  # TCP connections must prove the password
            pwfile = self.dir / "pwfile"
            pwfile.write_text(password)
            shutil.chown(pwfile, "postgres", "postgres")
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        self._as_postgres(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", *auth,
            "--no-sync", "--no-instructions",
        )  # fmt: skip

    def _as_postgres(self, *command: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *command],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off"
        )
        self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.dir / "server.log"), "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self) -> None:
        """Fast shutdown: every session is terminated, as when the server goes away."""
        self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"
        )  # fmt: skip

    def create_database(self) -> None:
        admin = make_url(self.url).set(drivername="postgresql", database="postgres")
        with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as c:
            c.execute("CREATE DATABASE faults")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(self.data),
                 "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)
