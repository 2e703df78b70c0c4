"""The jobs table's upkeep: the one place that decides when a worker VACUUMs or ANALYZEs it.

Workers keep the jobs table small at any rate, not only when the autovacuum daemon wakes
(every `autovacuum_naptime`, a minute by default), and keep its planner statistics close
enough that the claim's plan reads the claim index in order.

Every claim and finish leaves a dead row version; the claim index points at them until a
VACUUM removes them, and every poll steps over them meanwhile, so polls slow down as the
rate goes up. The keeper reads the table's dead rows (`pg_stat_user_tables`) each worker
heartbeat (and once as it starts): past `vacuum_threshold` plus a tenth of its live rows
the table is due a VACUUM (with ANALYZE, so the claim's plan sees the table as it is);
otherwise, every `STATISTICS_CHECK_EVERY` seconds, an ANALYZE if its statistics are missing
or far off (`queries.statistics_stale`: a table never analyzed, a burst since). Either runs
on a thread and connection of its own (autocommit: no transaction held around it), never on
the claim loop's thread, so a claim never waits for them. One worker at a time: the one
that takes the advisory lock `queries.try_vacuum_lock` (tried, never waited for), which
looks again first (another worker may just have done it). Neither waits for the table:
SKIP_LOCKED skips it while autovacuum or a user holds it, under a `lock_timeout` of
`UPKEEP_LOCK_TIMEOUT`, and the VACUUM never truncates the table (`TRUNCATE false`, and
`vacuum_truncate = false` for autovacuum: migration sqlaq_0017), whose ACCESS EXCLUSIVE
lock would stop every claim. A role that may not vacuum the table gets one warning and
the worker stops trying. With `vacuum_threshold=None` only the statistics are kept.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Literal

from sqlalchemy import Connection, Engine

from sqla_queue.db import queries
from sqla_queue.db.queries import vacuum as statements
from sqla_queue.worker.connection import FailureLog, describe, failure_kind

log = logging.getLogger("sqla_queue.worker")

VACUUM_SCALE_FACTOR = 0.1
"""The fraction of the jobs table's live rows added to `vacuum_threshold` (as PostgreSQL's
autovacuum_vacuum_scale_factor): a table that keeps many finished jobs is vacuumed less
often, since each VACUUM then reads more indexes."""

LOCK_NOT_AVAILABLE = "55P03"
"""The SQLSTATE of SKIP_LOCKED's warning: somebody else is vacuuming the table right now."""

STATISTICS_CHECK_EVERY = 30.0
"""Seconds between two looks at the jobs table's planner statistics when no VACUUM (which
analyzes too) is due; the first look is as the worker starts."""

Upkeep = Literal["vacuum", "analyze"]

SILENCE_VACUUM = ", or set WorkerConfig(vacuum_threshold=None) to silence this"
"""The end of the refused warning for a VACUUM (statistics are kept even without it)."""


def over_threshold(live: int, dead: int, threshold: int) -> bool:
    """Whether `dead` rows are enough to vacuum a table of `live` rows for."""
    return dead > threshold + VACUUM_SCALE_FACTOR * live


class SelfVacuum:
    """Starts one VACUUM or ANALYZE of the jobs table at a time, when it is due."""

    def __init__(self, engine: Engine, threshold: int | None, failures: FailureLog) -> None:
        self.engine = engine
        self.threshold = threshold
        self._failures = failures
        self._thread: threading.Thread | None = None
        self._next_statistics_look = float("-inf")
        self.refused: str | None = None
        """Why the server would not let this worker vacuum the table (it stopped trying)."""
        self.vacuums = 0
        """VACUUMs this worker ran."""
        self.analyses = 0
        """ANALYZEs (without a VACUUM) this worker ran."""

    @property
    def enabled(self) -> bool:
        return self.refused is None

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self, conn: Connection) -> bool:
        """Decide on `conn` (the keeper's) whether the table is due a VACUUM or an ANALYZE;
        start it on a thread of its own if it is and none runs. Returns whether it started."""
        if not self.enabled or self.running():
            return False
        now = time.monotonic()
        look = now >= self._next_statistics_look
        if look:
            self._next_statistics_look = now + STATISTICS_CHECK_EVERY
        if self._due(conn, seen_by_others=True, statistics=look) is None:
            return False
        self._thread = threading.Thread(target=self.run, name="sqla-queue-upkeep", daemon=True)
        self._thread.start()
        return True

    def _due(self, conn: Connection, seen_by_others: bool, statistics: bool) -> Upkeep | None:
        row = conn.execute(statements.jobs_vacuum_state()).mappings().first()
        if row is None or (seen_by_others and row["vacuuming"]):
            return None
        if self.threshold is not None and over_threshold(
            int(row["live"]), int(row["dead"]), self.threshold
        ):
            return "vacuum"
        if not statistics:
            return None
        figures = conn.execute(queries.jobs_statistics()).first()
        if figures is not None and queries.statistics_stale(float(figures[0]), int(figures[1])):
            return "analyze"
        return None

    def run(self) -> bool:
        """Vacuum or analyze the table now if this worker takes the lock and one is still
        due; returns whether it ran one. Failures are logged (once per kind), never raised."""
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                if not conn.execute(statements.try_vacuum_lock()).scalar():
                    return False
                try:
                    upkeep = self._due(conn, seen_by_others=False, statistics=True)
                    if upkeep is None:
                        return False
                    conn.execute(statements.set_upkeep_lock_timeout())
                    ran = self._upkeep(conn, upkeep)
                finally:
                    # A lost connection took its session's lock with it (and cannot unlock);
                    # a pooled one goes back with the server's lock_timeout.
                    if not conn.invalidated:
                        conn.execute(statements.reset_lock_timeout())
                        conn.execute(statements.vacuum_unlock())
            if self._failures.failing_for:
                self._failures.recovered()
            return ran
        except Exception as exc:
            self._failures.failed(
                failure_kind(exc), "upkeep of the jobs table failed (%s)", describe(exc)
            )
            return False

    def _upkeep(self, conn: Connection, upkeep: Upkeep) -> bool:
        warnings: list[tuple[str | None, str | None]] = []

        def collect(notice: Any) -> None:  # its fields are readable only during the call
            if notice.severity_nonlocalized == "WARNING":
                warnings.append((notice.sqlstate, notice.message_primary))

        driver: Any = conn.connection.driver_connection
        add = getattr(driver, "add_notice_handler", None)  # psycopg 3
        if add is not None:
            add(collect)
        try:
            statement = (
                statements.vacuum_jobs() if upkeep == "vacuum" else statements.analyze_jobs()
            )
            conn.execute(statement)
        finally:
            if add is not None:
                driver.remove_notice_handler(collect)
        for sqlstate, message in warnings:
            if sqlstate == LOCK_NOT_AVAILABLE:  # autovacuum or a user is at it
                return False
            self.refused = str(message)
            log.warning(
                "this worker may not %s the jobs table (%s): it leaves the table to "
                "autovacuum. Run the worker as the table's owner (or, from PostgreSQL 17, "
                "GRANT MAINTAIN ON sqla_queue.jobs TO its role)%s",
                upkeep,
                self.refused,
                SILENCE_VACUUM if upkeep == "vacuum" else "",
            )
            return False
        if upkeep == "vacuum":
            self.vacuums += 1
            log.debug("vacuumed the jobs table")
        else:
            self.analyses += 1
            log.info("analyzed the jobs table: its planner statistics were missing or stale")
        return True

    def stop(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for an upkeep in progress (it ends with its session)."""
        if self._thread is not None:
            self._thread.join(timeout)
