"""Every statement the worker, the CLI and the enqueue hook send, as SQLAlchemy Core.

One file, so a reader who wants to know what hits the database reads only this.
Statements are built once and executed with bound parameters; none interpolates
a value into SQL text. Batch statements take parallel arrays and `unnest` them,
so a batch of any size is one statement and one round trip.

The fencing condition: every statement that ends a claim matches the job's id,
the attempt number the claim returned, and `status = 'running'`. A worker whose
job was reaped (and perhaps claimed again) changes nothing when it wakes up late.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    BigInteger,
    DateTime,
    Delete,
    Float,
    Insert,
    Integer,
    Interval,
    Select,
    SmallInteger,
    Table,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    column,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    table,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import TableValuedAlias

from .models import NOTIFY_CHANNEL, SCHEMA, ArchivedJob, Job, JobStatus, Queue

jobs = cast(Table, Job.__table__)
queues = cast(Table, Queue.__table__)
archive = cast(Table, ArchivedJob.__table__)

CLAIMED_COLUMNS = (
    jobs.c.id,
    jobs.c.task,
    jobs.c.args,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.queue,
)
"""The columns a claim returns, in this order: (id, task, args, attempts, max_attempts, queue)."""

FINISHED_STATUSES = (JobStatus.done.value, JobStatus.failed.value, JobStatus.cancelled.value)


def _is(status: JobStatus) -> ColumnElement[bool]:
    """`status = 'queued'` with the status as a literal, never a bound parameter.

    The partial indexes are defined `WHERE status = '...'`: a generic plan of a prepared
    statement with `status = $1` could not prove the predicate and would scan the table.
    The value comes from our enum, never from input.
    """
    return jobs.c.status == literal_column(f"'{status.value}'", Text)


def _seconds(name: str) -> Any:
    """`make_interval(secs => :name)`, for a bound number of seconds."""
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(name, type_=Float))


def _claimed_batch(*extra: tuple[str, str, Any]) -> TableValuedAlias:
    """`unnest(:job_ids, :job_attempts, ...) AS f(id, attempt, ...)`: one row per claimed job.

    `extra` adds (parameter, column, element type) triples of further parallel arrays.
    """
    arrays = [
        bindparam("job_ids", type_=ARRAY(BigInteger)),
        bindparam("job_attempts", type_=ARRAY(Integer)),
        *(bindparam(param, type_=ARRAY(type_)) for param, _, type_ in extra),
    ]
    names = ["id", "attempt", *(name for _, name, _ in extra)]
    return func.unnest(*arrays).table_valued(*names).render_derived(name="f")


def _fenced(batch: TableValuedAlias) -> tuple[Any, ...]:
    return (
        jobs.c.id == batch.c.id,
        jobs.c.attempts == batch.c.attempt,
        _is(JobStatus.running),
    )


# -- enqueue ---------------------------------------------------------------------------------


def insert_jobs() -> Insert:
    """Insert jobs, for executemany; returns ids in parameter order.

    Parameters per row: `job_task`, `job_args`, `job_queue`, `job_priority`, `job_run_at`
    (or NULL), `job_delay` (an interval, or NULL), `job_max_attempts`. A NULL `job_run_at`
    means now plus the delay, by the database clock.
    """
    run_at = func.coalesce(
        bindparam("job_run_at", type_=DateTime(timezone=True)),
        func.now() + func.coalesce(bindparam("job_delay", type_=Interval), text("'0'::interval")),
    )
    return (
        insert(jobs)
        .values(
            task=bindparam("job_task", type_=Text),
            args=bindparam("job_args", type_=JSONB),
            queue=bindparam("job_queue", type_=Text),
            priority=bindparam("job_priority", type_=SmallInteger),
            run_at=run_at,
            max_attempts=bindparam("job_max_attempts", type_=Integer),
        )
        .returning(jobs.c.id, sort_by_parameter_order=True)
    )


# -- claim -----------------------------------------------------------------------------------


def claim_jobs(queue_names: Sequence[str] | None) -> Update:
    """Claim up to `:limit` due jobs, lowest priority first, and mark them running.

    Parameters: `limit`, `worker_id`, and `queues` (a list) when `queue_names` is given;
    `None` claims from every queue. Paused queues are skipped, and so are routed ones (their
    jobs are the relay's, see sqla_queue.brokers). The candidates CTE is MATERIALIZED so the
    planner cannot re-run the locking subquery and lock more than `limit` rows.
    """
    paused = exists().where(
        queues.c.name == jobs.c.queue, or_(queues.c.paused, queues.c.route.is_not(None))
    )
    conditions = [
        _is(JobStatus.queued),
        jobs.c.run_at <= func.now(),
        ~paused,
    ]
    if queue_names is not None:
        conditions.append(jobs.c.queue == any_(bindparam("queues", type_=ARRAY(Text))))
    candidates = (
        select(jobs.c.id)
        .where(*conditions)
        .order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs)
        .where(jobs.c.id == candidates.c.id)
        .values(
            status=JobStatus.running.value,
            attempts=jobs.c.attempts + 1,
            locked_at=func.now(),
            heartbeat_at=func.now(),
            locked_by=bindparam("worker_id", type_=Text),
        )
        .returning(*CLAIMED_COLUMNS)
    )


# -- finish ----------------------------------------------------------------------------------


def complete_keep() -> Update:
    """Mark claimed jobs done (retention `keep`). Parameters: `job_ids`, `job_attempts`."""
    batch = _claimed_batch()
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(status=JobStatus.done.value, finished_at=func.now())
    )


def complete_delete() -> Delete:
    """Delete a batch of claimed jobs that succeeded (retention `delete`)."""
    batch = _claimed_batch()
    return delete(jobs).where(*_fenced(batch))


def complete_delete_and_claim(queue_names: Sequence[str] | None) -> Update:
    """`complete_delete` then `claim_jobs` in one statement: one commit per cycle, not two.

    Parameters: those of both (`job_ids`, `job_attempts`, `limit`, `worker_id`, `queues`).
    The deleted rows were `running`, so they are never among the candidates.
    """
    batch = _claimed_batch()
    finished = delete(jobs).where(*_fenced(batch)).returning(jobs.c.id).cte("finished")
    return claim_jobs(queue_names).add_cte(finished)


def complete_archive() -> Insert:
    """Move a batch of succeeded jobs to the archive table in one statement."""
    batch = _claimed_batch()
    moved = delete(jobs).where(*_fenced(batch)).returning(*jobs.c).cte("moved")
    names = [c.name for c in archive.c]
    values = [
        literal(JobStatus.done.value).label("status")
        if name == "status"
        else func.now().label("finished_at")
        if name == "finished_at"
        else moved.c[name]
        for name in names
    ]
    return insert(archive).from_select(names, select(*values)).add_cte(moved)


def retry_jobs() -> Update:
    """Put failed attempts back to `queued`, due after their own delay.

    Parameters: `job_ids`, `job_attempts`, `job_delays` (seconds), `job_errors` (tracebacks).
    """
    batch = _claimed_batch(("job_delays", "delay", Float), ("job_errors", "error", Text))
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(
            status=JobStatus.queued.value,
            run_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, batch.c.delay),
            last_error=batch.c.error,
            locked_by=None,
            locked_at=None,
            heartbeat_at=None,
        )
    )


def fail_jobs() -> Update:
    """Mark jobs `failed` for good. Parameters: `job_ids`, `job_attempts`, `job_errors`."""
    batch = _claimed_batch(("job_errors", "error", Text))
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(
            status=JobStatus.failed.value,
            finished_at=func.now(),
            last_error=batch.c.error,
            heartbeat_at=None,
        )
    )


def release_jobs() -> Update:
    """Return claimed jobs to `queued` now (shutdown).

    Parameters: `job_ids`, `job_attempts`, `job_refunds`.

    A job that never started gets its attempt back (`refund` 1); one interrupted mid-run
    keeps it (`refund` 0), so a job that always kills its worker still reaches max_attempts.
    """
    batch = _claimed_batch(("job_refunds", "refund", Integer))
    return (
        update(jobs)
        .where(*_fenced(batch))
        .values(
            status=JobStatus.queued.value,
            attempts=jobs.c.attempts - batch.c.refund,
            run_at=func.now(),
            locked_by=None,
            locked_at=None,
            heartbeat_at=None,
        )
    )


# -- liveness --------------------------------------------------------------------------------


def heartbeat_jobs() -> Update:
    """Refresh the heartbeat of the jobs a worker holds; returns the ids it still owns.

    A held job missing from the result was reaped or cancelled: its handler is told.
    """
    batch = _claimed_batch()
    return update(jobs).where(*_fenced(batch)).values(heartbeat_at=func.now()).returning(jobs.c.id)


def reap_stale_jobs() -> Update:
    """Requeue `running` jobs whose heartbeat is older than `:lease` seconds.

    Safe when several workers reap at once: SKIP LOCKED splits the rows between them and
    the status condition is re-checked on the locked row. Returns (id, queue).
    """
    stale = (
        select(jobs.c.id)
        .where(
            _is(JobStatus.running),
            jobs.c.heartbeat_at < func.now() - _seconds("lease"),
        )
        .with_for_update(skip_locked=True)
        .cte("stale")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs)
        .where(jobs.c.id == stale.c.id, _is(JobStatus.running))
        .values(
            status=JobStatus.queued.value,
            run_at=func.now(),
            last_error=func.concat(
                "lease expired: worker ",
                func.coalesce(jobs.c.locked_by, "?"),
                " stopped heartbeating",
            ),
            locked_by=None,
            locked_at=None,
            heartbeat_at=None,
        )
        .returning(jobs.c.id, jobs.c.queue)
    )


# -- notify ----------------------------------------------------------------------------------


def notify_queues() -> Select[Any]:
    """`pg_notify` once per queue in `:queues`; delivered by PostgreSQL only on commit."""
    names = func.unnest(bindparam("queues", type_=ARRAY(Text))).table_valued("name")
    return select(func.pg_notify(NOTIFY_CHANNEL, names.c.name)).select_from(names)


# -- schema ----------------------------------------------------------------------------------

_namespaces = table("pg_namespace", column("oid"), column("nspname"), schema="pg_catalog")


def schema_revision() -> Select[Any]:
    """The revision marker our migrations write as the comment on our schema."""
    return select(func.obj_description(_namespaces.c.oid, "pg_namespace")).where(
        _namespaces.c.nspname == SCHEMA
    )


# -- administration --------------------------------------------------------------------------


def queue_settings() -> Select[Any]:
    """(name, paused, retention) of every queue."""
    return select(queues.c.name, queues.c.paused, queues.c.retention).order_by(queues.c.name)


def create_queue() -> Insert:
    """Create a queue; parameters `name`, `retention`. Existing queues are left as they are."""
    return (
        pg_insert(queues)
        .values(name=bindparam("name"), retention=bindparam("retention"))
        .on_conflict_do_nothing(index_elements=[queues.c.name])
        .returning(queues.c.name)
    )


def set_queue_paused(paused: bool) -> Update:
    """Pause or resume the queue `:name`; returns its name if it exists."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(paused=paused)
        .returning(queues.c.name)
    )


