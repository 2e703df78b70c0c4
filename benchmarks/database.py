"""The benchmark's own database: created on the server, migrated, and dropped at the end."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url

from sqla_queue.db.database import normalize_url
from sqla_queue.db.migrate import upgrade

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
JOBS = "sqla_queue.jobs"
UNFINISHED = f"SELECT count(*) FROM {JOBS} WHERE status IN ('queued', 'running')"
"""Jobs not yet finished: queued or running (finished rows may stay, under `keep`)."""


class BenchDatabase:
    """A dedicated database `sqlaq_bench_<random>` on the server of `server_url`."""

    def __init__(self, server_url: str) -> None:
        self.server_url = normalize_url(server_url)
        self.name = f"sqlaq_bench_{uuid.uuid4().hex[:10]}"
        self.url = make_url(self.server_url).set(database=self.name).render_as_string(False)
        self.dsn = self.url.replace("postgresql+psycopg://", "postgresql://", 1)
        self._admin = create_engine(
            self.server_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool
        )
        self.engine: Engine | None = None

    def create(self) -> None:
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        engine = create_engine(self.url, poolclass=pool.NullPool)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        self.engine = create_engine(self.url, pool_size=10, max_overflow=10)

    def drop(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
        with self._admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._admin.dispose()

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit on a fresh psycopg connection; rows if any."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def server_settings(self) -> dict[str, str]:
        names = ("server_version", "synchronous_commit", "fsync", "shared_buffers", "autovacuum")
        settings = {name: str(self.sql(f"SHOW {name}")[0][0]) for name in names}
        settings["version"] = str(self.sql("SELECT version()")[0][0])
        return settings

    def reset_jobs(self) -> None:
        """An empty jobs table (TRUNCATE; ids keep counting up, so no reuse)."""
        self.sql(f"TRUNCATE {JOBS}")

    def insert_noop_jobs(self, count: int, analyze: bool = False) -> None:
        """`count` queued no-op jobs in one transaction, woken by one NOTIFY.

        With `analyze`, the queue is paused while they are inserted and analysed, so that no
        claim runs with the planner statistics of an empty table (as pgbench's ceiling does).
        """
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            if analyze:
                conn.execute("UPDATE sqla_queue.queues SET paused = true WHERE name = 'default'")
            conn.execute(
                f"INSERT INTO {JOBS} (task, args) "
                "SELECT 'noop', jsonb_build_object('n', g) FROM generate_series(1, %s) g",
                (count,),
            )
            if analyze:
                conn.execute(f"VACUUM ANALYZE {JOBS}")
                conn.execute("UPDATE sqla_queue.queues SET paused = false WHERE name = 'default'")
            conn.execute("SELECT pg_notify('sqla_queue', 'default')")

    def count_jobs(self) -> int:
        """Jobs not yet finished: queued or running (finished rows may stay, under `keep`)."""
        return int(self.sql(UNFINISHED)[0][0])

    def set_retention(self, retention: str) -> None:
        self.sql("UPDATE sqla_queue.queues SET retention = %s WHERE name = 'default'", (retention,))

    def next_multixact_id(self) -> int:
        """The cluster's next MultiXact id, read after a CHECKPOINT so it is current."""
        self.sql("CHECKPOINT")
        return int(
            self.sql("SELECT next_multixact_id::text::bigint FROM pg_control_checkpoint()")[0][0]
        )

    def jobs_size(self) -> dict[str, int]:
        """Heap and heap + index bytes of the jobs table, its dead tuples and autovacuum runs."""
        heap, total, dead, autovacuums = self.sql(
            f"SELECT pg_relation_size('{JOBS}'), pg_total_relation_size('{JOBS}'), "
            "n_dead_tup, autovacuum_count FROM pg_stat_user_tables "
            "WHERE relid = 'sqla_queue.jobs'::regclass"
        )[0]
        return {
            "heap_bytes": int(heap),
            "total_bytes": int(total),
            "dead_tuples": int(dead),
            "autovacuums": int(autovacuums),
        }

    def vacuum_stats(self) -> dict[str, Any]:
        """Autovacuum runs on the jobs table so far, and when the last one was."""
        count, last, vacuums = self.sql(
            "SELECT autovacuum_count, last_autovacuum::text, vacuum_count FROM pg_stat_user_tables "
            "WHERE relid = 'sqla_queue.jobs'::regclass"
        )[0]
        return {
            "autovacuum_count": int(count),
            "last_autovacuum": last,
            "vacuum_count": int(vacuums),
        }

    @property
    def admin_dsn(self) -> str:
        """The server URL the harness was given, as a psycopg DSN."""
        return self.server_url.replace("postgresql+psycopg://", "postgresql://", 1)

    def sibling(self, suffix: str) -> tuple[str, str]:
        """(name, DSN) of another database on the same server, named after this one."""
        name = f"{self.name}_{suffix}"
        dsn = make_url(self.server_url).set(database=name).render_as_string(False)
        return name, dsn.replace("postgresql+psycopg://", "postgresql://", 1)

    def has_queue_fk(self) -> bool:
        rows = self.sql(
            "SELECT 1 FROM pg_constraint WHERE conname = 'fk_jobs_queue_queues' "
            "AND conrelid = 'sqla_queue.jobs'::regclass"
        )
        return bool(rows)

    def drop_queue_fk(self) -> None:
        self.sql(f"ALTER TABLE {JOBS} DROP CONSTRAINT IF EXISTS fk_jobs_queue_queues")

    def add_queue_fk(self) -> None:
        if not self.has_queue_fk():
            self.sql(
                f"ALTER TABLE {JOBS} ADD CONSTRAINT fk_jobs_queue_queues FOREIGN KEY (queue) "
                "REFERENCES sqla_queue.queues (name) ON UPDATE CASCADE"
            )

    def wait_until_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count_jobs() == 0:
                return True
            time.sleep(0.05)
        return False
