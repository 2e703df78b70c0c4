"""Helpers for the MultiXact and doctor tests: a private PostgreSQL cluster and MultiXact counts.

MultiXact ids and wait events are cluster-wide. The shared test server may serve other test
runs at the same time, so these tests use a cluster of their own (initdb in a temporary
directory, started once per test session) and cannot be disturbed by anybody else's load.
Without the PostgreSQL binaries they fall back to the shared server.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable

from sqlalchemy import Engine, create_engine, pool, select, text
from sqlalchemy.orm import Session

from helpers.fault_kit import free_port
from sqla_queue import Job, enqueue
from sqla_queue.testing import TemplateDatabases

SHARED_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
_started: dict[str, TemplateDatabases] = {}
_lock = threading.Lock()


def _bindir() -> str | None:
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return os.path.dirname(candidates[0]) if candidates else None


def _start_cluster() -> str | None:
    """initdb + pg_ctl start in a temporary directory; returns the admin URL, or None."""
    bindir = _bindir()
    if bindir is None:
        return None
    workdir = tempfile.mkdtemp(prefix="sqlaq-mxact-")
    # PostgreSQL refuses to run as root: run it as the postgres OS user then.
    prefix: list[str] = []
    if os.geteuid() == 0:
        prefix = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(workdir, "data")
    port = free_port()
    log = os.path.join(workdir, "log")
    options = (
        f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c autovacuum=on"
    )
    try:
        if prefix:
            shutil.chown(workdir, user="postgres")
        subprocess.run(
            [*prefix, f"{bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*prefix, f"{bindir}/pg_ctl", "-D", data, "-o", options, "-w", "-l", log, "start"],
            check=True,
            capture_output=True,
        )
    except (OSError, LookupError, subprocess.CalledProcessError):
        shutil.rmtree(workdir, ignore_errors=True)
        return None

    def stop() -> None:
        subprocess.run(
            [*prefix, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(workdir, ignore_errors=True)

    atexit.register(stop)
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def private_databases() -> TemplateDatabases:
    """Migrated template databases on the private cluster, started on first use."""
    with _lock:
        if "dbs" not in _started:
            url = _start_cluster() or os.environ.get("SQLA_QUEUE_TEST_DATABASE_URL", SHARED_URL)
            dbs = TemplateDatabases(url, prefix="sqlaq_mx")
            dbs.create_template()
            atexit.register(dbs.drop_template)
            _started["dbs"] = dbs
        return _started["dbs"]


def admin_engine(database_url: str) -> Engine:
    """An autocommit engine for CHECKPOINT and catalog reads."""
    return create_engine(database_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)


def next_multixact_id(admin: Engine) -> int:
    """The cluster's next MultiXactId as of a CHECKPOINT taken now."""
    with admin.connect() as conn:
        conn.execute(text("CHECKPOINT"))
        value = conn.execute(
            text("SELECT next_multixact_id::text::bigint FROM pg_control_checkpoint()")
        ).scalar_one()
    return int(value)


def count_multixacts(admin: Engine, work: Callable[[], object]) -> int:
    """How many MultiXacts the cluster minted while `work()` ran."""
    before = next_multixact_id(admin)
    work()
    return (next_multixact_id(admin) - before) % 2**32


def run_naive_savepoint_worker(engine: Engine, stop: threading.Event | None = None) -> int:
    """The essay's anti-pattern: lock the job, then update it inside a savepoint.

    Processes queued jobs one by one until none is left (or `stop` is set); returns how
    many it processed.
    """
    processed = 0
    while stop is None or not stop.is_set():
        with Session(engine) as session, session.begin():
            job = session.scalars(
                select(Job)
                .where(Job.status == "queued")
                .order_by(Job.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if job is None:
                return processed
            with session.begin_nested():
                job.status = "done"
                job.attempts += 1
        processed += 1
    return processed


def enqueue_concurrently(
    engine: Engine, sessions: int, rounds: int, queue: str = "default"
) -> None:
    """`sessions` threads each enqueue one job per transaction into `queue`, `rounds` times.

    A barrier holds every transaction open after its insert until all have inserted, so
    the inserts of each round overlap for certain.
    """
    barrier = threading.Barrier(sessions)
    errors: list[BaseException] = []

    def enqueuer() -> None:
        try:
            for _ in range(rounds):
                with Session(engine) as session, session.begin():
                    enqueue(session, "noop", {}, queue=queue)
                    session.flush()
                    barrier.wait(timeout=30)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=enqueuer) for _ in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def tagged_engine(database_url: str, **kwargs: object) -> tuple[Engine, str]:
    """An engine whose sessions carry a unique application_name, and that name."""
    name = f"sqlaq-test-{uuid.uuid4().hex[:8]}"
    engine = create_engine(database_url, connect_args={"application_name": name}, **kwargs)
    return engine, name


def add_queue_fk(engine: Engine) -> None:
    """The foreign key from jobs.queue to queues.name, as a schema before sqlaq_0031 had it
    (a KEY SHARE lock on the queue's row per inserted job)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "ALTER TABLE sqla_queue.jobs ADD CONSTRAINT fk_jobs_queue_queues "
                "FOREIGN KEY (queue) REFERENCES sqla_queue.queues (name) ON UPDATE CASCADE"
            )
        )