def set_queue_retention() -> Update:
    """Set the retention of the queue `:queue_name` to `:new_retention`."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(retention=bindparam("new_retention"))
        .returning(queues.c.name)
    )


def set_queue_route() -> Update:
    """Set (or clear, with NULL) the route of the queue `:queue_name` to `:new_route`."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(route=bindparam("new_route"))
        .returning(queues.c.name)
    )


def count_unfinished_in_queue() -> Select[Any]:
    """How many jobs of `:queue_name` are queued or running."""
    return select(func.count()).where(
        jobs.c.queue == bindparam("queue_name"),
        or_(_is(JobStatus.queued), _is(JobStatus.running)),
    )


def lock_queue() -> Select[Any]:
    """Lock the queue `:queue_name`'s row; under the foreign key this holds off enqueuers."""
    return select(queues.c.name).where(queues.c.name == bindparam("queue_name")).with_for_update()


def delete_jobs_of_queue(finished_only: bool) -> Delete:
    """Delete the jobs of the queue `:queue_name`: only finished ones, or all (`--force`)."""
    statement = delete(jobs).where(jobs.c.queue == bindparam("queue_name"))
    if finished_only:
        statement = statement.where(or_(*(_is(JobStatus(s)) for s in FINISHED_STATUSES)))
    return statement


