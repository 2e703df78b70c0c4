"""Reads of PostgreSQL's catalogs: the schema revision, `doctor`'s checks, migrations."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Delete,
    Insert,
    Select,
    Text,
    and_,
    bindparam,
    case,
    column,
    delete,
    exists,
    func,
    null,
    or_,
    select,
    table,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_queue.db.models import SCHEMA, JobStatus
from sqla_queue.db.queries.common import (
    catalog_view,
    jobs,
    queues,
    seconds_param,
    seconds_since,
    status_is,
)
from sqla_queue.db.queries.jobs import deferred_error, stuck_condition

# -- schema ----------------------------------------------------------------------------------

_namespaces = catalog_view("pg_namespace", "oid", "nspname")


def schema_revision() -> Select[Any]:
    """The revision marker our migrations write as the comment on our schema."""
    return select(func.obj_description(_namespaces.c.oid, "pg_namespace")).where(
        _namespaces.c.nspname == SCHEMA
    )


def schema_marks() -> Select[Any]:
    """Our schema's revision marker (`marker`) and whether our version table
    `:version_table` (schema-qualified) exists and this role may read it (`readable`: a
    worker's role need not)."""
    name = bindparam("version_table", type_=Text)
    readable = case(
        (func.to_regclass(name).is_(None), False),
        else_=func.has_table_privilege(name, "SELECT"),
    )
    kinds = f"{SCHEMA}.schema_revisions"
    kinds_readable = case(
        (func.to_regclass(kinds).is_(None), False),
        else_=func.has_table_privilege(kinds, "SELECT"),
    )
    return select(
        func.obj_description(_namespaces.c.oid, "pg_namespace").label("marker"),
        readable.label("readable"),
        kinds_readable.label("kinds_readable"),
    ).where(_namespaces.c.nspname == SCHEMA)


_kinds = table("schema_revisions", column("revision"), column("kind"), schema=SCHEMA)


def revision_kinds() -> Select[Any]:
    """(revision, kind) of every revision `schema_revisions` records."""
    return select(_kinds.c.revision, _kinds.c.kind)


def relation_exists() -> Select[Any]:
    """Whether relation `:name` (schema-qualified) exists."""
    return select(func.to_regclass(bindparam("name", type_=Text)).is_not(None))


def record_revision() -> Insert:
    """Record revision `:revision` as applied, of kind `:kind`."""
    statement = pg_insert(_kinds).values(
        revision=bindparam("revision", type_=Text), kind=bindparam("kind", type_=Text)
    )
    return statement.on_conflict_do_update(
        index_elements=[_kinds.c.revision], set_={"kind": statement.excluded.kind}
    )


def forget_revision() -> Delete:
    """Forget revision `:revision` (it was downgraded)."""
    return delete(_kinds).where(_kinds.c.revision == bindparam("revision", type_=Text))


_activity_now = catalog_view("pg_stat_activity", "pid", "datname", "state", "xact_start", "query")


def oldest_transaction() -> Select[Any]:
    """(pid, state, seconds, query) of the oldest open transaction of this database other
    than this session's: what a migration's lock waits for, most likely."""
    return (
        select(
            _activity_now.c.pid,
            _activity_now.c.state,
            seconds_since(_activity_now.c.xact_start).label("seconds"),
            _activity_now.c.query,
        )
        .where(
            _activity_now.c.datname == func.current_database(),
            _activity_now.c.pid != func.pg_backend_pid(),
            _activity_now.c.xact_start.is_not(None),
        )
        .order_by(_activity_now.c.xact_start)
        .limit(1)
    )


def live_worker_versions(with_versions: bool) -> Select[Any]:
    """(id, hostname, pid, version, schema_revision) of every live registered worker;
    without the version columns (a schema before sqlaq_0022), those two are NULL."""
    w = table(
        "workers",
        column("id"),
        column("hostname"),
        column("pid"),
        column("expires_at"),
        column("version"),
        column("schema_revision"),
        schema=SCHEMA,
    )
    versions = (
        (w.c.version, w.c.schema_revision)
        if with_versions
        else (null().label("version"), null().label("schema_revision"))
    )
    return select(w.c.id, w.c.hostname, w.c.pid, *versions).where(w.c.expires_at >= func.now())


# -- doctor (sqla_queue.doctor): the essay's failure modes, read from the catalogs -----------
# Catalog views as lightweight tables of the columns we read; every statement is read-only.

_activity = catalog_view(
    "pg_stat_activity",
    "pid",
    "datname",
    "application_name",
    "state",
    "backend_xid",
    "backend_xmin",
    "xact_start",
    "wait_event",
    "query",
    "backend_type",
)
_locks = catalog_view("pg_locks", "pid", "relation", "locktype", "mode", "granted")
_databases = catalog_view("pg_database", "datname", "datminmxid")
_classes = catalog_view(
    "pg_class",
    "oid",
    "relname",
    "relnamespace",
    "relkind",
    "relminmxid",
    "relfrozenxid",
    "reloptions",
)
table_stats = catalog_view(
    "pg_stat_user_tables",
    "relid",
    "schemaname",
    "relname",
    "n_live_tup",
    "n_dead_tup",
    "last_autovacuum",
    "last_vacuum",
)
"""`pg_stat_user_tables`: each table's live and dead rows and its last vacuums (`vacuum`
reads it too)."""
_settings = catalog_view("pg_settings", "name", "setting")
_constraints = catalog_view("pg_constraint", "conname", "conrelid", "confrelid", "contype")
_prepared = catalog_view("pg_prepared_xacts", "gid", "transaction", "prepared", "database")
_slots = catalog_view("pg_replication_slots", "slot_name", "xmin", "catalog_xmin")

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
            seconds_since(_activity.c.xact_start),
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
            _prepared.c.gid, func.age(_prepared.c.transaction), seconds_since(_prepared.c.prepared)
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
    stats = table_stats
    return (
        select(
            stats.c.relname,
            stats.c.n_live_tup,
            stats.c.n_dead_tup,
            func.pg_relation_size(stats.c.relid),
            func.pg_indexes_size(stats.c.relid),
            func.pg_total_relation_size(stats.c.relid),
            seconds_since(stats.c.last_autovacuum),
            seconds_since(stats.c.last_vacuum),
            _classes.c.reloptions,
        )
        .select_from(stats.join(_classes, _classes.c.oid == stats.c.relid))
        .where(stats.c.schemaname == SCHEMA)
        .order_by(stats.c.relname)
    )


def stuck_jobs() -> Select[Any]:
    """(count, longest overdue in seconds) of running jobs the reaper would requeue now.

    The same condition as the reaper (`stuck_condition`): past the job's own lease
    deadline, or held by a worker whose registration expired.
    """
    overdue = func.coalesce(jobs.c.lease_expires_at, jobs.c.heartbeat_at, jobs.c.created_at)
    return select(func.count(), seconds_since(func.min(overdue))).where(stuck_condition())


def overdue_jobs() -> Select[Any]:
    """Per queue: (queue, paused, count, oldest lateness in seconds) of queued jobs due more
    than `:threshold` seconds ago. `paused` is NULL for a queue without a queues row."""
    return (
        select(
            jobs.c.queue,
            queues.c.paused,
            func.count(),
            seconds_since(func.min(jobs.c.run_at)),
        )
        .select_from(jobs.outerjoin(queues, queues.c.name == jobs.c.queue))
        .where(
            status_is(JobStatus.queued),
            jobs.c.run_at < func.now() - seconds_param("threshold"),
        )
        .group_by(jobs.c.queue, queues.c.paused)
        .order_by(jobs.c.queue)
    )


def failed_job_counts() -> Select[Any]:
    """Per queue: (queue, failed jobs, seconds since the latest failure)."""
    return (
        select(jobs.c.queue, func.count(), seconds_since(func.max(jobs.c.finished_at)))
        .where(status_is(JobStatus.failed))
        .group_by(jobs.c.queue)
        .order_by(jobs.c.queue)
    )


def unknown_task_counts() -> Select[Any]:
    """Per task: (task, queued jobs deferred by workers that had no handler for it, seconds
    since the oldest of them was enqueued), most first."""
    return (
        select(jobs.c.task, func.count(), seconds_since(func.min(jobs.c.created_at)))
        .where(status_is(JobStatus.queued), deferred_error())
        .group_by(jobs.c.task)
        .order_by(func.count().desc(), jobs.c.task)
    )


# -- migrations: which optional revisions a database has applied ----------------------------


def version_table_exists(version_table: str) -> Select[Any]:
    """Whether Alembic's version table `version_table` exists on the search path."""
    return select(func.to_regclass(version_table).is_not(None))


def applied_revisions(version_table: str, schema: str | None = None) -> Select[Any]:
    """The revision ids recorded in Alembic's version table `version_table` (in `schema`,
    else on the search path)."""
    versions = table(version_table, column("version_num"), schema=schema)
    return select(versions.c.version_num)


# -- the schema as the catalogue holds it (doctor's drift check) ------------------------------

_index = catalog_view("pg_index", "indexrelid", "indrelid", "indisvalid")
_trigger = catalog_view("pg_trigger", "tgname", "tgrelid", "tgisinternal")
_proc = catalog_view("pg_proc", "proname", "pronamespace")
_columns = table(
    "columns", column("table_schema"), column("table_name"), column("column_name"),
    schema="information_schema",
)  # fmt: skip


def _relations(alias: str) -> Any:
    return catalog_view("pg_class", "oid", "relname", "relnamespace").alias(alias)


def schema_indexes() -> Select[Any]:
    """(name, table, valid) of every index in our schema."""
    index, owner = _relations("index_class"), _relations("table_class")
    return (
        select(
            index.c.relname.label("name"),
            owner.c.relname.label("table"),
            _index.c.indisvalid.label("valid"),
        )
        .select_from(
            _index.join(index, index.c.oid == _index.c.indexrelid)
            .join(owner, owner.c.oid == _index.c.indrelid)
            .join(_namespaces, _namespaces.c.oid == index.c.relnamespace)
        )
        .where(_namespaces.c.nspname == SCHEMA)
    )


def schema_triggers() -> Select[Any]:
    """(name, table) of every trigger of our tables (not the constraints' own)."""
    owner = _relations("trigger_table")
    return (
        select(_trigger.c.tgname.label("name"), owner.c.relname.label("table"))
        .select_from(
            _trigger.join(owner, owner.c.oid == _trigger.c.tgrelid).join(
                _namespaces, _namespaces.c.oid == owner.c.relnamespace
            )
        )
        .where(_namespaces.c.nspname == SCHEMA, _trigger.c.tgisinternal.is_(False))
    )


def schema_functions() -> Select[Any]:
    """The names of the functions in our schema."""
    return (
        select(_proc.c.proname)
        .select_from(_proc.join(_namespaces, _namespaces.c.oid == _proc.c.pronamespace))
        .where(_namespaces.c.nspname == SCHEMA)
    )


def schema_columns() -> Select[Any]:
    """(table, column) of every column of our tables."""
    return select(
        _columns.c.table_name.label("table"), _columns.c.column_name.label("column")
    ).where(_columns.c.table_schema == SCHEMA)


def role_privileges(wanted: list[tuple[str, str]]) -> Select[Any]:
    """Whether role `:role` exists (`role_exists`), has USAGE on our schema (`usage`), and
    each (table, privilege) of `wanted` (`p0`, `p1`, ...; NULL when the table is missing)."""
    role = bindparam("role", type_=Text)
    exists_ = func.to_regrole(role).is_not(None)
    checks = [
        case(
            (func.to_regclass(f"{SCHEMA}.{name}").is_(None), None),
            else_=func.has_table_privilege(role, f"{SCHEMA}.{name}", privilege),
        )
        for name, privilege in wanted
    ]
    return select(
        exists_.label("role_exists"),
        case((exists_, func.has_schema_privilege(role, SCHEMA, "USAGE")), else_=False).label(
            "usage"
        ),
        *(case((exists_, check), else_=None).label(f"p{i}") for i, check in enumerate(checks)),
    )
