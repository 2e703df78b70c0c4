"""Doctor's checks: each a function `(connection, options) -> Finding`, read-only, its
statements from `sqla_queue.db.queries`."""

from __future__ import annotations

import datetime as dt
import re
import shlex
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from sqla_queue.admin import partitions
from sqla_queue.db import queries, rollup
from sqla_queue.db.migrate import has_optional_revisions, schema_revision
from sqla_queue.db.queries import signals as signal_queries
from sqla_queue.db.queries import vacuum
from sqla_queue.doctor.findings import (
    EXPECTED_AUTOVACUUM,
    FIX_AUTOVACUUM,
    FIX_AUTOVACUUM_OFF,
    FIX_BACKLOG,
    FIX_BLOCKED_LOOP,
    FIX_DRIFT,
    FIX_FAILED,
    FIX_FOREIGN_KEY,
    FIX_FREEZE,
    FIX_HELD_SEQUENCE,
    FIX_HISTORY,
    FIX_HORIZON,
    FIX_LONG_TRANSACTION,
    FIX_MULTIXACTS,
    FIX_ORPHANS,
    FIX_OVERRUN,
    FIX_SCHEMA,
    FIX_SIGNALS,
    FIX_STUCK,
    FIX_SUBTRANSACTIONS,
    FIX_TABLE_SIZE,
    FIX_TRUNCATE,
    FIX_UNKNOWN,
    FIX_UPGRADE,
    FIX_VACUUM,
    FIX_WAITING,
    MULTIXACT_CRITICAL_AGE,
    TRUNCATABLE_WARN_BYTES,
    Check,
    DoctorOptions,
    Finding,
    Severity,
    ago,
    by_duration,
    format_bytes,
    seconds_of,
)
from sqla_queue.job.validation import describe_age


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
        "oldest_transaction",
        by_duration(seconds, options),
        text,
        FIX_LONG_TRANSACTION,
        details,
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
        by_duration(seconds, options),
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
    severity = Severity.warn if slots else by_duration(oldest, options)
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
    """What refuses a job of an unknown queue: the queue check's triggers, which lock
    nothing (sqlaq_0031 on); a foreign key (an older schema), whose lock on the queue's row
    mints MultiXacts while sessions enqueue at once; or nothing (`--drop-queue-fk`); and
    the jobs that name queues that do not exist."""
    names = list(conn.execute(queries.queue_foreign_keys()).scalars())
    enqueuers = int(conn.execute(queries.recent_enqueuers()).scalar_one())
    triggers = {str(r.name) for r in conn.execute(queries.schema_triggers())}
    checked = "jobs_queue_known" in triggers
    details: dict[str, Any] = {
        "present": bool(names),
        "checked_by_triggers": checked,
        "recent_enqueuers": enqueuers,
    }
    if not names:
        orphans = {str(queue): int(count) for queue, count in conn.execute(queries.orphan_queues())}
        details["orphan_queues"] = orphans
        if orphans:
            listed = ", ".join(f"{queue!r} ({count} jobs)" for queue, count in orphans.items())
            value = f"absent; jobs name queues that do not exist: {listed}"
            return Finding("queue_foreign_key", Severity.warn, value, FIX_ORPHANS, details)
        how = (
            "the queue check's triggers refuse unknown queues without a lock"
            if checked
            else "jobs may name unknown queues (--drop-queue-fk)"
        )
        value = f"absent: {how}; {enqueuers} session(s) enqueuing now or last"
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
            "last_autovacuum_seconds_ago": seconds_of(autovacuumed),
            "last_vacuum_seconds_ago": seconds_of(vacuumed),
        }
    parts = [
        f"{name}: {format_bytes(t['total_bytes'])} (heap {format_bytes(t['heap_bytes'])}, indexes "
        f"{format_bytes(t['index_bytes'])}), {t['live_tuples']} live / {t['dead_tuples']} dead, "
        f"autovacuumed {ago(t['last_autovacuum_seconds_ago'])}"
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


def check_jobs_truncatable(conn: Connection, options: DoctorOptions) -> Finding:
    """The empty pages at the jobs table's end, which no VACUUM gives back on its own
    (`vacuum_truncate = false`, migration sqlaq_0017): the fix is the command that does,
    run as printed at a quiet moment (it holds an ACCESS EXCLUSIVE lock while it truncates,
    and every claim waits that long)."""
    pages, empty, block = vacuum.jobs_empty_tail(conn)
    details = {"pages": pages, "empty_pages": empty, "empty_bytes": empty * block}
    value = (
        f"{format_bytes(empty * block)} of empty pages at the end of the jobs table "
        f"({empty} of {pages} pages) could be given back"
    )
    severity = Severity.warn if empty * block >= TRUNCATABLE_WARN_BYTES else Severity.ok
    return Finding("jobs_truncatable", severity, value, FIX_TRUNCATE, details)


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
    severity = Severity.critical if oldest >= 2 * options.stuck_after else Severity.warn
    value = (
        f"{count} running job(s) past their lease or held by a dead worker "
        f"(oldest {oldest:.0f} s overdue)"
    )
    details = {"count": int(count), "oldest_seconds": oldest, "stuck_after": options.stuck_after}
    return Finding("stuck_jobs", severity, value, FIX_STUCK, details)


def check_waiting_jobs(conn: Connection, options: DoctorOptions) -> Finding:
    """Jobs waiting for others (workflows): those held by a dependency that ended failed or
    cancelled, and those that wait for no unfinished job (which can never run)."""
    waiting, held, orphaned, oldest = conn.execute(queries.workflows.waiting_health()).one()
    details = {"waiting": int(waiting), "held": int(held), "orphaned": int(orphaned)}
    if orphaned:
        value = f"{orphaned} waiting job(s) wait for no unfinished job: they can never run"
        return Finding("waiting_jobs", Severity.critical, value, FIX_WAITING, details)
    if held:
        value = (
            f"{held} waiting job(s) held by a dependency that ended failed or cancelled "
            "(they run once it is retried and succeeds)"
        )
        return Finding("waiting_jobs", Severity.warn, value, FIX_WAITING, details)
    value = f"{waiting} job(s) waiting for their dependencies" if waiting else "no waiting job"
    if waiting:
        value += f" (oldest enqueued {float(oldest):.0f} s ago)"
    return Finding("waiting_jobs", Severity.ok, value, FIX_WAITING, details)


def check_signals(conn: Connection, options: DoctorOptions) -> Finding:
    """Jobs parked for a signal long past their wait's deadline (no worker's keeper woke
    them), and mailboxes that grow with no job waiting for their key."""
    overdue, oldest, keys = conn.execute(
        signal_queries.overdue_waits(), {"grace": options.stuck_after}
    ).one()
    unread = conn.execute(signal_queries.unread_mailboxes(), {"min_count": MAILBOX_WARN}).all()
    overdue_keys = list(dict.fromkeys(keys or []))[:5]
    details = {
        "overdue_waits": int(overdue),
        "overdue_keys": overdue_keys,
        "unread_mailboxes": {key: int(n) for key, n, _ in unread},
    }
    problems = []
    if overdue:
        shown = ", ".join(repr(k) for k in overdue_keys)
        problems.append(
            f"{overdue} job(s) still wait for a signal past their deadline (oldest "
            f"{oldest.isoformat()}; keys {shown}): no worker's keeper woke them"
        )
    if unread:
        shown = ", ".join(f"{key!r} ({n})" for key, n, _ in unread)
        problems.append(f"signals pile up with no job waiting for them: {shown}")
    if not problems:
        return Finding("signals", Severity.ok, "no overdue wait, no unread mailbox", FIX_SIGNALS)
    return Finding("signals", Severity.warn, "; ".join(problems), FIX_SIGNALS, details)


MAILBOX_WARN = 1000
"""Unexpired signals of one key, with no job waiting for it, from which doctor warns."""


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
            "claimed": int(row["claimed"]),
            "silent_seconds": float(row["silent_seconds"]),
            "loop_blocked_seconds": (
                None if row["loop_blocked_seconds"] is None else float(row["loop_blocked_seconds"])
            ),
            "overruns": list(row["overruns"] or []),
        }
        for row in rows
    ]
    value = (
        f"{len(workers)} live worker(s), {sum(w['running'] for w in workers)} job(s) running, "
        f"{sum(w['claimed'] for w in workers)} claimed and not started"
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
    """Jobs that failed for good, per queue: counted in the table while it is small; from
    `rollup.BIG_TABLE` jobs on, those that failed in the last day, from the rollup (the
    failed jobs have no index of their own: counting them would read every job)."""
    if rollup.big_table(conn):
        scope = " in the last day (the workers' rollup: the table is too big to count them)"
        return _failed_finding(_failed_last_day(conn), scope)
    failed: dict[str, dict[str, Any]] = {
        str(queue): {"count": int(count), "latest_seconds_ago": seconds_of(latest)}
        for queue, count, latest in conn.execute(queries.failed_job_counts())
    }
    return _failed_finding(failed, "")


def _failed_finding(failed: dict[str, dict[str, Any]], scope: str) -> Finding:
    if not failed:
        none = f"no job failed{scope}" if scope else "no failed job"
        return Finding("failed_jobs", Severity.ok, none, FIX_FAILED, failed)
    total = sum(q["count"] for q in failed.values())
    shown = ", ".join(
        f"{name}: {q['count']} (latest {ago(q['latest_seconds_ago'])})"
        for name, q in failed.items()
    )
    value = f"{total} failed{scope}: {shown}"
    return Finding("failed_jobs", Severity.warn, value, FIX_FAILED, failed)


def _failed_last_day(conn: Connection) -> dict[str, dict[str, Any]]:
    """Jobs that failed in the last day per queue, and how long ago the latest did (to
    the 10 minutes), from the workers' rollup."""
    now = time.time()
    failed: dict[str, dict[str, Any]] = {}
    for queue, series in sorted(rollup.recent(conn, rollup.DAY).items()):
        buckets = [i for i, count in enumerate(series.failed) if count]
        if buckets:
            latest = series.start.timestamp() + (buckets[-1] + 1) * rollup.DAY.step * 60
            failed[queue] = {
                "count": sum(series.failed),
                "latest_seconds_ago": max(0.0, now - latest),
            }
    return failed


def check_unknown_tasks(conn: Connection, options: DoctorOptions) -> Finding:
    """Queued jobs put back by workers that have no handler for their task."""
    waiting: dict[str, dict[str, Any]] = {
        str(task): {"count": int(count), "oldest_seconds": seconds_of(oldest)}
        for task, count, oldest in conn.execute(queries.unknown_task_counts())
    }
    if not waiting:
        return Finding(
            "unknown_tasks", Severity.ok, "no job waits for a worker that knows it", FIX_UNKNOWN
        )
    shown = ", ".join(
        f"{q['count']} jobs of task {task!r} waiting for a worker that knows it "
        f"(enqueued {ago(q['oldest_seconds'])})"
        for task, q in waiting.items()
    )
    return Finding("unknown_tasks", Severity.warn, shown, FIX_UNKNOWN, waiting)


HELD_SEQUENCE_AFTER = 15 * 60.0
"""Seconds a failed job may hold its sequence, jobs waiting behind it, before doctor warns."""
HELD_NAMED = 5
"""Held sequences a finding names one by one at most (the longest held)."""


def check_held_sequences(conn: Connection, options: DoctorOptions) -> Finding:
    """Sequences a failed job has held for over `HELD_SEQUENCE_AFTER` seconds while queued
    jobs of the sequence wait behind it (by ix_jobs_sequence: the unfinished and failed
    jobs of a sequence only)."""
    found = partitions.held_sequences(conn, limit=100, waiting=True)
    held = [h for h in found if h.held_for > HELD_SEQUENCE_AFTER]
    details: dict[str, Any] = {
        "threshold_seconds": HELD_SEQUENCE_AFTER,
        "held": [
            {
                "sequence": h.sequence,
                "queue": h.queue,
                "job_id": h.job_id,
                "held_seconds": h.held_for,
                "behind": h.behind,
            }
            for h in held
        ],
    }
    if not held:
        value = (
            f"no sequence held by a failed job for over {describe_age(HELD_SEQUENCE_AFTER)} "
            "with jobs waiting behind it"
        )
        return Finding("held_sequences", Severity.ok, value, FIX_HELD_SEQUENCE, details)
    named = "; ".join(
        f"sequence {h.sequence!r} of queue {h.queue!r} held by failed job {h.job_id} for "
        f"{describe_age(h.held_for)}, {h.behind} job(s) waiting behind it"
        for h in held[:HELD_NAMED]
    )
    more = f"; and {len(held) - HELD_NAMED} more" if len(held) > HELD_NAMED else ""
    first = held[0]
    fix = (
        # quoted as a shell needs it: the command must run as printed
        FIX_HELD_SEQUENCE.replace("ID", str(first.job_id)).replace(
            "QUEUE", shlex.quote(first.queue)
        )
        if len(held) == 1
        else FIX_HELD_SEQUENCE
    )
    value = f"{len(held)} sequence(s) held by a failed job: {named}{more}"
    return Finding("held_sequences", Severity.warn, value, fix, details)


def _create_index_concurrently(conn: Connection, index: Any) -> str:
    from sqlalchemy.schema import CreateIndex

    statement = str(CreateIndex(index).compile(dialect=conn.dialect))
    return " ".join(statement.replace(" INDEX ", " INDEX CONCURRENTLY ", 1).split())


def schema_differences(conn: Connection, worker_role: str | None = None) -> list[str]:
    """What the catalogue lacks of what head expects, each with its fix, one line each:
    tables, columns, indexes (and their validity), triggers, functions, and with
    `worker_role` that role's privileges."""
    from sqla_queue.db.models import (
        QUEUE_CHECK_TRIGGERS,
        SCHEMA,
        SCHEMA_FUNCTIONS,
        SCHEMA_TRIGGERS,
        WORKER_PRIVILEGES,
        QueueBase,
    )

    found: list[str] = []
    columns: dict[str, set[str]] = {}
    for name, column_name in conn.execute(queries.schema_columns()):
        columns.setdefault(str(name), set()).add(str(column_name))
    for table in QueueBase.metadata.sorted_tables:
        if table.name not in columns:
            found.append(f"table {SCHEMA}.{table.name} is missing: run `sqla-queue migrate`")
            continue
        for column in table.columns:
            if column.name not in columns[table.name]:
                found.append(
                    f"column {SCHEMA}.{table.name}.{column.name} is missing: "
                    f"ALTER TABLE {SCHEMA}.{table.name} ADD COLUMN {column.name} "
                    f"{column.type.compile(dialect=conn.dialect)}"
                )
    indexes = {str(r.name): bool(r.valid) for r in conn.execute(queries.schema_indexes())}
    for table in QueueBase.metadata.sorted_tables:
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            name = str(index.name)
            create = _create_index_concurrently(conn, index)
            if name not in indexes:
                found.append(f"index {SCHEMA}.{name} is missing: {create}")
            elif not indexes[name]:
                found.append(
                    f"index {SCHEMA}.{name} is INVALID (a build that did not finish; it is "
                    f"kept up to date but never used): DROP INDEX CONCURRENTLY "
                    f"{SCHEMA}.{name}; then {create}"
                )
    triggers = {str(r.name) for r in conn.execute(queries.schema_triggers())}
    expected = dict(SCHEMA_TRIGGERS)
    if not has_optional_revisions(conn):  # `--drop-queue-fk` drops the queue check
        expected.update(QUEUE_CHECK_TRIGGERS)
    for name, (table_name, where) in expected.items():
        if name not in triggers:
            found.append(
                f"trigger {name} on {SCHEMA}.{table_name} is missing: run its CREATE TRIGGER "
                f"from sqla_queue/migrations/versions/{where}"
            )
    functions = set(conn.execute(queries.schema_functions()).scalars())
    for name, where in SCHEMA_FUNCTIONS.items():
        if name not in functions:
            found.append(
                f"function {SCHEMA}.{name}() is missing: run its CREATE FUNCTION from "
                f"sqla_queue/migrations/versions/{where}"
            )
    if worker_role is not None:
        wanted = [(t, p) for t, privileges in WORKER_PRIVILEGES.items() for p in privileges]
        row = conn.execute(queries.role_privileges(wanted), {"role": worker_role}).one()
        if not row.role_exists:
            found.append(f"role {worker_role} does not exist: CREATE ROLE {worker_role} LOGIN")
            return found
        if not row.usage:
            found.append(
                f"role {worker_role} lacks USAGE on schema {SCHEMA}: "
                f"GRANT USAGE ON SCHEMA {SCHEMA} TO {worker_role}"
            )
        for i, (table_name, privilege) in enumerate(wanted):
            if row._mapping[f"p{i}"] is False:
                found.append(
                    f"role {worker_role} lacks {privilege} on {SCHEMA}.{table_name}: "
                    f"GRANT {privilege} ON {SCHEMA}.{table_name} TO {worker_role}"
                )
    return found


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.timezone.utc)