def delete_queue() -> ReturningDelete[Any]:
    """Delete the queue `:queue_name`; returns its name if it existed."""
    return delete(queues).where(queues.c.name == bindparam("queue_name")).returning(queues.c.name)


def queue_stats() -> Select[Any]:
    """Per queue and status: count and the oldest due queued job's age in seconds.

    Queues with no jobs appear once with a NULL status and a count of 0.
    """
    oldest_due = func.min(jobs.c.run_at).filter(
        and_(_is(JobStatus.queued), jobs.c.run_at <= func.now())
    )
    due_age = func.extract("epoch", func.now() - oldest_due)
    names = select(queues.c.name).union(select(jobs.c.queue.label("name")).distinct()).subquery()
    return (
        select(
            names.c.name,
            queues.c.paused,
            jobs.c.status,
            func.count(jobs.c.id),
            due_age,
        )
        .select_from(names)
        .outerjoin(queues, queues.c.name == names.c.name)
        .outerjoin(jobs, jobs.c.queue == names.c.name)
        .group_by(names.c.name, queues.c.paused, jobs.c.status)
        .order_by(names.c.name, jobs.c.status)
    )


def prune_jobs() -> Delete:
    """Delete finished jobs (`:statuses`) that finished more than `:older_than` seconds ago."""
    return delete(jobs).where(
        jobs.c.status == any_(bindparam("statuses", type_=ARRAY(Text))),
        jobs.c.finished_at < func.now() - _seconds("older_than"),
    )


