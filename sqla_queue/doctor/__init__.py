"""The essay's failure modes, checked against a live database: `sqla-queue doctor`.

Each check is a function `(connection, options) -> Finding`. A finding has a name, a
severity (ok, warn, critical), the figure the check saw, and the fix in one sentence.

    findings = diagnose(engine)                  # or a Connection
    if any(f.severity is Severity.critical for f in findings): ...

Every statement is read-only and comes from `sqla_queue.db.queries`. With an engine, doctor
runs in autocommit mode so it never holds the snapshot whose age it reports.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from sqla_queue.doctor.checks import (
    QUEUE_CHECKS,
    SERVER_CHECKS,
    check_schema,
    check_stuck_jobs,
)
from sqla_queue.doctor.findings import (
    FIX_PERMISSION,
    Check,
    DoctorOptions,
    Finding,
    Severity,
    worst,
)


def _run_check(conn: Connection, check: Check, options: DoctorOptions) -> Finding:
    name = check.__name__.removeprefix("check_")
    try:
        if not getattr(conn.connection.dbapi_connection, "autocommit", False):
            # A failed check must not abort the caller's transaction (read-only: no xid).
            with conn.begin_nested():
                return check(conn, options)
        return check(conn, options)
    except DBAPIError as exc:
        message = str(exc.orig or exc).strip().splitlines()[0]
        return Finding(name, Severity.warn, f"could not check: {message}", FIX_PERMISSION)


def diagnose(bind: Engine | Connection, options: DoctorOptions | None = None) -> list[Finding]:
    """Run every check against `bind`; return the findings in a stable order."""
    options = options or DoctorOptions()
    if isinstance(bind, Engine):
        with bind.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return diagnose(conn, options)
    schema = _run_check(bind, check_schema, options)
    checks = SERVER_CHECKS + (QUEUE_CHECKS if schema.severity is Severity.ok else ())
    return [schema, *(_run_check(bind, check, options) for check in checks)]


__all__ = [
    "DoctorOptions",
    "Finding",
    "Severity",
    "check_stuck_jobs",
    "diagnose",
    "worst",
]