def check_history(conn: Connection, options: DoctorOptions) -> Finding:
    """The history of finished jobs: its partitions (how many, how far ahead, their size)
    and the rows its DEFAULT partition took (a period no partition was made for: no
    worker's keeper ran), which doctor names."""
    parts = conn.execute(queries.history_partitions()).all()
    stray, oldest = conn.execute(queries.history_default_rows()).one()
    ahead = conn.execute(queries.history_made_until()).scalar()
    details: dict[str, Any] = {
        "partitions": len(parts),
        "rows_estimate": sum(int(p.estimate) for p in parts),
        "bytes": sum(int(p.bytes) for p in parts),
        "default_rows": int(stray),
        "made_until": None if ahead is None else _utc(ahead).isoformat(),
    }
    if stray:
        value = (
            f"{stray} finished job(s) in the history's DEFAULT partition "
            f"(sqla_queue.jobs_history_default, the oldest finished {_utc(oldest):%Y-%m-%d %H:%M} "
            "UTC): no partition was made for their period"
        )
        return Finding("history", Severity.warn, value, FIX_HISTORY, details)
    if ahead is None:
        value = "no partition of the history covers now: finished jobs go to its DEFAULT one"
        return Finding("history", Severity.warn, value, FIX_HISTORY, details)
    value = (
        f"{len(parts)} partition(s), about {details['rows_estimate']} finished job(s), "
        f"made until {_utc(ahead):%Y-%m-%d %H:%M} UTC"
    )
    return Finding("history", Severity.ok, value, FIX_HISTORY, details)


