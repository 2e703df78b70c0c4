"""What a worker's health endpoints answer (`WorkerConfig.health_port`; the server is
`sqla_queue.runtime.health_server`).

Liveness: each of the worker's loops has a `Pulse`, which the loop marks busy when it
starts a round of work and idle when it waits (for a notification, for room, for its next
tick, or out a database outage between reconnection attempts). A loop is stuck once one
round has kept it busy for `WorkerConfig.health_stuck_after` seconds: a statement that does
not return, a connection attempt that hangs. Waiting is never stuck, however long, so an
idle worker or one waiting out an outage stays live (readiness says the database is away).
The loops: the producer (the dispatcher, which also writes outcomes: the completer), the
keeper (heartbeats, leases, the reaper), the listener (LISTEN; not with `poll_only`) and,
with async tasks, the event loop (stuck when it has not run a probe for that long). A loop
whose thread has exited is dead.

Readiness: live, started (registered; not while waiting for the database at start or
after a stop was asked), claiming (not stopped by a schema revision it does not know,
`schema` in the report), and the database answers on a connection of its own within
`DATABASE_TIMEOUT` seconds and accepts writes (not a standby, not
`default_transaction_read_only`: a worker there claims nothing); that answer is kept for
`DATABASE_CACHE` seconds, so probes do not add load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, pool

from sqla_queue.db import queries
from sqla_queue.db.scaling import scaling_signal
from sqla_queue.runtime.health_server import Pulse
from sqla_queue.worker.connection import describe

DATABASE_TIMEOUT = 2.0
"""Seconds the readiness check's query (its connection included) may take."""
DATABASE_CACHE = 1.0
"""Seconds a readiness check's database answer is reused for."""
READ_ONLY_ANSWER = (
    "read-only: a standby, or default_transaction_read_only = on; the worker claims nothing "
    "until the database accepts writes"
)
"""`/readyz`'s `database` when the server answers but refuses writes (after a failover)."""


ThreadOf = Callable[[], threading.Thread | None]
"""The thread a loop runs on; None until it has started."""


class DatabaseCheck:
    """Whether the database answers and accepts writes (`queries.TRANSACTION_READ_ONLY`), on
    a connection of its own, the answer cached for `cache` seconds."""

    def __init__(
        self, engine: Engine, timeout: float = DATABASE_TIMEOUT, cache: float = DATABASE_CACHE
    ) -> None:
        self.timeout = timeout
        self.cache = cache
        # A pool of none: the worker's own pool may be busy or broken, which is not the
        # database's health; connect_timeout is in whole seconds (libpq's least is 2). The
        # statement timeout is the transaction's own (SET LOCAL): PgBouncer refuses an
        # `options` startup parameter, and a session's SET would stay on its server connection.
        self._engine = create_engine(
            engine.url,
            poolclass=pool.NullPool,
            connect_args={"connect_timeout": max(2, round(timeout))},
        )
        self._statement_timeout = f"SET LOCAL statement_timeout = {int(timeout * 1000)}"
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self._error: str | None = "not checked yet"
        self._scaling_lock = threading.Lock()
        self._scaled_at = float("-inf")
        self._scaling: tuple[bool, dict[str, Any]] = (False, {})

    def __call__(self) -> str | None:
        """None when the database answered, else why not. Probes at once share one check."""
        with self._lock:
            if time.monotonic() - self._checked_at >= self.cache:
                self._error = self._check()
                self._checked_at = time.monotonic()
            return self._error

    def _check(self) -> str | None:
        try:
            with self._engine.begin() as conn:
                conn.exec_driver_sql(self._statement_timeout)
                read_only = conn.exec_driver_sql(queries.TRANSACTION_READ_ONLY).scalar()
        except Exception as exc:
            return describe(exc)
        return READ_ONLY_ANSWER if read_only else None

    def scaling(self) -> tuple[bool, dict[str, Any]]:
        """`GET /scaling`: every queue's autoscaling signal (`sqla_queue.db.scaling`) by
        name, read on this check's own connection (bounded by its statement timeout) and
        kept for `cache` seconds, so any number of pollers cost one read a second."""
        with self._scaling_lock:
            if time.monotonic() - self._scaled_at >= self.cache:
                try:
                    with self._engine.begin() as conn:
                        found = scaling_signal(conn)
                    self._scaling = (True, {"queues": {s.queue: s.as_dict() for s in found}})
                except Exception as exc:
                    self._scaling = (False, {"status": "error", "error": describe(exc)})
                self._scaled_at = time.monotonic()
            return self._scaling

    def dispose(self) -> None:
        self._engine.dispose()


class WorkerHealth:
    """The answers of one worker's `/livez` and `/readyz`."""

    def __init__(
        self,
        loops: dict[str, tuple[Pulse, ThreadOf]],
        stuck_after: float,
        database: Callable[[], str | None],
        loop_lag: Callable[[], float | None],
        state: Callable[[], str],
        schema: Callable[[], str | None] = lambda: None,
    ) -> None:
        """`loops`: each loop's pulse and thread; `loop_lag`: how long the event loop has
        left a probe unrun (None without one); `state`: "starting", "running", "stopping";
        `schema`: why the worker claims no more jobs (a schema revision it does not know),
        or None."""
        self.loops = loops
        self.schema = schema
        self.stuck_after = stuck_after
        self.database = database
        self.loop_lag = loop_lag
        self.state = state

    def loop_report(self) -> dict[str, str]:
        """Each loop's state: "ok", "not started", "stuck for N s" or "exited"."""
        now = time.monotonic()
        report: dict[str, str] = {}
        for name, (pulse, thread_of) in self.loops.items():
            thread = thread_of()
            if thread is None:
                report[name] = "not started"
            elif not thread.is_alive():
                report[name] = "exited"
            elif (busy := pulse.stuck_for(now)) >= self.stuck_after:
                report[name] = f"stuck for {busy:.0f} s"
            else:
                report[name] = "ok"
        lag = self.loop_lag()
        if lag is not None:
            report["event_loop"] = f"stuck for {lag:.0f} s" if lag >= self.stuck_after else "ok"
        return report

    def livez(self) -> tuple[bool, dict[str, Any]]:
        loops = self.loop_report()
        ok = all(state in ("ok", "not started") for state in loops.values())
        return ok, {"status": "ok" if ok else "failing", "worker": self.state(), "loops": loops}

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        live, report = self.livez()
        state = report["worker"]
        error = self.database() if live and state == "running" else None
        report["database"] = "ok" if error is None else error
        if not live:
            report["database"] = "not checked (not live)"
        elif state != "running":
            report["database"] = f"not checked (worker {state})"
        refusal = self.schema()
        report["schema"] = "ok" if refusal is None else refusal
        ok = live and state == "running" and error is None and refusal is None
        report["status"] = "ok" if ok else "failing"
        return ok, report


__all__ = [
    "DATABASE_CACHE",
    "DATABASE_TIMEOUT",
    "READ_ONLY_ANSWER",
    "DatabaseCheck",
    "WorkerHealth",
]
