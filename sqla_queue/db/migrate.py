"""Applying our Alembic revisions: `upgrade`, `downgrade`, the Alembic env, the schema check.

Our revisions are recorded in our own version table inside our own schema
(`sqla_queue.alembic_version_sqla_queue`), so an application's autogenerate, which looks at
its default schema unless told otherwise, never sees it.
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, column, inspect, pool, select, table, text

from sqla_queue.db import queries
from sqla_queue.db.database import URL_ENV_VAR, create_queue_engine, normalize_url
from sqla_queue.db.models import SCHEMA, QueueBase
from sqla_queue.errors import SchemaElsewhereError, SchemaMissingError, SchemaUnknownError

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
SCHEMA_REVISION = "sqlaq_0017"
"""The revision of our schema this version of the code needs (or a later one it ships: a
revision it does not know is refused, `check_schema`)."""
OPTIONAL_BRANCH = "sqla_queue_no_queue_fk"
"""The opt-in branch that drops the jobs -> queues foreign key (`migrate --drop-queue-fk`)."""
OPTIONAL_REVISIONS = frozenset({"sqlaq_nofk_0001"})
"""Revision ids that live in the optional folder, not in `versions_folder()`."""


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


def upgrade(bind: Engine | Connection, revision: str = f"{BRANCH}@head") -> None:
    """Apply our revisions up to `revision` on `bind` (an engine or a connection).

    Raises `SchemaElsewhereError`, saying what to do, if our schema is there but was not
    recorded by us (another Alembic environment manages it, or our version table was lost).
    """
    from alembic import command

    if isinstance(bind, Engine):
        with bind.begin() as connection:
            upgrade(connection, revision)
        return
    refuse_schema_made_elsewhere(bind)
    _run(bind, lambda cfg: command.upgrade(cfg, revision))


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
        connection, opts={**_VERSION_OPTIONS, "fn": lambda _heads, _context: steps}
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
    """Apply the opt-in revision that drops the foreign key from jobs.queue to queues.name.

    Enqueuing into an unknown queue then succeeds; its jobs run as if the queue existed.
    """
    from alembic import command

    _run(bind, lambda cfg: command.upgrade(cfg, f"{OPTIONAL_BRANCH}@head"), optional=True)


def restore_queue_fk(bind: Engine | Connection) -> None:
    """Revert the opt-in revision: restore the foreign key after checking for orphan jobs.

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
        with bind.begin() as connection:
            _run(connection, action, optional)
        return
    with_optional = has_optional_revisions(bind) if optional is None else optional
    action(alembic_config(bind, optional=with_optional))


def include_ours(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Autogenerate filter for our own environment: only our schema, without our version table."""
    if type_ == "schema":
        return name == SCHEMA
    if type_ == "table" and name == VERSION_TABLE:
        return False
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

    prepare_version_table(connection)
    context.configure(connection=connection, **options)
    with context.begin_transaction():
        context.run_migrations()
        drop_version_table_at_base(connection)


def _revision_number(revision: str) -> int:
    return int(revision.rsplit("_", 1)[-1])


def schema_revision(connection: Connection) -> str | None:
    """Our schema's revision in this database, or None if it has no sqla-queue schema."""
    comment = connection.execute(queries.schema_revision()).scalar()
    if not comment:
        return None
    return str(comment).rsplit(" ", 1)[-1]


def unknown_revisions(connection: Connection) -> list[str]:
    """The revisions this database records that this package does not ship (`known_revisions`),
    in our schema's marker or in our version table (where this role may read it): a newer
    sqla-queue migrated it. Two catalog reads; none of the migration scripts."""
    params = {"version_table": f"{VERSION_TABLE_SCHEMA}.{VERSION_TABLE}"}
    row = connection.execute(queries.schema_marks(), params).first()
    if row is None:
        return []
    found = {str(row.marker).rsplit(" ", 1)[-1]} if row.marker else set()
    if row.readable:
        statement = queries.applied_revisions(VERSION_TABLE, VERSION_TABLE_SCHEMA)
        found.update(connection.execute(statement).scalars())
    known = known_revisions()
    return sorted(revision for revision in found if revision not in known)


def _older(revision: str) -> bool:
    """Whether `revision` is numbered before the one this code needs (`SCHEMA_REVISION`)."""
    number = revision.rsplit("_", 1)[-1]
    return number.isdigit() and int(number) < _revision_number(SCHEMA_REVISION)


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
