"""A server that turns read-only under a running worker: what a client sees after its
connection string fails over to a standby, or while a primary is demoted
(`default_transaction_read_only = on`, set by ALTER SYSTEM and a reload on a private cluster,
so the worker's open sessions see it at once). The worker says so in one line per part, not
a traceback per attempt; `/readyz` answers 503; no job is lost; once the server is writable
again the worker drains the rest without a restart."""

from __future__ import annotations

import re

import pytest
from helpers.fault_kit import (
    FaultDatabase,
    PrivateCluster,
    WorkerProcess,
    executions,
    fill_kept_queue,
    free_port,
    libpq_dsn,
    wait_until,
)
from helpers.support import answers_with, http_get
from sqlalchemy import create_engine

from sqla_queue.db.migrate import upgrade

pytestmark = pytest.mark.slow

JOBS = 300


def _set_read_only(cluster: PrivateCluster, on: bool) -> None:
    import psycopg

    with psycopg.connect(libpq_dsn(cluster.url), autocommit=True) as conn:
        # the admin session itself would be read-only now: say so for this one
        conn.execute("SET default_transaction_read_only = off")
        conn.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
        conn.execute("SELECT pg_reload_conf()")


def test_worker_waits_out_a_read_only_server_and_resumes_when_it_is_writable(
    cluster: PrivateCluster, workers: object
) -> None:
    cluster.start()
    cluster.create_database()
    engine = create_engine(cluster.url)
    upgrade(engine)
    engine.dispose()
    db = FaultDatabase(cluster.url)
    try:
        ids = fill_kept_queue(
            cluster.url, "failover", "record", [{"n": n, "work": 0.02} for n in range(JOBS)]
        )
        port = free_port()
        start = workers  # the conftest fixture: starts a worker process, stops it at the end
        worker: WorkerProcess = start(  # type: ignore[operator]
            cluster.url, "-q", "failover", "-c", "2", "--batch", "5", "--poll-interval", "0.5",
            "--health-port", str(port),
        )  # fmt: skip
        wait_until(lambda: answers_with(port, "/readyz", 200), 60, what="the worker to be ready")
        wait_until(lambda: len(executions(db)) >= 20, 60, what="the first jobs to run")

        _set_read_only(cluster, True)
        wait_until(lambda: answers_with(port, "/readyz", 503), 60, what="/readyz to answer 503")
        status, report = http_get(port, "/readyz")
        assert status == 503
        assert "read-only" in report["database"]
        stalled = db.value("SELECT count(*) FROM sqla_queue.all_jobs WHERE status = 'done'")
        # It stays up, and claims nothing while the server refuses writes.
        wait_until(lambda: "read-only" in worker.log(), 60, what="the read-only log line")
        assert worker.alive()
        assert db.value("SELECT count(*) FROM sqla_queue.all_jobs WHERE status = 'done'") == stalled
        assert db.unfinished() > 0  # there is something left to resume

        _set_read_only(cluster, False)
        wait_until(lambda: not db.unfinished(), 90, what="the rest to run once writable")
        wait_until(lambda: answers_with(port, "/readyz", 200), 60, what="/readyz to recover")
        assert worker.alive()
        assert db.status_counts() == {"done": JOBS}
        assert set(executions(db)) == set(ids)

        log = worker.log()
        lines = [line for line in log.splitlines() if line.startswith("20")]
        # the handlers in flight at the switch failed once each (their own writes refused)
        handler_failures = re.findall(r"job (\d+) \(record\) attempt \d+ of 100 failed", log)
        assert len(handler_failures) == len(set(handler_failures)) <= 20
        # the worker's own parts: one line each that met it, never one per attempt
        own = [line for line in lines if "read-only" in line and " (record) " not in line]
        assert 1 <= len(own) <= 3, own
        # no traceback but the handlers' own
        # (off a terminal a record and its traceback are one line, its breaks written \n)
        assert log.count("Traceback (most recent call last)") == len(handler_failures)
        assert "reachable again" in log
        assert worker.stop() == 0

        # A worker started on a server that is read-only already waits to register, then runs.
        later = fill_kept_queue(cluster.url, "failover", "record", [{"n": n} for n in range(20)])
        _set_read_only(cluster, True)
        second: WorkerProcess = start(  # type: ignore[operator]
            cluster.url, "-q", "failover", "--poll-interval", "0.5"
        )
        wait_until(lambda: "could not start" in second.log(), 60, what="the start's log line")
        assert second.alive()
        assert db.unfinished() == len(later)
        _set_read_only(cluster, False)
        wait_until(lambda: not db.unfinished(), 60, what="the later jobs to run")
        assert set(executions(db)) == set(ids) | set(later)
        assert second.log().count("could not start") == 1, second.log()
        assert second.log().count("reachable again") == 1, second.log()
        assert second.stop() == 0
    finally:
        db.close()