def prune_archive() -> Delete:
    """Delete archived jobs older than `:older_than` seconds."""
    return delete(archive).where(archive.c.finished_at < func.now() - _seconds("older_than"))


def cancel_jobs() -> Update:
    """Cancel jobs `:job_ids` that are queued or running; returns (id, previous status).

    A running job's handler sees the cancellation at its worker's next heartbeat, and its
    late finish is fenced off by the status condition.
    """
    before = (
        select(jobs.c.id, jobs.c.status)
        .where(
            jobs.c.id == any_(bindparam("job_ids", type_=ARRAY(BigInteger))),
            or_(
                _is(JobStatus.queued),
                _is(JobStatus.running),
            ),
        )
        .with_for_update()
        .cte("before")
    )
    return (
        update(jobs)
        .where(jobs.c.id == before.c.id)
        .values(
            status=JobStatus.cancelled.value,
            finished_at=func.now(),
            heartbeat_at=None,
        )
        .returning(jobs.c.id, before.c.status)
    )


def job_by_id() -> Select[Any]:
    """One job's row by `:job_id`."""
    return select(jobs).where(jobs.c.id == bindparam("job_id", type_=BigInteger))


def may_reserve_job_ids() -> Select[Any]:
    """Whether this role may draw ids from the jobs id sequence (COPY needs it; INSERT not)."""
    sequence = func.pg_get_serial_sequence(jobs.fullname, jobs.c.id.name)
    return select(func.has_sequence_privilege(sequence, "USAGE"))


def reserve_job_ids() -> Select[Any]:
    """`:count` fresh job ids, in order, each with the transaction's `now()` (for COPY)."""
    sequence = func.pg_get_serial_sequence(jobs.fullname, jobs.c.id.name)
    series = func.generate_series(1, bindparam("count", type_=Integer))
    return select(func.nextval(sequence), func.now()).select_from(series)


