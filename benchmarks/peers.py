"""Peers in the same run: pgqueuer and procrastinate, each in a database of its own on the
same server, draining the same no-op jobs at the same batch size and concurrency, and
bulk-enqueuing the same rows (`pip install -e '.[bench]'` installs both).

Each peer is driven through its own public API (schema install, bulk enqueue, worker); only
the deep backlog is inserted with one SQL statement into its table, as the harness does for
sqla-queue, because enqueuing 1,000,000 jobs through any library's API would measure the
enqueue path, not the drain. A peer that is not installed, or fails, is reported with the
reason instead of being dropped.

`python -m benchmarks.peers worker NAME DSN CONCURRENCY BATCH` runs one peer's worker until
SIGTERM (the harness starts it as a process of its own, as it does sqla-queue's worker).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

import psycopg

NAMES = ("pgqueuer", "procrastinate")


@dataclass(frozen=True)
class Peer:
    name: str
    table: str
    """Its jobs table (in the public schema of its own database)."""
    pending: str
    """SQL counting the jobs not yet finished."""
    backlog: str
    """SQL inserting %s queued no-op jobs `{"n": g}` in one statement."""
    batch_note: str
    """What the batch size means for this peer."""
    finish_note: str
    """What happens to a finished job by default."""


PEERS = {
    "pgqueuer": Peer(
        name="pgqueuer",
        table="pgqueuer",
        pending="SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')",
        backlog=(
            "INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
            "SELECT 0, 'noop', convert_to(json_build_object('n', g)::text, 'UTF8'), 'queued' "
            "FROM generate_series(1, %s) g"
        ),
        batch_note="QueueManager.run(batch_size=B, max_concurrent_tasks=max(C, 2B)): "
        "pgqueuer refuses a cap below twice the batch",
        finish_note="deleted from pgqueuer, a row logged in pgqueuer_log",
    ),
    "procrastinate": Peer(
        name="procrastinate",
        table="procrastinate_jobs",
        pending="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        backlog=(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
            "SELECT 'default', 'noop', jsonb_build_object('n', g) FROM generate_series(1, %s) g"
        ),
        batch_note="no batch setting: each of the C concurrent sub-workers fetches one job "
        "per statement",
        finish_note="kept with status succeeded (procrastinate's default)",
    ),
}


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def unavailable(name: str) -> str | None:
    """Why the peer cannot run here, or None."""
    if version(name) is None:
        return f"{name} is not installed (pip install -e '.[bench]')"
    try:
        __import__(name)
    except Exception as exc:  # an import that fails for any reason: report it, go on
        return f"{name} does not import: {exc!r}"
    return None


# -- the peers' own APIs -----------------------------------------------------------------


def _procrastinate_app(dsn: str) -> Any:
    import procrastinate

    # Its warning that the app is built in the __main__ module concerns apps that tasks
    # import; this one is built here on purpose.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop(n: int = 0) -> None:
        """Does nothing."""

    return app


async def _install(name: str, dsn: str) -> None:
    if name == "pgqueuer":
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()
    else:
        app = _procrastinate_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()


def install(name: str, dsn: str) -> None:
    """Create the peer's schema in the (empty) database of `dsn`."""
    asyncio.run(_install(name, dsn))


async def _bulk(name: str, dsn: str, rows: int, seconds: float) -> float:
    """Jobs/s enqueued in transactions of `rows` jobs through the peer's bulk API."""
    args = [{"n": n} for n in range(rows)]
    done = 0
    if name == "pgqueuer":
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            queries = Queries(PsycopgDriver(conn))
            started = time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds:
                payloads: list[bytes | None] = [json.dumps(a).encode() for a in args]
                await queries.enqueue(["noop"] * rows, payloads, [0] * rows)
                done += rows
    else:
        app = _procrastinate_app(dsn)
        async with app.open_async():
            task = app.tasks["noop"]
            started = time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds:
                await task.batch_defer_async(*args)
                done += rows
    return done / elapsed


def bulk_rate(name: str, dsn: str, rows: int, seconds: float) -> float:
    return asyncio.run(_bulk(name, dsn, rows, seconds))


def pgqueuer_cap(concurrency: int, batch: int) -> int:
    """pgqueuer's max_concurrent_tasks for a concurrency C at batch B."""
    return max(concurrency, 2 * batch)


async def _run_pgqueuer(dsn: str, concurrency: int, batch: int) -> None:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Does nothing."""

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    # pgqueuer refuses a cap below twice the batch; jobs count against it until their
    # status is flushed (a buffer of `batch` outcomes), so a smaller cap starves it.
    await qm.run(batch_size=batch, max_concurrent_tasks=pgqueuer_cap(concurrency, batch))
    await conn.close()


async def _run_procrastinate(dsn: str, concurrency: int) -> None:
    app = _procrastinate_app(dsn)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, install_signal_handlers=True)


def run_worker(name: str, dsn: str, concurrency: int, batch: int) -> None:
    if name == "pgqueuer":
        asyncio.run(_run_pgqueuer(dsn, concurrency, batch))
    elif name == "procrastinate":
        asyncio.run(_run_procrastinate(dsn, concurrency))
    else:
        raise SystemExit(f"unknown peer {name!r}: one of {', '.join(NAMES)}")


# -- a peer's database -------------------------------------------------------------------


class PeerDatabase:
    """The database `<bench database>_<peer>` on the same server, with the peer's schema."""

    def __init__(self, peer: Peer, admin_dsn: str, name: str, dsn: str) -> None:
        self.peer = peer
        self.admin_dsn = admin_dsn
        self.name = name
        self.dsn = dsn

    def create(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        install(self.peer.name, self.dsn)

    def drop(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def pending(self) -> int:
        return int(self.sql(self.peer.pending)[0][0])

    def reset(self) -> None:
        self.sql(f"TRUNCATE {self.peer.table} CASCADE")

    def insert_backlog(self, count: int, analyze: bool = False) -> None:
        """`count` waiting jobs; VACUUM ANALYZEd with `analyze` (cold by default, as ours)."""
        self.sql(self.peer.backlog, (count,))
        if analyze:
            self.sql(f"VACUUM ANALYZE {self.peer.table}")


def worker_command(name: str, dsn: str, concurrency: int, batch: int) -> list[str]:
    return [sys.executable, "-m", "benchmarks.peers", "worker", name, dsn, str(concurrency),
            str(batch)]  # fmt: skip


def main(argv: list[str]) -> None:
    if len(argv) == 5 and argv[0] == "worker":
        run_worker(argv[1], argv[2], int(argv[3]), int(argv[4]))
    else:
        raise SystemExit("usage: python -m benchmarks.peers worker NAME DSN CONCURRENCY BATCH")


if __name__ == "__main__":
    main(sys.argv[1:])
