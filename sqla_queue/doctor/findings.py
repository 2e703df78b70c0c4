"""What doctor reports: a finding's severity, its figure and its fix, the thresholds that
decide them (`DoctorOptions`), and how figures are worded."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection


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

    stuck_after: float = 60.0
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
    worker_role: str | None = None
    """The role your workers log in as: `schema_drift` then checks it has each privilege a
    worker needs (`sqla_queue.db.models.WORKER_PRIVILEGES`)."""
    claim_plan_rows: int = 10_000
    """Rows in the jobs table (analyzed, plus changed since) under which a claim plan that
    sorts the due jobs is not worth a warning: sorting a few hundred rows costs nothing."""
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
    "the worker's updates) and the foreign key from jobs to hot parent rows (`sqla-queue "
    "migrate` replaces the queue's by triggers that lock nothing, since sqlaq_0031)."
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
    "Upgrade the schema (`sqla-queue migrate`): since sqlaq_0031 triggers that lock nothing "
    "refuse a job of an unknown queue in place of the foreign key from jobs to the queue's "
    "row, which is cheap to check once and expensive when a thousand inserts a second all "
    "pin the same parent (`--drop-queue-fk` lets jobs name unknown queues instead)."
)
FIX_ORPHANS = (
    "Jobs name queues that do not exist (after `--drop-queue-fk`, or a queue deleted while "
    "a job was enqueued into it): create the missing queues (`sqla-queue queues create "
    "NAME`) or cancel their jobs."
)
FIX_TABLE_SIZE = (
    "Keep the table small: delete finished jobs or keep them in the history (queue "
    "retention delete, keep or archive, or `sqla-queue prune --older-than 7d`), so the partial "
    "index and vacuum "
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
    "one worker running (`sqla-queue worker --app APP`, your registry as pkg.module:name); "
    "it requeues jobs past their own lease deadline and the jobs of workers that stopped "
    "heartbeating."
)
FIX_WAITING = (
    "A job waits (status waiting) until every job it depends on has ended. One held by a "
    "failed or cancelled dependency runs once that job is retried and succeeds: retry it "
    "(`sqla-queue jobs retry ID`; `sqla-queue jobs show ID` lists a job's parents), or "
    "cancel the waiting job. One that waits for no unfinished job cannot run: its edges "
    "(sqla_queue.job_deps) or its counter were changed by hand; cancel it and enqueue it again."
)
FIX_SIGNALS = (
    "A job parked by ctx.wait_for_signal runs again when its signal is sent or its timeout "
    "passes; the timeout is enforced by a running worker's keeper: run a worker (any queue). "
    "A mailbox that grows with nobody waiting holds signals sent for a key no job waits for "
    "(a typo in the key, a job cancelled or never enqueued): they are deleted when they "
    "expire (`signal(..., expires_in=...)`); fix the sender or the key the handler waits for."
)
FIX_BACKLOG = (
    "Run more workers for these queues, or claim more per poll (--batch, --concurrency): "
    "poll less, claim more."
)
FIX_FAILED = (
    "Jobs are rows: read the failed jobs' errors (`sqla-queue jobs list --status failed`, "
    "`sqla-queue jobs show ID`), fix the handler, then requeue them (`sqla-queue jobs retry "
    "--failed`) or remove those that failed a week ago or more (`sqla-queue prune --status "
    "failed --older-than 7d`)."
)
FIX_UNKNOWN = (
    "Workers took these jobs and had no handler for their task (a new release's task on an "
    "old worker, or a worker serving every queue): they put them back without using an "
    "attempt, later each time (up to every 5 minutes). Deploy a worker whose registry has "
    "the task (`--app`), or delete the jobs if the task is gone for good."
)
FIX_HELD_SEQUENCE = (
    "A failed job holds its sequence: the jobs after it in the sequence do not run until it "
    "is retried (`sqla-queue jobs retry ID`, once its handler is fixed) or deleted "
    "(`sqla-queue jobs delete ID`); or let the queue's sequences go on past a failed job "
    "(`sqla-queue queues set QUEUE --sequence-on-failure skip`)."
)
FIX_HISTORY = (
    "Run a worker (its keeper makes the history's partitions ahead and moves the rows of "
    "the DEFAULT partition into the partition of their period once it is made), or call "
    "`SELECT sqla_queue.keep_history(1, 3, 5000)` as the schema's owner."
)
FIX_PERMISSION = "Run doctor as a role that can read pg_stat_activity (pg_read_all_stats)."
FIX_DRIFT = (
    "Each difference is named with its fix above; an object a revision made that is missing "
    "comes back only by running its statement (the revision is recorded as applied)."
)
FIX_SCHEMA = "Run `sqla-queue migrate` (or `alembic upgrade heads`) to create the schema."
FIX_TRUNCATE = (
    "At a quiet moment (claims wait while it truncates), run as printed: "
    "`VACUUM (TRUNCATE true) sqla_queue.jobs`."
)

EXPECTED_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "1000",
    "vacuum_truncate": "false",
}
"""The storage parameters our migrations give the jobs table, as doctor expects them
(`vacuum_truncate`: sqlaq_0017, no VACUUM takes the lock that stops every claim)."""

TRUNCATABLE_WARN_BYTES = 256 * 1024 * 1024
"""Empty pages at the jobs table's end (in bytes) past which doctor suggests giving them
back; below, it only names them (the queue refills them as it runs)."""

MULTIXACT_CRITICAL_AGE = 1_000_000_000
"""Half of the 2^31 MultiXact ids after which PostgreSQL stops to prevent wraparound."""

Check = Callable[[Connection, DoctorOptions], Finding]


def format_bytes(count: float | None) -> str:
    value = float(count or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def seconds_of(value: Any) -> float | None:
    """A number of seconds from the database (Decimal from EXTRACT) as a JSON-able float."""
    return None if value is None else float(value)


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def by_duration(seconds: float, options: DoctorOptions) -> Severity:
    if seconds >= 10 * options.long_transaction:
        return Severity.critical
    if seconds >= options.long_transaction:
        return Severity.warn
    return Severity.ok


def worst(findings: Sequence[Finding]) -> Severity:
    """The most severe severity among `findings` (ok when there are none)."""
    order = [Severity.ok, Severity.warn, Severity.critical]
    return max((f.severity for f in findings), key=order.index, default=Severity.ok)