COPY_JOB_COLUMNS = ("id", "task", "args", "queue", "priority", "run_at", "max_attempts")
COPY_JOBS = f"COPY {jobs.fullname} ({', '.join(COPY_JOB_COLUMNS)}) FROM STDIN"
"""Not expressible in Core: bulk enqueue's COPY, rows in COPY_JOB_COLUMNS order."""

LISTEN = f'LISTEN "{NOTIFY_CHANNEL}"'
"""Not expressible in Core: the one plain-text statement, sent by the listener connection."""


# -- doctor (sqla_queue.doctor): the essay's failure modes, read from the catalogs -----------
# Catalog views as lightweight tables of the columns we read; every statement is read-only.

_activity = table(
    "pg_stat_activity",
    column("pid"),
    column("datname"),
    column("application_name"),
    column("state"),
    column("backend_xid"),
    column("backend_xmin"),
    column("xact_start"),
    column("wait_event"),
    column("query"),
    column("backend_type"),
    schema="pg_catalog",
)
_locks = table(
    "pg_locks",
    column("pid"),
    column("relation"),
    column("locktype"),
    column("mode"),
    column("granted"),
    schema="pg_catalog",
)
_databases = table("pg_database", column("datname"), column("datminmxid"), schema="pg_catalog")
_classes = table(
    "pg_class",
    column("oid"),
    column("relname"),
    column("relnamespace"),
    column("relkind"),
    column("relminmxid"),
    column("relfrozenxid"),
    column("reloptions"),
    schema="pg_catalog",
)
_table_stats = table(
    "pg_stat_user_tables",
    column("relid"),
    column("schemaname"),
    column("relname"),
    column("n_live_tup"),
    column("n_dead_tup"),
    column("last_autovacuum"),
    column("last_vacuum"),
    schema="pg_catalog",
)
_settings = table("pg_settings", column("name"), column("setting"), schema="pg_catalog")
_constraints = table(
    "pg_constraint",
    column("conname"),
    column("conrelid"),
    column("confrelid"),
    column("contype"),
    schema="pg_catalog",
)
_prepared = table(
    "pg_prepared_xacts",
    column("gid"),
    column("transaction"),
    column("prepared"),
    column("database"),
    schema="pg_catalog",
)
_slots = table(
    "pg_replication_slots",
    column("slot_name"),
    column("xmin"),
    column("catalog_xmin"),
    schema="pg_catalog",
)

DOCTOR_SETTINGS = (
    "server_version",
    "server_version_num",
    "autovacuum",
    "autovacuum_multixact_freeze_max_age",
    "multixact_offset_buffers",
    "multixact_member_buffers",
)
"""Server settings doctor reports; the `multixact_*_buffers` ones exist from PostgreSQL 17."""

_ENQUEUE_PATTERN = rf'insert\s+into\s+"?{SCHEMA}"?\s*\.\s*"?jobs"?[\s(]'


def _epoch_since(moment: Any) -> Any:
    return func.extract("epoch", func.now() - moment)


def _ours_in_this_database() -> tuple[Any, ...]:
    """Backends of the current database other than the one asking."""
    return (
        _activity.c.datname == func.current_database(),
        _activity.c.pid != func.pg_backend_pid(),
    )


def server_settings() -> Select[Any]:
    """(name, setting) of `DOCTOR_SETTINGS` that this server has."""
    return select(_settings.c.name, _settings.c.setting).where(
        _settings.c.name.in_(DOCTOR_SETTINGS)
    )


def multixact_waits() -> Select[Any]:
    """(wait_event, backends) now waiting on a MultiXact lock or SLRU, in the whole cluster.

    Matches PostgreSQL 13-16's `MultiXactOffsetSLRU`/`MultiXactMemberSLRU` and 17's bank
    and buffer variants alike.
    """
    return (
        select(_activity.c.wait_event, func.count())
        .where(_activity.c.wait_event.ilike("multixact%"))
        .group_by(_activity.c.wait_event)
        .order_by(_activity.c.wait_event)
    )


