"""The dispatcher's database connection: reconnects fast, waits out errors, logs tersely.

During an outage the worker retries with a short backoff (50 ms doubling to 1 s, with
jitter), so it is back within about a second of the database. It logs one warning per kind
of failure until that kind recovers, never the SQL statement or its parameters.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from sqla_queue.db.database import describe as describe
from sqla_queue.db.database import read_committed
from sqla_queue.errors import DatabaseUnavailableError
from sqla_queue.runtime.health_server import Pulse

log = logging.getLogger("sqla_queue.worker")

MAX_BACKOFF = 1.0
"""Seconds between reconnection attempts at most: the worker is back within about this."""

# Errors that retrying cannot fix; anything else (refused, starting up, "too many
# connections for role") is waited out with backoff.
FATAL_CONNECT_ERRORS = (
    "password authentication failed",
    "authentication failed",
    "does not exist",  # the role or the database
    "no pg_hba.conf entry",
    "permission denied",  # e.g. no CONNECT privilege on the database
    "invalid dsn",
    "invalid connection option",
)


def failure_kind(exc: BaseException) -> str:
    """A short name for a kind of failure: the SQLSTATE, else the exception type."""
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None)
    return str(state) if state else type(orig if orig is not None else exc).__name__


def is_row_error(exc: BaseException) -> bool:
    """Whether a failed statement failed because of its data (SQLSTATE class 22, a data
    exception, 23, an integrity violation, or 54, a program limit such as a JSON value
    nested past the server's stack depth): the other rows of a batch may still go in, and
    running the same statement again would fail the same way."""
    state = getattr(getattr(exc, "orig", None), "sqlstate", None) or ""
    return state[:2] in ("22", "23", "54")


READ_ONLY = "25006"
"""SQLSTATE read_only_sql_transaction: the server refuses writes (a standby the connection
string failed over to, or `default_transaction_read_only = on`, as during a demotion)."""


def is_read_only(exc: BaseException) -> bool:
    """Whether a statement failed because the server accepts no writes now: waited out, as an
    outage is, until it does."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == READ_ONLY


def waitable(exc: BaseException) -> bool:
    """Whether a failed statement may succeed if run again later: an operational error (a
    statement timeout, a server starting up, a serialization failure) or a read-only server;
    never a row's data (`is_row_error`)."""
    return (isinstance(exc, OperationalError) or is_read_only(exc)) and not is_row_error(exc)


def refusal(exc: BaseException) -> str:
    """Why PostgreSQL refused a statement's data: its message and detail, one line (never
    the statement or its parameters)."""
    orig = getattr(exc, "orig", None)
    detail = getattr(getattr(orig, "diag", None), "message_detail", None)
    message = describe(exc)
    return f"{message} ({detail.splitlines()[0][:200]})" if detail else message


def backoff_delays(first: float = 0.05, cap: float = MAX_BACKOFF) -> Any:
    """Delays that double from `first` up to `cap`, each jittered to between half and all."""
    delay = first
    while True:
        yield delay * random.uniform(0.5, 1.0)
        delay = min(delay * 2, cap)


class FailureLog:
    """Logs the first failure of each kind, counts the rest, and says when they recover."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._since: float | None = None
        self._kinds: dict[str, int] = {}

    def failed(self, kind: str, message: str, *args: Any) -> bool:
        """Count one failure; log `message % args` only for a kind not seen in this outage."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
            seen = kind in self._kinds
            self._kinds[kind] = self._kinds.get(kind, 0) + 1
        if not seen:
            self._log.warning(message + " (repeats are not logged until it recovers)", *args)
        return not seen

    @property
    def failing_for(self) -> float:
        """Seconds since the first failure of the current outage (0 when none)."""
        return 0.0 if self._since is None else time.monotonic() - self._since

    def recovered(self) -> None:
        with self._lock:
            if self._since is None:
                return
            took, count = time.monotonic() - self._since, sum(self._kinds.values())
            self._since = None
            self._kinds.clear()
        self._log.warning("database reachable again after %.1f s (%d failed attempts)", took, count)


STATEMENT_KIND = "sqla_queue_statement"
"""The execution option that names a worker statement's kind ("claim", "complete", ...)
for engine listeners (`sqla_queue.contrib.metrics` times statements by it)."""

JOB_ARRAYS = ("job_ids", "job_attempts")
"""The integer-list parameters of the statements that finish a batch of jobs."""


class DriverStatement:
    """A statement compiled once for the engine's dialect, run as its SQL text with the
    bind values converted as SQLAlchemy would (`DatabaseLink.execute` runs it with
    `exec_driver_sql`): no compile-cache lookup and no result processing per execution,
    and psycopg prepares it server-side after a few runs, as it does any repeated text.
    Rows come back as plain tuples of driver values (read them by position: `result.keys()`).

    `static` are bind values that never change for this worker: converted once here.
    `kind` names the statement for engine listeners (the `STATEMENT_KIND` option).
    `int_arrays` name parameters that are lists of integers: sent as the text of an array
    literal (the SQL casts them), built in C by `str.join`, where psycopg's list dumper
    inspects every element in Python to choose a type.

    Psycopg prepares the text after five runs, and PostgreSQL then plans it once for all
    runs if that plan is estimated no worse than the plans made for the values given: the
    claim's text therefore carries its size as a literal (a bound LIMIT is estimated at a
    tenth of the table, and every run would be planned anew, 0.3 ms each).
    """

    def __init__(
        self,
        statement: Any,
        engine: Engine,
        static: Mapping[str, Any],
        int_arrays: tuple[str, ...] = (),
        kind: str | None = None,
    ) -> None:
        self.kind = kind
        compiled = statement.compile(dialect=engine.dialect)
        self.sql: str = compiled.string
        dialect = engine.dialect
        self._processors: dict[str, Callable[[Any], Any]] = {}
        self._int_arrays = frozenset(int_arrays)
        # The names the SQL text uses, and the values that never change, converted once:
        # the static ones, then defaults (a bindparam's own value).
        self._static: dict[str, Any] = {}
        self._names: dict[str, str] = {}
        for bind, name in compiled.bind_names.items():
            name = compiled.escaped_bind_names.get(name, name)
            self._names[bind.key] = name
            processor = bind.type._cached_bind_processor(dialect)
            if processor is not None:
                self._processors[name] = processor
            if bind.key in static:
                self._static[name] = self._convert(name, static[bind.key])
            elif not bind.required:
                self._static[name] = self._convert(name, bind.effective_value)

    def _convert(self, name: str, value: Any) -> Any:
        processor = self._processors.get(name)
        return value if processor is None or value is None else processor(value)

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The driver's parameters: the static ones and `values`, converted."""
        params = dict(self._static)
        names = self._names
        for key, value in values.items():
            name = names[key]
            if key in self._int_arrays:
                params[name] = "{" + ",".join(map(str, value)) + "}"
            else:
                params[name] = self._convert(name, value)
        return params

    def run(self, conn: Connection, values: Mapping[str, Any]) -> DriverRows:
        """Run on `conn` with `values`. Straight on the driver's cursor unless the engine
        has event listeners (metrics, tracing), which then see it through SQLAlchemy.
        A driver error is raised as SQLAlchemy's (`DBAPIError`), the connection invalidated
        when it is lost, as SQLAlchemy would."""
        params = self.params(values)
        if conn._has_events or conn.engine._has_events:
            options = {STATEMENT_KIND: self.kind} if self.kind else None
            result = conn.exec_driver_sql(self.sql, params, execution_options=options)
            return DriverRows(list(result.keys()), result.all())
        dialect = conn.dialect
        # the psycopg connection (driver_connection is None once detached from the pool)
        driver: Any = conn.connection.dbapi_connection
        assert driver is not None  # a checked-out connection has its driver's
        try:
            with driver.cursor() as cursor:
                cursor.execute(self.sql, params)
                if cursor.description is None:
                    return DriverRows([], [])
                return DriverRows([c.name for c in cursor.description], cursor.fetchall())
        except dialect.loaded_dbapi.Error as exc:
            lost = dialect.is_disconnect(exc, driver, None)
            if lost:
                conn.invalidate(exc)
            raise DBAPIError.instance(
                self.sql,
                params,
                exc,
                dialect.loaded_dbapi.Error,
                hide_parameters=True,
                connection_invalidated=lost,
                dialect=dialect,
            ) from exc


class DriverRows:
    """The rows of a `DriverStatement`: plain tuples, and the names of their columns."""

    __slots__ = ("_keys", "_rows")

    def __init__(self, keys: list[str], rows: Sequence[Any]) -> None:
        self._keys = keys
        self._rows = rows

    def keys(self) -> list[str]:
        return self._keys

    def all(self) -> Sequence[Any]:
        return self._rows


class Stopped(Exception):
    """Internal: the worker is stopping and the database is unreachable."""


@dataclass(eq=False)
class DatabaseLink:
    """One autocommit connection for the dispatcher thread, reopened whenever it is lost.

    With `synchronous_commit=False` its session commits without waiting for the disk
    (`SET synchronous_commit = off`): it carries only the worker's own claims and finishes.
    Its statements run at READ COMMITTED whatever the server's default (`read_committed`).
    JIT is off in its session (`SET jit = off`): PostgreSQL compiles any statement whose
    estimated cost passes `jit_above_cost`, and on a table never analyzed the claim of a
    queue with a limit or turns passed it at 100,000 jobs: 90 ms of compiling for a 5 ms
    claim, every claim. The connection is detached from the engine's pool, so its settings
    never reach a pooled connection that `ctx.session()` or the application checks out.
    """

    engine: Engine
    stopping: threading.Event
    """The worker's stop event: waiting out the database ends when it is set."""
    give_up_after: float | None
    """Seconds of failing to connect after which `DatabaseUnavailableError` is raised; None
    waits for ever."""
    failures: FailureLog
    synchronous_commit: bool = True
    pulse: Pulse = field(default_factory=Pulse)
    """The pulse of the loop using the link (the producer's): idle while it waits out the
    database between attempts, so an outage is never a stuck loop."""
    conn: Connection | None = field(default=None, init=False)
    """The open connection; None until `connect`, and after `close`."""

    def _open(self) -> Connection:
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        conn.detach()  # closed, not pooled, when the link lets it go: its settings stay its own
        try:
            read_committed(conn)  # the session is its own: nothing to restore
            conn.exec_driver_sql("SET jit = off")
            if not self.synchronous_commit:
                conn.exec_driver_sql("SET synchronous_commit = off")
        except BaseException:
            conn.close()
            raise
        return conn

    def connect(self) -> Connection | None:
        """Open the connection, waiting out the database; None if stopping meanwhile."""
        delays = backoff_delays()
        while not self.stopping.is_set():
            try:
                self.conn = self._open()
            except OperationalError as exc:
                message = describe(exc)
                if any(fatal in message for fatal in FATAL_CONNECT_ERRORS):
                    raise
                delay = next(delays)
                self.failures.failed(
                    "connect", "database unavailable (%s); retrying in %.2fs", message, delay
                )
                if (
                    self.give_up_after is not None
                    and self.failures.failing_for >= self.give_up_after
                ):
                    raise DatabaseUnavailableError(
                        seconds=self.give_up_after, reason=message
                    ) from None
                self.pulse.idle()
                self.stopping.wait(delay)
                self.pulse.busy()
            else:
                # not "reachable again" yet: a server that takes connections may still refuse
                # the statement (read-only, starting up); the first statement that runs says it
                return self.conn
        return None

    def execute(self, statement: Any, params: Any = None) -> Any:
        """Run one autocommit statement, reconnecting on a lost connection and waiting out
        other operational errors (a statement timeout, a server starting up) and a read-only
        server with backoff."""
        delays = backoff_delays(0.1)
        while True:
            conn = self.conn
            if conn is None:
                conn = self.connect()
                if conn is None:  # stopping while the database is away
                    raise Stopped
            try:
                result: Any
                if isinstance(statement, DriverStatement):
                    result = statement.run(conn, params or {})
                else:
                    result = conn.execute(statement, params)
            except DBAPIError as exc:
                if exc.connection_invalidated:
                    self.failures.failed(
                        "connection lost",
                        "database connection lost (%s); reconnecting",
                        describe(exc),
                    )
                    self.close()
                    continue
                if not waitable(exc):
                    raise  # a program limit (class 54) fails the same way every time
                delay = next(delays)
                if is_read_only(exc):
                    self.failures.failed(
                        READ_ONLY,
                        "the database is read-only (%s): a standby, or "
                        "default_transaction_read_only = on; claiming nothing until it is "
                        "writable, retrying in %.2fs",
                        describe(exc),
                        delay,
                    )
                else:
                    self.failures.failed(
                        failure_kind(exc),
                        "database error (%s); retrying in %.2fs",
                        describe(exc),
                        delay,
                    )
                self.pulse.idle()
                if self.stopping.wait(delay):
                    raise Stopped from None
                self.pulse.busy()
            else:
                if self.failures.failing_for:
                    self.failures.recovered()
                return result

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing a broken connection failed", exc_info=True)
