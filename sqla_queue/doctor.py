"""The essay's failure modes, checked against a live database: `sqla-queue doctor`.

Each check is a function `(connection, options) -> Finding`. A finding has a name, a
severity (ok, warn, critical), the figure the check saw, and the fix in one sentence.

    findings = diagnose(engine)                  # or a Connection
    if any(f.severity is Severity.critical for f in findings): ...

Every statement is read-only and comes from `sqla_queue.queries`. With an engine, doctor
runs in autocommit mode so it never holds the snapshot whose age it reports.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import queries
from .migrate import schema_revision
from .queries import vacuum


class Severity(str, enum.Enum):
    """How bad a finding is. `critical` makes `sqla-queue doctor` exit with status 1."""

    ok = "ok"
    warn = "warn"
    critical = "critical"


@dataclass(frozen=True)
class Finding:
    """What one check saw: its `value` (the figure, for people), `details` (for programs)."""

    name: str
    severity: Severity
    value: str
    fix: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "severity": self.severity.value,
            "value": self.value,
            "fix": self.fix,
            "details": self.details,
        }


@dataclass
class DoctorOptions:
    """Thresholds of the checks; each has a `sqla-queue doctor` option or a sane default."""

    lease: float = 60.0
    """Seconds of grace: a stuck job (past its own lease deadline, or held by a dead
    worker) overdue by more than twice this is critical, since live workers reap within
    seconds."""
    backlog_threshold: float = 300.0
    """Seconds past its run_at after which a queued job counts as backlog."""
    long_transaction: float = 60.0
    """Seconds a transaction may pin the vacuum horizon before a warning (x10: critical)."""
    sample: float = 1.0
    """Seconds to watch the cluster's MultiXact counter (0 skips that check)."""
    multixact_rate: float = 10.0
    """MultiXacts minted per second in the cluster above which doctor warns."""
    concurrent_enqueuers: int = 4
    """Sessions seen enqueuing at once, with the foreign key in place, that warn."""
    dead_tuples: int = 100_000
    """Dead tuples in jobs that warn, when they also outnumber the live ones."""
    show_queries: bool = False
    """Put other sessions' SQL text (120 characters, literals and all) in the details.

    Off by default: that text can hold secrets (passwords, tokens, personal data) of other
    applications. Without it the details name only the statement's first keyword."""


