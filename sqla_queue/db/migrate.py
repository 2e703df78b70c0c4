"""Applying our Alembic revisions: `upgrade`, `downgrade`, the Alembic env, the schema check.

Our revisions are recorded in our own version table inside our own schema
(`sqla_queue.alembic_version_sqla_queue`), so an application's autogenerate, which looks at
its default schema unless told otherwise, never sees it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, column, inspect, pool, select, table, text
from sqlalchemy.exc import DBAPIError

from sqla_queue.db import queries
from sqla_queue.db.database import URL_ENV_VAR, create_queue_engine, normalize_url
from sqla_queue.db.models import HISTORY_TABLE, SCHEMA, QueueBase
from sqla_queue.errors import (
    MigrationBlockedError,
    OlderWorkersError,
    SchemaElsewhereError,
    SchemaMissingError,
    SchemaUnknownError,
)

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported by the functions that use it: an enqueue-only process never does.

BRANCH = "sqla_queue"
VERSION_TABLE = "alembic_version_sqla_queue"
"""Where `sqla-queue migrate`, this repository's `alembic.ini` and `alembic_ext.upgrade_schema`
record our revisions: in schema `VERSION_TABLE_SCHEMA`."""
VERSION_TABLE_SCHEMA = SCHEMA
"""Our version table lives in our schema, out of sight of an application's autogenerate."""
_VERSION_OPTIONS = {"version_table": VERSION_TABLE, "version_table_schema": VERSION_TABLE_SCHEMA}

# Drops our schema only once nothing is left in it (our version table goes last).
DROP_SCHEMA_IF_EMPTY = (
    f"DO $$ BEGIN DROP SCHEMA {SCHEMA}; "
    "EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END $$"
)
SCHEMA_REVISION = "sqlaq_0031_queue_check"
"""The revision of our schema this version of the code needs (or a later one it ships: a
revision it does not know is refused, `check_schema`)."""
OPTIONAL_BRANCH = "sqla_queue_no_queue_fk"
"""The opt-in branch that drops the jobs -> queues foreign key (`migrate --drop-queue-fk`)."""
OPTIONAL_REVISIONS = frozenset({"sqlaq_nofk_0001"})
"""Revision ids that live in the optional folder, not in `versions_folder()`."""


@functools.cache
def package_version() -> str:
    """The installed sqla-queue's version, as a worker registers it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sqla-queue")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def versions_folder() -> str:
    """The folder of our shipped revisions, for a user's `version_locations`."""
    return str(resources.files("sqla_queue") / "migrations" / "versions")


def optional_versions_folder() -> str:
    """The folder of our opt-in revisions (the queue foreign key's removal).

    Add it to your `version_locations` only if you apply them: `alembic upgrade heads`
    over it applies them too. A database that has them applied needs it listed.
    """
    return str(resources.files("sqla_queue") / "migrations" / "optional")


