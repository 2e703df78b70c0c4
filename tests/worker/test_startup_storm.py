"""A start-up storm: six worker processes of `-c 50` started at once against a private
cluster with `max_connections = 100`, their handlers each holding a connection of their own
(as an application pool sized to `-c` does): 6 x (50 + the worker's own) wanted, 100 there.
A worker that gets no connection waits with one line and backoff; none exits or
crash-loops; every job finishes once the storm settles."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from helpers.fault_kit import (
    FaultDatabase,
    PrivateCluster,
    WorkerProcess,
    executions,
    fill_kept_queue,
    libpq_dsn,
    wait_until,
)
from sqlalchemy import create_engine, pool

from sqla_queue.db.migrate import upgrade

pytestmark = pytest.mark.slow

WORKERS = 6
CONCURRENCY = 50
MAX_CONNECTIONS = 100
JOBS = 1200
HOLD = 1.0
"""Seconds each handler holds its connection: long enough for 300 handlers to want one at once."""


def _limit_connections(cluster: PrivateCluster) -> None:
    import psycopg

    with psycopg.connect(libpq_dsn(cluster.url).rsplit("/", 1)[0] + "/postgres") as conn:
        conn.autocommit = True
        conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
    cluster.stop()
    cluster.start()


def test_a_start_up_storm_past_max_connections_waits_and_drains(
    cluster: PrivateCluster, workers: Callable[..., WorkerProcess]
) -> None:
    cluster.start()
    _limit_connections(cluster)
    cluster.create_database()
    engine = create_engine(cluster.url, poolclass=pool.NullPool)
    upgrade(engine)
    engine.dispose()
    db = FaultDatabase(cluster.url)
    try:
        assert db.value("SHOW max_connections") == str(MAX_CONNECTIONS)
        ids = fill_kept_queue(
            cluster.url,
            "storm",
            "hold_connection",
            [{"n": n, "seconds": HOLD} for n in range(JOBS)],
        )
        # The server full before they start (the old pods of a rolling restart still up):
        # every worker waits at its first connection, one line each, and stays up.
        held = _fill_the_server(cluster)
        options = ["-q", "storm", "-c", str(CONCURRENCY), "--batch", "10", "--poll-interval", "0.5"]
        fleet = [workers(cluster.url, *options) for _ in range(WORKERS)]
        try:
            for worker in fleet:
                wait_until(
                    lambda w=worker: "database unavailable" in w.log(), 60, what="a wait line"
                )
            assert all(w.alive() for w in fleet)
            assert db.unfinished() == JOBS
        finally:
            for conn in held:
                conn.close()
        wait_until(lambda: not db.unfinished(), 240, interval=0.5, what="every job to finish")
        assert db.status_counts() == {"done": JOBS}
        assert set(executions(db)) == set(ids)
        refused = [_own_refusals(w.log()) for w in fleet]
        snoozed = sum(w.log().count("no connection for the handler") for w in fleet)
        # the server really ran out: workers or handlers were refused connections
        assert sum(map(len, refused)) + snoozed > 0, "no storm: nothing was refused"
        for worker, lines in zip(fleet, refused, strict=True):
            assert worker.alive(), worker.log()[-3000:]
            assert worker.starts == 1
            # one line per part of the worker that was refused (its first connection, keeper,
            # listener, the start), not one per attempt
            assert 1 <= len(lines) <= 6, lines
            assert worker.log().count("database unavailable") == 1
            assert "Traceback" not in worker.log(), worker.log()[-3000:]
            worker.wait_started()
        for worker in fleet:
            worker.signal(15)
        for worker in fleet:
            assert worker.proc is not None
            try:
                assert worker.proc.wait(60) == 0, worker.log()[-3000:]
            except subprocess.TimeoutExpired:
                pytest.fail(f"worker {worker.pid} did not stop after SIGTERM")
    finally:
        db.close()


def _fill_the_server(cluster: PrivateCluster) -> list[Any]:
    """Connections opened until the server refuses one: it has no room left."""
    import psycopg

    held: list[Any] = []
    with pytest.raises(psycopg.OperationalError, match="too many clients"):  # noqa: PT012
        while len(held) < MAX_CONNECTIONS:
            held.append(psycopg.connect(libpq_dsn(cluster.url), autocommit=True))
    return held


def _own_refusals(log: str) -> list[str]:
    """The worker's own lines about a refused connection (not its handlers' snoozes)."""
    return [
        line
        for line in log.splitlines()
        if re.search(r"too many clients|remaining connection slots", line)
        and "no connection for the handler" not in line
        and line.startswith("20")
    ]