def next_multixact_id() -> Select[Any]:
    """The cluster's next MultiXactId, live (no CHECKPOINT needed).

    `mxid_age(x)` is the live counter minus `x`, so any fixed `x` recovers the counter.
    """
    base = _databases.c.datminmxid.cast(Text).cast(BigInteger)
    return select((base + func.mxid_age(_databases.c.datminmxid)) % 4294967296).where(
        _databases.c.datname == func.current_database()
    )


def table_multixact_ages() -> Select[Any]:
    """(table, mxid_age(relminmxid), age(relfrozenxid)) of every table in our schema."""
    return (
        select(
            _classes.c.relname,
            func.mxid_age(_classes.c.relminmxid),
            func.age(_classes.c.relfrozenxid),
        )
        .select_from(_classes.join(_namespaces, _namespaces.c.oid == _classes.c.relnamespace))
        .where(_namespaces.c.nspname == SCHEMA, _classes.c.relkind == "r")
        .order_by(_classes.c.relname)
    )


def open_transactions() -> Select[Any]:
    """Other backends of this database that hold an xid or a snapshot, oldest first.

    Columns: pid, application_name, state, xid age (NULL without an xid), xmin age,
    seconds since the transaction began, and the start of the last statement.
    """
    return (
        select(
            _activity.c.pid,
            _activity.c.application_name,
            _activity.c.state,
            func.age(_activity.c.backend_xid),
            func.age(_activity.c.backend_xmin),
            _epoch_since(_activity.c.xact_start),
            func.left(_activity.c.query, 120),
        )
        .where(
            *_ours_in_this_database(),
            # VACUUM's own snapshot does not hold back other vacuums (PROC_IN_VACUUM).
            _activity.c.backend_type != "autovacuum worker",
            or_(_activity.c.backend_xid.is_not(None), _activity.c.backend_xmin.is_not(None)),
        )
        .order_by(_activity.c.xact_start)
        .limit(20)
    )


def prepared_transactions() -> Select[Any]:
    """(gid, xid age, seconds since PREPARE) of prepared transactions in this database."""
    return (
        select(
            _prepared.c.gid, func.age(_prepared.c.transaction), _epoch_since(_prepared.c.prepared)
        )
        .where(_prepared.c.database == func.current_database())
        .order_by(_prepared.c.prepared)
    )


def replication_slot_horizons() -> Select[Any]:
    """(slot, age(xmin), age(catalog_xmin)) of replication slots that hold back vacuum."""
    return select(
        _slots.c.slot_name, func.age(_slots.c.xmin), func.age(_slots.c.catalog_xmin)
    ).where(or_(_slots.c.xmin.is_not(None), _slots.c.catalog_xmin.is_not(None)))


def subtransaction_writers() -> Select[Any]:
    """(pid, application_name, xids) of backends of this database writing in savepoints.

    Each subtransaction that writes gets its own xid and holds a lock on it, so a backend
    holding more than one transactionid lock has written inside a savepoint.
    """
    xids = func.count()
    return (
        select(_activity.c.pid, _activity.c.application_name, xids)
        .select_from(_locks.join(_activity, _activity.c.pid == _locks.c.pid))
        .where(
            *_ours_in_this_database(),
            _locks.c.locktype == "transactionid",
            _locks.c.mode == "ExclusiveLock",
            _locks.c.granted,
        )
        .group_by(_activity.c.pid, _activity.c.application_name)
        .having(xids > 1)
    )


def queue_foreign_keys() -> Select[Any]:
    """Names of foreign keys from our jobs table to our queues table (normally one)."""
    return select(_constraints.c.conname).where(
        _constraints.c.contype == "f",
        _constraints.c.conrelid == func.to_regclass(f"{SCHEMA}.jobs"),
        _constraints.c.confrelid == func.to_regclass(f"{SCHEMA}.queues"),
    )