def check_schema_drift(conn: Connection, options: DoctorOptions) -> Finding:
    """The catalogue holds what head expects: tables, columns, indexes (valid), triggers,
    functions, and the worker role's privileges (with `--worker-role`)."""
    differences = schema_differences(conn, options.worker_role)
    if not differences:
        checked = " and the worker role's privileges" if options.worker_role else ""
        return Finding(
            "schema_drift",
            Severity.ok,
            f"tables, columns, indexes, triggers and functions as head expects{checked}",
            FIX_DRIFT,
        )
    value = f"{len(differences)} difference(s): " + "; ".join(differences)
    return Finding(
        "schema_drift", Severity.critical, value, FIX_DRIFT, {"differences": differences}
    )


def check_claim_plan(conn: Connection, options: DoctorOptions) -> Finding:
    """The worker's claim reads the claim index in order (its plan, by EXPLAIN)."""
    ordered, message, details = queries.claim_plan_health(conn)
    rows = max(float(details["reltuples"]), 0.0) + int(details["changed_since_analyze"])
    if ordered or rows < options.claim_plan_rows:  # a sort of a few rows costs nothing
        if not ordered:
            message += (
                f"; harmless at about {rows:,.0f} rows (it matters past "
                f"{options.claim_plan_rows:,}, where a worker analyzes the table)"
            )
        return Finding("claim_plan", Severity.ok, message, queries.FIX_CLAIM_PLAN, details)
    return Finding("claim_plan", Severity.warn, message, queries.FIX_CLAIM_PLAN, details)


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
    check_schema_drift,
    check_tables,
    check_autovacuum_settings,
    check_jobs_vacuum,
    check_jobs_truncatable,
    check_claim_plan,
    check_stuck_jobs,
    check_waiting_jobs,
    check_signals,
    check_workers,
    check_backlog,
    check_failed_jobs,
    check_held_sequences,
    check_history,
    check_unknown_tasks,
)
"""Checks of our own tables; skipped when the schema is missing."""
