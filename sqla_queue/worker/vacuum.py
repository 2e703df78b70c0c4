"""The self-vacuum: workers keep the jobs table small at any rate, not only when the
autovacuum daemon wakes (every `autovacuum_naptime`, a minute by default).

Every claim and finish leaves a dead row version; the claim index points at them until a
VACUUM removes them, and every poll steps over them meanwhile, so polls slow down as the
rate goes up. The keeper reads the table's dead rows (`pg_stat_user_tables`) each worker
heartbeat; past `vacuum_threshold` plus a tenth of its live rows it starts one VACUUM
(with ANALYZE, so the claim's plan sees the table as it is) on
a thread and connection of its own (autocommit: no transaction held around it). One
worker at a time: the one that takes the advisory lock `queries.try_vacuum_lock`, which
looks at the count again first (another worker may just have vacuumed). A role that may
not vacuum the table gets one warning and the worker stops trying.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Connection, Engine

from sqla_queue.queries import vacuum as statements

from .connection import FailureLog, describe, failure_kind

log = logging.getLogger("sqla_queue.worker")

VACUUM_SCALE_FACTOR = 0.1
"""The fraction of the jobs table's live rows added to `vacuum_threshold` (as PostgreSQL's
autovacuum_vacuum_scale_factor): a table that keeps many finished jobs is vacuumed less
often, since each VACUUM then reads more indexes."""

LOCK_NOT_AVAILABLE = "55P03"
"""The SQLSTATE of SKIP_LOCKED's warning: somebody else is vacuuming the table right now."""


def over_threshold(live: int, dead: int, threshold: int) -> bool:
    """Whether `dead` rows are enough to vacuum a table of `live` rows for."""
    return dead > threshold + VACUUM_SCALE_FACTOR * live


class SelfVacuum:
    """Starts one VACUUM of the jobs table at a time when its dead rows pass the threshold."""

    def __init__(self, engine: Engine, threshold: int | None, failures: FailureLog) -> None:
        self.engine = engine
        self.threshold = threshold
        self._failures = failures
        self._thread: threading.Thread | None = None
        self.refused: str | None = None
        """Why the server would not let this worker vacuum the table (it stopped trying)."""
        self.vacuums = 0
        """VACUUMs this worker ran."""

    @property
    def enabled(self) -> bool:
        return self.threshold is not None and self.refused is None

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self, conn: Connection) -> bool:
        """Read the table's dead rows on `conn`; start a VACUUM if they are past the
        threshold and none runs. Returns whether it started one."""
        if not self.enabled or self.running() or not self._due(conn, seen_by_others=True):
            return False
        self._thread = threading.Thread(target=self.run, name="sqla-queue-vacuum", daemon=True)
        self._thread.start()
        return True

    def _due(self, conn: Connection, seen_by_others: bool) -> bool:
        row = conn.execute(statements.jobs_vacuum_state()).mappings().first()
        if row is None or (seen_by_others and row["vacuuming"]):
            return False
        assert self.threshold is not None
        return over_threshold(int(row["live"]), int(row["dead"]), self.threshold)

    def run(self) -> bool:
        """Vacuum the table now if this worker takes the lock and it is still due; returns
        whether it vacuumed. Failures are logged (once per kind), never raised."""
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                if not conn.execute(statements.try_vacuum_lock()).scalar():
                    return False
                try:
                    if not self._due(conn, seen_by_others=False):
                        return False
                    vacuumed = self._vacuum(conn)
                finally:
                    conn.execute(statements.vacuum_unlock())
            if self._failures.failing_for:
                self._failures.recovered()
            return vacuumed
        except Exception as exc:
            self._failures.failed(
                failure_kind(exc), "vacuum of the jobs table failed (%s)", describe(exc)
            )
            return False

    def _vacuum(self, conn: Connection) -> bool:
        warnings: list[tuple[str | None, str | None]] = []

        def collect(notice: Any) -> None:  # its fields are readable only during the call
            if notice.severity_nonlocalized == "WARNING":
                warnings.append((notice.sqlstate, notice.message_primary))

        driver: Any = conn.connection.driver_connection
        add = getattr(driver, "add_notice_handler", None)  # psycopg 3
        if add is not None:
            add(collect)
        try:
            conn.execute(statements.vacuum_jobs())
        finally:
            if add is not None:
                driver.remove_notice_handler(collect)
        for sqlstate, message in warnings:
            if sqlstate == LOCK_NOT_AVAILABLE:  # autovacuum or a user is at it
                return False
            self.refused = str(message)
            log.warning(
                "this worker may not vacuum the jobs table (%s): it leaves the table to "
                "autovacuum. Run the worker as the table's owner (or, from PostgreSQL 17, "
                "GRANT MAINTAIN ON sqla_queue.jobs TO its role), or set "
                "WorkerConfig(vacuum_threshold=None) to silence this",
                self.refused,
            )
            return False
        self.vacuums += 1
        log.debug("vacuumed the jobs table")
        return True

    def stop(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for a VACUUM in progress (it ends with its session)."""
        if self._thread is not None:
            self._thread.join(timeout)