FIX_UPGRADE = (
    "Upgrade: Postgres 17 made the SLRU cache sizes configurable (multixact_member_buffers, "
    "multixact_offset_buffers) and split their locks into banks, which moves the "
    "single-lock cliff a long way out."
)
FIX_MULTIXACTS = (
    "Remove subtransactions from the claim path (no savepoint such as begin_nested around "
    "the worker's updates) and drop the foreign key from jobs to hot parent rows "
    "(`sqla-queue migrate --drop-queue-fk`)."
)
FIX_FREEZE = (
    "Heavy MultiXact minting forces more frequent freezing: stop the minting (savepoints, "
    "the queue foreign key) and let VACUUM (FREEZE) of the table catch up."
)
FIX_LONG_TRANSACTION = (
    "Commit the claim and process outside the transaction: a long-running transaction pins "
    "old row versions across the entire database, so vacuum cannot remove the dead "
    "versions of finished jobs."
)
FIX_HORIZON = (
    "Commit or roll back old prepared transactions (COMMIT PREPARED / ROLLBACK PREPARED) and "
    "drop replication slots nobody consumes: both pin old row versions like a long transaction."
)
FIX_SUBTRANSACTIONS = (
    "Remove subtransactions from the claim path: find the savepoint your framework adds "
    "(SQLAlchemy's begin_nested, Django's nested atomic, Rails requires_new) and turn it "
    "off for the worker."
)
FIX_FOREIGN_KEY = (
    "Drop the foreign key from jobs to hot parent rows (`sqla-queue migrate --drop-queue-fk`): "
    "a constraint is cheap to check once and expensive when a thousand inserts a second all "
    "pin the same parent."
)
FIX_ORPHANS = (
    "Without the foreign key nothing stops a typo in a queue name: create the missing queues "
    "(`sqla-queue queues create NAME`) or cancel their jobs."
)
FIX_TABLE_SIZE = (
    "Keep the table small: delete finished jobs or move them to an archive table (queue "
    "retention delete or archive, or `sqla-queue prune`), so the partial index and vacuum "
    "have little to do."
)
FIX_VACUUM = (
    "Let the workers vacuum the jobs table (WorkerConfig.vacuum_threshold, on by default) as "
    "a role that may (the table's owner), or run VACUUM sqla_queue.jobs; look for a long "
    "transaction holding the vacuum horizon back (the oldest_xmin check)."
)
FIX_AUTOVACUUM = (
    "Give the table its own autovacuum settings (autovacuum_vacuum_scale_factor = 0 with a "
    "fixed threshold, as `sqla-queue migrate` sets them) so it is vacuumed on a schedule the "
    "rest of the database does not dictate."
)
FIX_AUTOVACUUM_OFF = (
    "Turn autovacuum back on (autovacuum = on; RESET (autovacuum_enabled) on the table): "
    "without it nothing removes the dead versions of finished jobs and the table bloats."
)
FIX_BLOCKED_LOOP = (
    "An async handler is calling blocking code (time.sleep, a sync client, heavy CPU), so the "
    "worker's event loop cannot run its other async jobs, and after half a lease their leases "
    "lapse and they are reaped. Await instead (asyncio.sleep, an async client), move the "
    "blocking call to a thread (await asyncio.to_thread(...)), or make the task a sync one. "
    "The worker's log names the jobs that were running."
)
FIX_OVERRUN = (
    "A sync handler cannot be interrupted: past its timeout, or once its job is cancelled, "
    "it runs on until it returns, and keeps its slot of the worker and of its queue's "
    "concurrency until then (a worker whose every slot is held so claims nothing). Make the "
    "handler return: give its blocking calls their own timeouts, and check ctx.cancelled in "
    "long loops. Restarting the worker ends the thread (its job is written as decided)."
)
FIX_STUCK = (
    "A crashed worker leaves its job stuck in running, so you need a reaper: keep at least "
    "one `sqla-queue worker` running; it requeues jobs past their own lease deadline and the "
    "jobs of workers that stopped heartbeating."
)
FIX_BACKLOG = (
    "Run more workers for these queues, or claim more per poll (--batch, --concurrency): "
    "poll less, claim more."
)
FIX_FAILED = (
    "Jobs are rows: read last_error of the failed jobs, fix the handler, then requeue them "
    "or remove them (`sqla-queue prune --status failed`)."
)
FIX_UNKNOWN = (
    "Workers took these jobs and had no handler for their task (a new release's task on an "
    "old worker, or a worker serving every queue): they put them back without using an "
    "attempt, later each time (up to every 5 minutes). Deploy a worker whose registry has "
    "the task (`--app`), or delete the jobs if the task is gone for good."
)
FIX_SCHEMA = "Run `sqla-queue migrate` (or `alembic upgrade heads`) to create the schema."

EXPECTED_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "1000",
}
"""The storage parameters our migration gives the jobs table, as doctor expects them."""

MULTIXACT_CRITICAL_AGE = 1_000_000_000
"""Half of the 2^31 MultiXact ids after which PostgreSQL stops to prevent wraparound."""

Check = Callable[[Connection, DoctorOptions], Finding]