def recent_enqueuers() -> Select[Any]:
    """How many other sessions of this database are enqueuing now or did last.

    A session counts if its last (or current) statement inserts into jobs, or if it sits
    idle in a transaction that has written to jobs (workers never do: they autocommit).
    Closed sessions and sessions that have moved on are not seen.
    """
    wrote_jobs = exists().where(
        _locks.c.pid == _activity.c.pid,
        _locks.c.relation == func.to_regclass(f"{SCHEMA}.jobs"),
        _locks.c.mode == "RowExclusiveLock",
    )
    return select(func.count()).where(
        *_ours_in_this_database(),
        or_(
            _activity.c.query.op("~*")(_ENQUEUE_PATTERN),
            and_(_activity.c.state.startswith("idle in transaction"), wrote_jobs),
        ),
    )


def orphan_queues() -> Select[Any]:
    """(queue, jobs) for queue names that jobs use but the queues table lacks."""
    known = exists().where(queues.c.name == jobs.c.queue)
    return (
        select(jobs.c.queue, func.count())
        .where(~known)
        .group_by(jobs.c.queue)
        .order_by(jobs.c.queue)
    )


def table_health() -> Select[Any]:
    """Per table of our schema: live and dead tuples, heap, index and total bytes, last
    autovacuum and vacuum (seconds ago), and its storage parameters (reloptions)."""
    stats = _table_stats
    return (
        select(
            stats.c.relname,
            stats.c.n_live_tup,
            stats.c.n_dead_tup,
            func.pg_relation_size(stats.c.relid),
            func.pg_indexes_size(stats.c.relid),
            func.pg_total_relation_size(stats.c.relid),
            _epoch_since(stats.c.last_autovacuum),
            _epoch_since(stats.c.last_vacuum),
            _classes.c.reloptions,
        )
        .select_from(stats.join(_classes, _classes.c.oid == stats.c.relid))
        .where(stats.c.schemaname == SCHEMA)
        .order_by(stats.c.relname)
    )


def stuck_jobs() -> Select[Any]:
    """(count, oldest silence in seconds) of running jobs silent for more than `:lease` s."""
    last_sign = func.coalesce(jobs.c.heartbeat_at, jobs.c.locked_at, jobs.c.created_at)
    return select(func.count(), _epoch_since(func.min(last_sign))).where(
        _is(JobStatus.running),
        last_sign < func.now() - _seconds("lease"),
    )


def overdue_jobs() -> Select[Any]:
    """Per queue: (queue, paused, count, oldest lateness in seconds) of queued jobs due more
    than `:threshold` seconds ago. `paused` is NULL for a queue without a queues row."""
    return (
        select(
            jobs.c.queue,
            queues.c.paused,
            func.count(),
            _epoch_since(func.min(jobs.c.run_at)),
        )
        .select_from(jobs.outerjoin(queues, queues.c.name == jobs.c.queue))
        .where(
            _is(JobStatus.queued),
            jobs.c.run_at < func.now() - _seconds("threshold"),
        )
        .group_by(jobs.c.queue, queues.c.paused)
        .order_by(jobs.c.queue)
    )


def failed_job_counts() -> Select[Any]:
    """Per queue: (queue, failed jobs, seconds since the latest failure)."""
    return (
        select(jobs.c.queue, func.count(), _epoch_since(func.max(jobs.c.finished_at)))
        .where(_is(JobStatus.failed))
        .group_by(jobs.c.queue)
        .order_by(jobs.c.queue)
    )


# -- migrations: which optional revisions a database has applied ----------------------------


def version_table_exists(version_table: str) -> Select[Any]:
    """Whether Alembic's version table `version_table` exists on the search path."""
    return select(func.to_regclass(version_table).is_not(None))


def applied_revisions(version_table: str) -> Select[Any]:
    """The revision ids recorded in Alembic's version table `version_table`."""
    versions = table(version_table, column("version_num"))
    return select(versions.c.version_num)