def alembic_config(
    connection: Connection | None = None, url: str | None = None, optional: bool = False
) -> Config:
    """An Alembic `Config` for our revisions, bound to a connection or a URL.

    `optional` adds the folder of opt-in revisions to the version locations.
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "sqla_queue:migrations")
    locations = [versions_folder(), *([optional_versions_folder()] if optional else [])]
    config.set_main_option("version_locations", os.pathsep.join(locations))
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


DEFAULT_LOCK_TIMEOUT = 0.5
"""Seconds a statement of a revision waits for a lock before the revision is retried
(`sqla-queue migrate --lock-timeout`): an enqueue queued behind the migration's lock request
waits no longer than this."""
DEFAULT_LOCK_RETRIES = 30
"""How many times a revision that did not get its lock is tried again, after a pause that
doubles from `lock_timeout` up to 10 s, before `upgrade` gives up (about 4 minutes)."""
LOCK_NOT_AVAILABLE = "55P03"

_log = logging.getLogger("sqla_queue.migrate")


def upgrade(
    bind: Engine | Connection,
    revision: str = f"{BRANCH}@head",
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    lock_retries: int = DEFAULT_LOCK_RETRIES,
    report: Callable[[str], None] | None = None,
    force: bool = False,
    within_alembic: bool = False,
) -> None:
    """Apply our revisions up to `revision` on `bind` (an engine or a connection).

    `within_alembic`: called from a revision another Alembic command is running (an
    application's `upgrade_schema`): our steps run on a `MigrationContext` of their own,
    not through a second Alembic command (whose environment would undo the first's).

    Online when `bind` is an engine or a connection outside a transaction: each revision in
    a transaction of its own, its index builds concurrently outside it
    (`sqla_queue.db.online`), every lock waited for at most `lock_timeout` seconds; a
    revision that did not get a lock is rolled back and tried again after a pause, each
    wait said through `report` (default: a warning on the `sqla_queue.migrate` logger),
    at most `lock_retries` times (then `MigrationBlockedError`). A connection inside a
    transaction runs every revision in that transaction.

    Refuses a contract revision while live workers built for an earlier revision are
    registered (`OlderWorkersError`, naming them) unless `force`.

    Raises `SchemaElsewhereError`, saying what to do, if our schema is there but was not
    recorded by us (another Alembic environment manages it, or our version table was lost).
    """
    from alembic import command

    if isinstance(bind, Engine):
        with bind.connect() as connection:
            upgrade(
                connection,
                revision,
                lock_timeout=lock_timeout,
                lock_retries=lock_retries,
                report=report,
                force=force,
                within_alembic=within_alembic,
            )
            connection.commit()
        return
    say = report or _log.warning
    external = bind.in_transaction()
    refuse_schema_made_elsewhere(bind)
    if not force:
        refuse_contract_with_older_workers(bind, revision)
    if external:
        _run(bind, lambda cfg: command.upgrade(cfg, revision))
        return
    bind.commit()
    bind.exec_driver_sql(f"SET lock_timeout = '{int(lock_timeout * 1000)}ms'")
    bind.commit()
    try:
        for attempt in range(lock_retries + 1):
            try:
                if within_alembic:
                    _apply_steps_online(bind, revision)
                else:
                    _run(bind, lambda cfg: command.upgrade(cfg, revision))
                return
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                bind.rollback()
                where = applied_revisions(bind)
                holder = _oldest_transaction(bind)
                bind.rollback()
                if attempt == lock_retries:
                    raise MigrationBlockedError(
                        after=", ".join(where) or "base",
                        tries=lock_retries + 1,
                        timeout=lock_timeout,
                        holder=holder,
                    ) from None
                pause = min(lock_timeout * 2**attempt, 10.0)
                say(
                    f"sqla-queue migrate: the revision after {', '.join(where) or 'base'} "
                    f"waited {lock_timeout:g} s (lock_timeout) for a lock and was rolled "
                    f"back; {holder}; retry {attempt + 1} of {lock_retries} in {pause:g} s"
                )
                time.sleep(pause)
    finally:
        bind.rollback()
        bind.exec_driver_sql("RESET lock_timeout")
        bind.commit()


def _apply_steps_online(connection: Connection, target: str) -> None:
    """Our revisions up to `target` on `connection` (outside a transaction), each in a
    transaction of its own that it may step out of, as our environment runs them; Alembic's
    `op` is pointed at them meanwhile and given back after."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from alembic import op

    prepare_version_table(connection)
    connection.commit()
    script = ScriptDirectory.from_config(
        alembic_config(optional=bool(set(applied_revisions(connection)) & OPTIONAL_REVISIONS))
    )
    connection.commit()
    context = MigrationContext.configure(
        connection,
        opts={
            **_VERSION_OPTIONS,
            "fn": lambda heads, _context: script._upgrade_revs(target, heads),
            "transaction_per_migration": True,
            "on_version_apply": [record_revision_kind],
            ONLINE_OPTION: True,
        },
    )
    outer = getattr(op, "_proxy", None)
    try:
        with Operations.context(context):
            context.run_migrations()
    finally:
        if outer is not None:
            outer._install_proxy()
    connection.commit()


def _oldest_transaction(connection: Connection) -> str:
    """The oldest other open transaction of this database, in words: what a lock waits for."""
    row = connection.execute(queries.oldest_transaction()).first()
    if row is None:
        return "no other transaction is open now"
    return (
        f"the oldest open transaction here is pid {row.pid} ({row.state} for "
        f"{row.seconds:.0f} s: {row.query[:80]!r})"
    )


def stamp(bind: Engine | Connection) -> str:
    """Record the revision our schema's marker names as applied, without running anything.

    For a schema whose version table was lost; returns the revision it recorded.
    """
    from alembic import command

    if isinstance(bind, Engine):
        with bind.begin() as connection:
            return stamp(connection)
    found = schema_revision(bind)
    if found is None:
        raise SchemaMissingError(found="none", expected=SCHEMA_REVISION)
    _run(bind, lambda cfg: command.stamp(cfg, found))
    return found


def applied_revisions(connection: Connection) -> tuple[str, ...]:
    """The heads recorded in our version table (none when it does not exist)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection, opts=_VERSION_OPTIONS).get_current_heads()


def head_revision() -> str:
    """The newest revision of our schema this package ships (on our branch)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the package ships at least one revision"
    return head


def run_steps(connection: Connection, target: str, upgrading: bool) -> None:
    """Upgrade (or downgrade) our schema to `target` inside the caller's Alembic migration.

    Our revisions run through the caller's `alembic.op` on `connection`, in its transaction,
    and are recorded in our version table, as `sqla-queue migrate` records them. A target the
    database is already past (upgrading) or not yet at (downgrading) changes nothing.
    """
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    prepare_version_table(connection)
    script = ScriptDirectory.from_config(
        alembic_config(optional=bool(set(applied_revisions(connection)) & OPTIONAL_REVISIONS))
    )
    context = MigrationContext.configure(connection, opts=_VERSION_OPTIONS)
    heads = context.get_current_heads()
    reached = {rev.revision for rev in script.iterate_revisions(heads, "base") if rev}
    if (target in reached) if upgrading else (target != "base" and target not in reached):
        return
    if upgrading:
        steps = script._upgrade_revs(target, heads)  # type: ignore[arg-type]
    else:
        steps = script._downgrade_revs(target, heads)  # type: ignore[arg-type]
    context = MigrationContext.configure(
        connection,
        opts={
            **_VERSION_OPTIONS,
            "fn": lambda _heads, _context: steps,
            "on_version_apply": [record_revision_kind],
        },
    )
    context.run_migrations()
    drop_version_table_at_base(connection)


def _revision_ids() -> set[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(optional=True))
    return {rev.revision for rev in script.walk_revisions()}


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every revision this package ships, opt-in ones included (read once)."""
    return frozenset(_revision_ids())


def version_tables_recording_ours(connection: Connection) -> list[str]:
    """Alembic version tables, other than ours, that record one of our revisions."""
    columns = table("columns", column("table_schema"), column("table_name"), column("column_name"))
    columns.schema = "information_schema"
    candidates = connection.execute(
        select(columns.c.table_schema, columns.c.table_name).where(
            columns.c.column_name == "version_num"
        )
    ).all()
    ours = _revision_ids()
    found = []
    for schema, name in candidates:
        if (schema, name) == (VERSION_TABLE_SCHEMA, VERSION_TABLE):
            continue
        versions = table(name, column("version_num"), schema=schema)
        if set(connection.execute(select(versions.c.version_num)).scalars()) & ours:
            found.append(f"{schema}.{name}")
    return found


def refuse_schema_made_elsewhere(connection: Connection) -> None:
    """Raise `SchemaElsewhereError` if our schema exists but our version table records nothing."""
    _move_legacy_version_table(connection)
    found = schema_revision(connection)
    if found is None or applied_revisions(connection):
        return
    elsewhere = version_tables_recording_ours(connection)
    if elsewhere:
        fix = (
            f"it is recorded in {', '.join(elsewhere)}, by another Alembic environment (your "
            "application's?): upgrade it there with `alembic upgrade heads`, not with "
            "sqla-queue migrate"
        )
    else:
        fix = (
            "no Alembic version table records it (was alembic_version_sqla_queue dropped?): "
            "record it with `sqla-queue migrate --stamp`, then run `sqla-queue migrate` again"
        )
    raise SchemaElsewhereError(found=found, fix=fix)


def downgrade(bind: Engine | Connection, revision: str = f"{BRANCH}@base") -> None:
    """Revert our revisions down to `revision` (by default, remove everything we created)."""
    from alembic import command

    _run(bind, lambda cfg: command.downgrade(cfg, revision))


def drop_queue_fk(bind: Engine | Connection) -> None:
    """Apply the opt-in revision that lets jobs name queues that do not exist: it drops the
    queue check's triggers (sqlaq_0031), or the foreign key from jobs.queue to queues.name
    that a schema before it has.

    Enqueuing into an unknown queue then succeeds; its jobs run as if the queue existed.
    """
    from alembic import command

    _run(bind, lambda cfg: command.upgrade(cfg, f"{OPTIONAL_BRANCH}@head"), optional=True)


def restore_queue_fk(bind: Engine | Connection) -> None:
    """Revert the opt-in revision: restore the queue check (its triggers; a schema before
    sqlaq_0031, the foreign key) after checking for orphan jobs.

    Raises `OrphanJobsError`, naming the queues, if jobs reference queues that do not exist.
    """
    from alembic import command

    _run(bind, lambda cfg: command.downgrade(cfg, f"{OPTIONAL_BRANCH}@base"), optional=True)


def has_optional_revisions(connection: Connection) -> bool:
    """Whether this database has any of our opt-in revisions applied."""
    _move_legacy_version_table(connection)
    return bool(set(applied_revisions(connection)) & OPTIONAL_REVISIONS)


def _move_legacy_version_table(connection: Connection) -> None:
    """Releases before 0.2 kept our version table in the default schema: move it into ours."""
    default = connection.dialect.default_schema_name or "public"
    inspector = inspect(connection)
    if not inspector.has_schema(SCHEMA) or not inspector.has_table(VERSION_TABLE, default):
        return
    if inspector.has_table(VERSION_TABLE, VERSION_TABLE_SCHEMA):
        return
    quote = connection.dialect.identifier_preparer.quote
    connection.execute(
        text(f"ALTER TABLE {quote(default)}.{VERSION_TABLE} SET SCHEMA {VERSION_TABLE_SCHEMA}")
    )


def prepare_version_table(connection: Connection) -> None:
    """Our schema must exist before Alembic creates our version table in it."""
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    _move_legacy_version_table(connection)


def drop_version_table_at_base(connection: Connection) -> None:
    """Once none of our revisions is applied, drop our version table, then our empty schema."""
    if applied_revisions(connection):
        return
    connection.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE_SCHEMA}.{VERSION_TABLE}"))
    if inspect(connection).has_schema(SCHEMA):
        connection.execute(text(DROP_SCHEMA_IF_EMPTY))


def _run(bind: Engine | Connection, action: Any, optional: bool | None = None) -> None:
    """Run an Alembic command; the optional folder is listed when asked or already applied."""
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            _run(connection, action, optional)
            connection.commit()
        return
    external = bind.in_transaction()
    with_optional = has_optional_revisions(bind) if optional is None else optional
    if not external:
        bind.commit()  # Alembic then owns each revision's transaction (online revisions)
    action(alembic_config(bind, optional=with_optional))


def is_history_partition(name: str | None) -> bool:
    """Whether table `name` is a partition of the history (`jobs_history_p<date>`, or its
    DEFAULT partition): made by the keeper, not by a model, so no autogenerate compares it."""
    return name is not None and name.startswith(f"{HISTORY_TABLE}_")


def include_ours(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Autogenerate filter for our own environment: only our schema, without our version table."""
    if type_ == "schema":
        return name == SCHEMA
    if type_ == "table" and (name == VERSION_TABLE or is_history_partition(name)):
        return False
    if is_history_partition(parent_names.get("table_name")):
        return False  # a partition's own copies of the history's indexes
    return parent_names.get("schema_name") == SCHEMA if "schema_name" in parent_names else True


def run_alembic_env() -> None:
    """The body of our Alembic `env.py` (the package's and this repository's)."""
    from alembic import context

    config = context.config
    options: dict[str, Any] = {
        "target_metadata": QueueBase.metadata,
        **_VERSION_OPTIONS,
        "include_schemas": True,
        "include_name": include_ours,
    }
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_online(connection, options)
        return
    url = (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get(URL_ENV_VAR)
        or os.environ.get("DATABASE_URL")
    )
    if not url:
        raise SystemExit(f"no database URL: set {URL_ENV_VAR} or sqlalchemy.url in alembic.ini")
    if context.is_offline_mode():
        context.configure(url=normalize_url(url), literal_binds=True, **options)
        with context.begin_transaction():
            context.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            context.run_migrations()
        return
    engine = create_queue_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run_online(conn, options)
        conn.commit()
    engine.dispose()


def _run_online(connection: Connection, options: dict[str, Any]) -> None:
    from alembic import context

    external = connection.in_transaction()
    prepare_version_table(connection)
    if not external:
        connection.commit()
    # outside a caller's transaction, each revision commits apart, so a revision may build
    # its indexes concurrently between its transactions (sqla_queue.db.online)
    context.configure(
        connection=connection,
        transaction_per_migration=not external,
        on_version_apply=record_revision_kind,
        **{**options, ONLINE_OPTION: not external},
    )
    with context.begin_transaction():
        context.run_migrations()
    drop_version_table_at_base(connection)
    if not external:
        connection.commit()


ONLINE_OPTION = "sqla_queue_online"
"""The Alembic context option our own environment sets when each revision has a transaction
of its own, which a revision may step out of (`sqla_queue.db.online`)."""

KINDS_TABLE = "schema_revisions"
"""Our applied revisions and their kinds (`expand` or `contract`), in our schema, written as
each revision is applied: what code built for an earlier revision reads to know whether the
newer ones it does not know leave it working."""


def revision_kind(module: Any) -> str | None:
    """A revision module's `migration_kind` ("expand" or "contract"), None if it has none."""
    kind = getattr(module, "migration_kind", None)
    return kind if kind in ("expand", "contract") else None


def record_revision_kind(ctx: Any, step: Any, heads: Any, run_args: Any) -> None:
    """Alembic's `on_version_apply` hook: record (or forget) the step's revision and kind
    in `schema_revisions`, once that table exists (the revision that adds it records the
    ones before it)."""
    connection = ctx.connection
    if connection.execute(queries.relation_exists(), {"name": f"{SCHEMA}.{KINDS_TABLE}"}).scalar():
        for revision_id in step.up_revision_ids:
            if step.is_upgrade:
                script = step.revision_map.get_revision(revision_id)
                kind = revision_kind(script.module) or "contract"
                connection.execute(
                    queries.record_revision(), {"revision": revision_id, "kind": kind}
                )
            else:
                connection.execute(queries.forget_revision(), {"revision": revision_id})


_NUMBER = re.compile(r"^sqlaq_(\d+)")


def _revision_number(revision: str) -> int | None:
    """`sqlaq_0022_fleet_versions` -> 22; None for a revision not of ours."""
    found = _NUMBER.match(revision)
    return int(found.group(1)) if found else None


def schema_revision(connection: Connection) -> str | None:
    """Our schema's revision in this database, or None if it has no sqla-queue schema."""
    comment = connection.execute(queries.schema_revision()).scalar()
    if not comment:
        return None
    return str(comment).rsplit(" ", 1)[-1]


def _recorded_revisions(connection: Connection) -> dict[str, str | None]:
    """Every revision this database records, with its kind where `schema_revisions` says
    (None elsewhere): our schema's marker, our version table and `schema_revisions`, each
    where this role may read it."""
    params = {"version_table": f"{VERSION_TABLE_SCHEMA}.{VERSION_TABLE}"}
    row = connection.execute(queries.schema_marks(), params).first()
    if row is None:
        return {}
    found: dict[str, str | None] = {}
    if row.marker:
        found[str(row.marker).rsplit(" ", 1)[-1]] = None
    if row.readable:
        statement = queries.applied_revisions(VERSION_TABLE, VERSION_TABLE_SCHEMA)
        found.update(dict.fromkeys(connection.execute(statement).scalars()))
    if row.kinds_readable:
        found.update({str(r): str(k) for r, k in connection.execute(queries.revision_kinds())})
    return found


def unknown_revisions(connection: Connection) -> list[str]:
    """The revisions this database records that this package does not ship
    (`known_revisions`) and that are not known to be `expand` revisions: a newer sqla-queue
    migrated it past what this code can work with. A few catalog reads; none of the
    migration scripts."""
    known = known_revisions()
    return sorted(
        revision
        for revision, kind in _recorded_revisions(connection).items()
        if revision not in known and kind != "expand"
    )


def newer_expand_revisions(connection: Connection) -> list[str]:
    """The revisions this database records that this package does not ship, all `expand`:
    this code keeps working on them (it was built for an older revision)."""
    known = known_revisions()
    return sorted(
        revision
        for revision, kind in _recorded_revisions(connection).items()
        if revision not in known and kind == "expand"
    )


def pending_contract_revisions(connection: Connection, target: str) -> list[str]:
    """The contract revisions an upgrade to `target` would apply, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(optional=True))
    heads = applied_revisions(connection)
    applied = {rev.revision for rev in script.iterate_revisions(heads, "base") if rev}
    pending = [
        rev
        for rev in script.iterate_revisions(target, "base")
        if rev is not None and rev.revision not in applied
    ]
    return [rev.revision for rev in reversed(pending) if revision_kind(rev.module) != "expand"]


def refuse_contract_with_older_workers(connection: Connection, target: str) -> None:
    """Raise `OlderWorkersError` if an upgrade to `target` applies a contract revision while
    live workers built for an earlier revision (or of a release that did not say) run."""
    contract = pending_contract_revisions(connection, target)
    if not contract or not inspect(connection).has_table("workers", SCHEMA):
        return
    first = _revision_number(contract[0]) or 0
    has_versions = "schema_revision" in {
        c["name"] for c in inspect(connection).get_columns("workers", SCHEMA)
    }
    older = []
    for worker in connection.execute(queries.live_worker_versions(has_versions)).mappings():
        built = worker["schema_revision"]
        number = _revision_number(built) if built else None
        if number is None or number < first:
            older.append(
                f"{worker['id']} (pid {worker['pid']} on {worker['hostname']}, "
                f"{worker['version'] or 'a release before fleet versions'}, "
                f"built for {built or 'an unrecorded revision'})"
            )
    if older:
        raise OlderWorkersError(revisions=", ".join(contract), workers="; ".join(older))


def _older(revision: str) -> bool:
    """Whether `revision` is numbered before the one this code needs (`SCHEMA_REVISION`)."""
    number, needed = _revision_number(revision), _revision_number(SCHEMA_REVISION)
    return number is not None and needed is not None and number < needed


def check_schema(bind: Engine | Connection) -> str:
    """Raise `SchemaMissingError` unless our schema is at `SCHEMA_REVISION` or a later
    revision this package ships, and `SchemaUnknownError` when the database records a
    revision this package does not know (a newer sqla-queue migrated it)."""
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            return check_schema(connection)
    found = schema_revision(bind)
    if found is None or _older(found):
        raise SchemaMissingError(found=found or "none", expected=SCHEMA_REVISION)
    unknown = unknown_revisions(bind)
    if unknown:
        raise SchemaUnknownError(found=", ".join(unknown), known=head_revision())
    return found