def _bytes(count: float | None) -> str:
    value = float(count or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def _seconds(value: Any) -> float | None:
    """A number of seconds from the database (Decimal from EXTRACT) as a JSON-able float."""
    return None if value is None else float(value)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _by_duration(seconds: float, options: DoctorOptions) -> Severity:
    if seconds >= 10 * options.long_transaction:
        return Severity.critical
    if seconds >= options.long_transaction:
        return Severity.warn
    return Severity.ok


def _settings(conn: Connection) -> dict[str, str]:
    return {str(name): str(setting) for name, setting in conn.execute(queries.server_settings())}


def check_schema(conn: Connection, options: DoctorOptions) -> Finding:
    """The sqla_queue schema exists; its revision."""
    revision = schema_revision(conn)
    if revision is None:
        return Finding("schema", Severity.critical, "no sqla_queue schema", FIX_SCHEMA)
    return Finding(
        "schema", Severity.ok, f"revision {revision}", FIX_SCHEMA, {"revision": revision}
    )


def check_server_version(conn: Connection, options: DoctorOptions) -> Finding:
    """The server's version and, from PostgreSQL 17, its MultiXact SLRU cache sizes."""
    settings = _settings(conn)
    version = settings.get("server_version", "?")
    buffers = {
        name: settings[name]
        for name in ("multixact_offset_buffers", "multixact_member_buffers")
        if name in settings
    }
    if buffers:
        shown = ", ".join(f"{name}={value}" for name, value in buffers.items())
        value = f"PostgreSQL {version}; {shown}"
    else:
        value = f"PostgreSQL {version}; MultiXact SLRU caches fixed in size (before 17)"
    details = {"server_version": version, "server_version_num": settings.get("server_version_num")}
    return Finding("server_version", Severity.ok, value, FIX_UPGRADE, details | buffers)


def check_multixact_waits(conn: Connection, options: DoctorOptions) -> Finding:
    """Backends of the whole cluster now waiting on a MultiXact lock or SLRU."""
    waits = {str(event): int(count) for event, count in conn.execute(queries.multixact_waits())}
    total = sum(waits.values())
    if not total:
        return Finding("multixact_waits", Severity.ok, "no backend waiting", FIX_MULTIXACTS)
    shown = ", ".join(f"{count} on {event}" for event, count in waits.items())
    severity = Severity.critical if total >= 10 else Severity.warn
    return Finding(
        "multixact_waits", severity, f"{total} backend(s) waiting: {shown}", FIX_MULTIXACTS, waits
    )


def check_multixact_rate(conn: Connection, options: DoctorOptions) -> Finding:
    """MultiXacts minted per second in the cluster, watched for `options.sample` seconds."""
    if options.sample <= 0:
        return Finding("multixact_rate", Severity.ok, "not sampled (--sample 0)", FIX_MULTIXACTS)
    first = int(conn.execute(queries.next_multixact_id()).scalar_one())
    time.sleep(options.sample)
    last = int(conn.execute(queries.next_multixact_id()).scalar_one())
    minted = (last - first) % 2**32
    rate = minted / options.sample
    severity = Severity.warn if rate > options.multixact_rate else Severity.ok
    value = f"{minted} minted in {options.sample:g} s ({rate:.0f}/s, cluster-wide)"
    return Finding(
        "multixact_rate",
        severity,
        value,
        FIX_MULTIXACTS,
        {"minted": minted, "seconds": options.sample, "per_second": rate},
    )


def check_multixact_age(conn: Connection, options: DoctorOptions) -> Finding:
    """The oldest MultiXact id still in our tables, against the freeze settings."""
    freeze_max = int(_settings(conn).get("autovacuum_multixact_freeze_max_age", "400000000"))
    ages = {str(name): int(age) for name, age, _ in conn.execute(queries.table_multixact_ages())}
    oldest = max(ages.values(), default=0)
    if oldest >= MULTIXACT_CRITICAL_AGE:
        severity = Severity.critical
    elif oldest >= freeze_max:
        severity = Severity.warn
    else:
        severity = Severity.ok
    shown = ", ".join(f"{name} {age}" for name, age in ages.items())
    value = f"mxid_age: {shown} (autovacuum_multixact_freeze_max_age {freeze_max})"
    details = {"mxid_age": ages, "autovacuum_multixact_freeze_max_age": freeze_max}
    return Finding("multixact_age", severity, value, FIX_FREEZE, details)


_FIRST_WORD = re.compile(r"\s*([A-Za-z]+)")
# Only a known command word is shown: a first word that is not one could be anything.
_COMMANDS = frozenset(
    [
        "ALTER",
        "ANALYZE",
        "BEGIN",
        "CALL",
        "CHECKPOINT",
        "CLOSE",
        "CLUSTER",
        "COMMENT",
        "COMMIT",
        "COPY",
        "CREATE",
        "DEALLOCATE",
        "DECLARE",
        "DELETE",
        "DISCARD",
        "DO",
        "DROP",
        "END",
        "EXECUTE",
        "EXPLAIN",
        "FETCH",
        "GRANT",
        "INSERT",
        "LISTEN",
        "LOCK",
        "MERGE",
        "MOVE",
        "NOTIFY",
        "PREPARE",
        "REFRESH",
        "REINDEX",
        "RELEASE",
        "RESET",
        "REVOKE",
        "ROLLBACK",
        "SAVEPOINT",
        "SELECT",
        "SET",
        "SHOW",
        "START",
        "TABLE",
        "TRUNCATE",
        "UNLISTEN",
        "UPDATE",
        "VACUUM",
        "VALUES",
        "WITH",
    ]
)


def _holder(
    row: Sequence[Any], xid_age: int | None, seconds: float, options: DoctorOptions
) -> tuple[str, dict[str, Any]]:
    pid, app, state = row[0], row[1] or "", row[2]
    what = f"{xid_age} xids old" if xid_age is not None else "no xid"
    text = f"pid {pid} ({app or 'no application_name'}, {state}) open {seconds:.0f} s, {what}"
    details = {
        "pid": pid,
        "application_name": app,
        "state": state,
        "seconds": seconds,
        "age": xid_age,
        # A keyword holds no secret; the text may (`--show-queries` opts in).
        "command": _command(row[6]),
        "query": row[6] if options.show_queries else None,
    }
    return text, details


def _command(query: str | None) -> str | None:
    """The statement's command word (SELECT, UPDATE...); None if it starts otherwise."""
    match = _FIRST_WORD.match(query or "")
    word = match.group(1).upper() if match else None
    return word if word in _COMMANDS else None


def check_oldest_transaction(conn: Connection, options: DoctorOptions) -> Finding:
    """The oldest other transaction of this database that holds a transaction id."""
    rows = [row for row in conn.execute(queries.open_transactions()) if row[3] is not None]
    if not rows:
        return Finding(
            "oldest_transaction", Severity.ok, "no transaction holds an xid", FIX_LONG_TRANSACTION
        )
    row = rows[0]
    seconds = float(row[5] or 0)
    text, details = _holder(row, int(row[3]), seconds, options)
    return Finding(
        "oldest_transaction", _by_duration(seconds, options), text, FIX_LONG_TRANSACTION, details
    )


def check_oldest_xmin(conn: Connection, options: DoctorOptions) -> Finding:
    """The other backend of this database with the oldest snapshot (backend_xmin)."""
    rows = [row for row in conn.execute(queries.open_transactions()) if row[4] is not None]
    if not rows:
        return Finding("oldest_xmin", Severity.ok, "no snapshot held", FIX_LONG_TRANSACTION)
    row = max(rows, key=lambda r: (int(r[4]), float(r[5] or 0)))
    seconds = float(row[5] or 0)
    text, details = _holder(row, int(row[4]), seconds, options)
    return Finding(
        "oldest_xmin",
        _by_duration(seconds, options),
        f"backend_xmin of {text}",
        FIX_LONG_TRANSACTION,
        details,
    )


def check_vacuum_horizon(conn: Connection, options: DoctorOptions) -> Finding:
    """Prepared transactions of this database and replication slots that hold back vacuum."""
    prepared = [
        {"gid": gid, "age": int(age), "seconds": float(seconds)}
        for gid, age, seconds in conn.execute(queries.prepared_transactions())
    ]
    slots = [
        {"slot": name, "xmin_age": xmin_age, "catalog_xmin_age": catalog_age}
        for name, xmin_age, catalog_age in conn.execute(queries.replication_slot_horizons())
    ]
    if not prepared and not slots:
        return Finding(
            "vacuum_horizon", Severity.ok, "no prepared transaction or slot holds it", FIX_HORIZON
        )
    parts = [f"prepared {p['gid']!r} {p['seconds']:.0f} s" for p in prepared]
    parts += [f"slot {s['slot']!r} xmin age {s['xmin_age']}" for s in slots]
    oldest = max((p["seconds"] for p in prepared), default=0.0)
    severity = Severity.warn if slots else _by_duration(oldest, options)
    return Finding(
        "vacuum_horizon",
        severity,
        "; ".join(parts),
        FIX_HORIZON,
        {"prepared": prepared, "slots": slots},
    )


def check_subtransactions(conn: Connection, options: DoctorOptions) -> Finding:
    """Backends of this database that have written inside a savepoint (now)."""
    rows = conn.execute(queries.subtransaction_writers()).all()
    if not rows:
        return Finding(
            "subtransactions", Severity.ok, "no backend writing in a savepoint", FIX_SUBTRANSACTIONS
        )
    shown = ", ".join(f"pid {pid} ({app or '?'}, {xids} xids)" for pid, app, xids in rows)
    details = {"backends": [{"pid": pid, "application_name": app} for pid, app, _ in rows]}
    return Finding(
        "subtransactions",
        Severity.warn,
        f"{len(rows)} backend(s) writing in savepoints: {shown}",
        FIX_SUBTRANSACTIONS,
        details,
    )


def check_queue_foreign_key(conn: Connection, options: DoctorOptions) -> Finding:
    """Whether jobs.queue references queues, and how many sessions enqueue at once."""
    names = list(conn.execute(queries.queue_foreign_keys()).scalars())
    enqueuers = int(conn.execute(queries.recent_enqueuers()).scalar_one())
    details: dict[str, Any] = {"present": bool(names), "recent_enqueuers": enqueuers}
    if not names:
        orphans = {str(queue): int(count) for queue, count in conn.execute(queries.orphan_queues())}
        details["orphan_queues"] = orphans
        if orphans:
            listed = ", ".join(f"{queue!r} ({count} jobs)" for queue, count in orphans.items())
            value = f"absent; jobs name queues that do not exist: {listed}"
            return Finding("queue_foreign_key", Severity.warn, value, FIX_ORPHANS, details)
        value = f"absent; {enqueuers} session(s) enqueuing now or last"
        return Finding("queue_foreign_key", Severity.ok, value, FIX_FOREIGN_KEY, details)
    value = f"present ({', '.join(names)}); {enqueuers} session(s) enqueuing now or last"
    severity = Severity.warn if enqueuers >= options.concurrent_enqueuers else Severity.ok
    return Finding("queue_foreign_key", severity, value, FIX_FOREIGN_KEY, details)


def check_tables(conn: Connection, options: DoctorOptions) -> Finding:
    """Size, live and dead tuples and last vacuum of our tables."""
    tables: dict[str, dict[str, Any]] = {}
    for name, live, dead, heap, indexes, total, autovacuumed, vacuumed, _ in conn.execute(
        queries.table_health()
    ):
        tables[str(name)] = {
            "live_tuples": int(live),
            "dead_tuples": int(dead),
            "heap_bytes": int(heap),
            "index_bytes": int(indexes),
            "total_bytes": int(total),
            "last_autovacuum_seconds_ago": _seconds(autovacuumed),
            "last_vacuum_seconds_ago": _seconds(vacuumed),
        }
    parts = [
        f"{name}: {_bytes(t['total_bytes'])} (heap {_bytes(t['heap_bytes'])}, indexes "
        f"{_bytes(t['index_bytes'])}), {t['live_tuples']} live / {t['dead_tuples']} dead, "
        f"autovacuumed {_ago(t['last_autovacuum_seconds_ago'])}"
        for name, t in tables.items()
    ]
    jobs = tables.get("jobs", {"live_tuples": 0, "dead_tuples": 0})
    bloated = (
        jobs["dead_tuples"] > options.dead_tuples and jobs["dead_tuples"] > jobs["live_tuples"]
    )
    severity = Severity.warn if bloated else Severity.ok
    return Finding("tables", severity, "; ".join(parts), FIX_TABLE_SIZE, tables)


def check_jobs_vacuum(conn: Connection, options: DoctorOptions) -> Finding:
    """The jobs table's dead rows and last vacuum: whether vacuum keeps up with the rate."""
    behind, value, details = vacuum.jobs_vacuum_report(conn)
    severity = Severity.warn if behind else Severity.ok
    return Finding("jobs_vacuum", severity, value, FIX_VACUUM, details)


def check_autovacuum_settings(conn: Connection, options: DoctorOptions) -> Finding:
    """The jobs table keeps the autovacuum storage parameters our migration set."""
    reloptions: list[str] = []
    for row in conn.execute(queries.table_health()):
        if row[0] == "jobs":
            reloptions = list(row[8] or [])
    current = dict(option.split("=", 1) for option in reloptions)
    differ = {
        name: current.get(name)
        for name, expected in EXPECTED_AUTOVACUUM.items()
        if current.get(name) != expected
    }
    autovacuum_on = _settings(conn).get("autovacuum", "on") == "on"
    disabled = current.get("autovacuum_enabled", "true").lower() in ("false", "off", "0")
    details = {"reloptions": current, "differ": differ, "server_autovacuum": autovacuum_on}
    if disabled or not autovacuum_on:
        where = "on the jobs table" if disabled else "on the server"
        return Finding(
            "autovacuum_settings",
            Severity.warn,
            f"autovacuum is off {where}",
            FIX_AUTOVACUUM_OFF,
            details,
        )
    if differ:
        shown = ", ".join(f"{name}={value or 'default'}" for name, value in differ.items())
        return Finding(
            "autovacuum_settings",
            Severity.warn,
            f"jobs table differs from the migration: {shown}",
            FIX_AUTOVACUUM,
            details,
        )
    shown = ", ".join(f"{name}={current[name]}" for name in EXPECTED_AUTOVACUUM)
    return Finding("autovacuum_settings", Severity.ok, shown, FIX_AUTOVACUUM, details)


def check_stuck_jobs(conn: Connection, options: DoctorOptions) -> Finding:
    """Running jobs the reaper would requeue now: past their own lease deadline, or held by
    a worker whose registration expired (`queries.stuck_condition`, the reaper's own)."""
    count, oldest = conn.execute(queries.stuck_jobs()).one()
    if not count:
        value = "no running job past its lease or held by a dead worker"
        return Finding("stuck_jobs", Severity.ok, value, FIX_STUCK, {"count": 0})
    oldest = float(oldest)
    # Live workers reap every few seconds: a job overdue for long means none is reaping.
    severity = Severity.critical if oldest >= 2 * options.lease else Severity.warn
    value = (
        f"{count} running job(s) past their lease or held by a dead worker "
        f"(oldest {oldest:.0f} s overdue)"
    )
    details = {"count": int(count), "oldest_seconds": oldest, "lease": options.lease}
    return Finding("stuck_jobs", severity, value, FIX_STUCK, details)


def check_workers(conn: Connection, options: DoctorOptions) -> Finding:
    """The live workers, from their registrations (each beats every few seconds)."""
    rows = conn.execute(queries.live_workers()).mappings().all()
    workers = [
        {
            "id": row["id"],
            "hostname": row["hostname"],
            "pid": row["pid"],
            "queues": row["queues"],
            "concurrency": row["concurrency"],
            "running": int(row["running"]),
            "silent_seconds": float(row["silent_seconds"]),
            "loop_blocked_seconds": (
                None if row["loop_blocked_seconds"] is None else float(row["loop_blocked_seconds"])
            ),
            "overruns": list(row["overruns"] or []),
        }
        for row in rows
    ]
    value = (
        f"{len(workers)} live worker(s), {sum(w['running'] for w in workers)} job(s) running"
        if workers
        else "no live worker: queued jobs wait and stuck jobs are not reaped"
    )
    overruns = [(w, o) for w in workers for o in w["overruns"]]
    if overruns:
        named = "; ".join(_overrun(w, o) for w, o in overruns[:5])
        value += f"; {len(overruns)} handler(s) overran and still run: {named}"
        return Finding("workers", Severity.warn, value, FIX_OVERRUN, {"workers": workers})
    blocked = [w for w in workers if w["loop_blocked_seconds"] is not None]
    if blocked:
        named = ", ".join(
            f"{w['id']} ({w['hostname']}, pid {w['pid']}) for {w['loop_blocked_seconds']:.0f} s"
            for w in blocked[:5]
        )
        value += f"; event loop blocked in {len(blocked)}: {named}"
        return Finding("workers", Severity.warn, value, FIX_BLOCKED_LOOP, {"workers": workers})
    return Finding("workers", Severity.ok, value, FIX_STUCK, {"workers": workers})


def _overrun(worker: dict[str, Any], overrun: dict[str, Any]) -> str:
    """One handler that overran its timeout or cancel, as its worker's last beat told it."""
    seconds = float(overrun.get("seconds") or 0) + worker["silent_seconds"]
    job, task, reason = overrun.get("job"), overrun.get("task"), overrun.get("reason")
    how = (
        f"has overrun its timeout by {seconds:.0f} s"
        if reason == "timed out"
        else f"was {reason} {seconds:.0f} s ago"
    )
    return f"job {job} of task {task} {how} and its thread still runs on worker {worker['id']}"


def check_backlog(conn: Connection, options: DoctorOptions) -> Finding:
    """Queued jobs due more than `backlog_threshold` seconds ago, per queue."""
    params = {"threshold": options.backlog_threshold}
    late: dict[str, dict[str, Any]] = {}
    for queue, paused, count, oldest in conn.execute(queries.overdue_jobs(), params):
        late[str(queue)] = {"count": int(count), "oldest_seconds": float(oldest), "paused": paused}
    active = {name: q for name, q in late.items() if not q["paused"]}
    if not late:
        value = f"no job more than {options.backlog_threshold:g} s past its run_at"
        return Finding("backlog", Severity.ok, value, FIX_BACKLOG, late)
    shown = ", ".join(
        f"{name}: {q['count']} (oldest {q['oldest_seconds']:.0f} s late"
        f"{', paused' if q['paused'] else ''})"
        for name, q in late.items()
    )
    severity = Severity.warn if active else Severity.ok
    return Finding("backlog", severity, f"overdue jobs per queue: {shown}", FIX_BACKLOG, late)


def check_failed_jobs(conn: Connection, options: DoctorOptions) -> Finding:
    """Jobs that failed for good, per queue."""
    failed: dict[str, dict[str, Any]] = {
        str(queue): {"count": int(count), "latest_seconds_ago": _seconds(latest)}
        for queue, count, latest in conn.execute(queries.failed_job_counts())
    }
    if not failed:
        return Finding("failed_jobs", Severity.ok, "no failed job", FIX_FAILED, failed)
    total = sum(q["count"] for q in failed.values())
    shown = ", ".join(
        f"{name}: {q['count']} (latest {_ago(q['latest_seconds_ago'])})"
        for name, q in failed.items()
    )
    return Finding("failed_jobs", Severity.warn, f"{total} failed: {shown}", FIX_FAILED, failed)


def check_unknown_tasks(conn: Connection, options: DoctorOptions) -> Finding:
    """Queued jobs put back by workers that have no handler for their task."""
    waiting: dict[str, dict[str, Any]] = {
        str(task): {"count": int(count), "oldest_seconds": _seconds(oldest)}
        for task, count, oldest in conn.execute(queries.unknown_task_counts())
    }
    if not waiting:
        return Finding(
            "unknown_tasks", Severity.ok, "no job waits for a worker that knows it", FIX_UNKNOWN
        )
    shown = ", ".join(
        f"{q['count']} jobs of task {task!r} waiting for a worker that knows it "
        f"(enqueued {_ago(q['oldest_seconds'])})"
        for task, q in waiting.items()
    )
    return Finding("unknown_tasks", Severity.warn, shown, FIX_UNKNOWN, waiting)


SERVER_CHECKS: tuple[Check, ...] = (
    check_server_version,
    check_multixact_waits,
    check_multixact_rate,
    check_oldest_transaction,
    check_oldest_xmin,
    check_vacuum_horizon,
    check_subtransactions,
)
"""Checks that need no sqla_queue schema."""

QUEUE_CHECKS: tuple[Check, ...] = (
    check_multixact_age,
    check_queue_foreign_key,
    check_tables,
    check_autovacuum_settings,
    check_jobs_vacuum,
    check_stuck_jobs,
    check_workers,
    check_backlog,
    check_failed_jobs,
    check_unknown_tasks,
)
"""Checks of our own tables; skipped when the schema is missing."""


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
        fix = "Run doctor as a role that can read pg_stat_activity (pg_read_all_stats)."
        return Finding(name, Severity.warn, f"could not check: {message}", fix)


def diagnose(bind: Engine | Connection, options: DoctorOptions | None = None) -> list[Finding]:
    """Run every check against `bind`; return the findings in a stable order."""
    options = options or DoctorOptions()
    if isinstance(bind, Engine):
        with bind.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return diagnose(conn, options)
    schema = _run_check(bind, check_schema, options)
    checks = SERVER_CHECKS + (QUEUE_CHECKS if schema.severity is Severity.ok else ())
    return [schema, *(_run_check(bind, check, options) for check in checks)]


def worst(findings: Sequence[Finding]) -> Severity:
    """The most severe severity among `findings` (ok when there are none)."""
    order = [Severity.ok, Severity.warn, Severity.critical]
    return max((f.severity for f in findings), key=order.index, default=Severity.ok)


__all__ = [
    "DoctorOptions",
    "Finding",
    "Severity",
    "diagnose",
    "worst",
]
