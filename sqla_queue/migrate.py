"""Applying our Alembic revisions: `upgrade`, `downgrade`, the Alembic env, the schema check."""

from __future__ import annotations

import os
from importlib import resources
from typing import Any

from alembic.config import Config
from sqlalchemy import Connection, Engine, pool

from alembic import command

from . import queries
from .database import URL_ENV_VAR, create_queue_engine, normalize_url
from .errors import SchemaMissingError
from .models import SCHEMA, Base

BRANCH = "sqla_queue"
VERSION_TABLE = "alembic_version_sqla_queue"
"""Where `sqla-queue migrate` and this repository's `alembic.ini` record our revisions."""
SCHEMA_REVISION = "sqlaq_0004"
"""The revision of our schema this version of the code needs (or a later one)."""
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
    """Apply our revisions up to `revision` on `bind` (an engine or a connection)."""
    _run(bind, lambda cfg: command.upgrade(cfg, revision))


def downgrade(bind: Engine | Connection, revision: str = f"{BRANCH}@base") -> None:
    """Revert our revisions down to `revision` (by default, remove everything we created)."""
    _run(bind, lambda cfg: command.downgrade(cfg, revision))


def drop_queue_fk(bind: Engine | Connection) -> None:
    """Apply the opt-in revision that drops the foreign key from jobs.queue to queues.name.

    Enqueuing into an unknown queue then succeeds; its jobs run as if the queue existed.
    """
    _run(bind, lambda cfg: command.upgrade(cfg, f"{OPTIONAL_BRANCH}@head"), optional=True)


def restore_queue_fk(bind: Engine | Connection) -> None:
    """Revert the opt-in revision: restore the foreign key after checking for orphan jobs.

    Raises `OrphanJobsError`, naming the queues, if jobs reference queues that do not exist.
    """
    _run(bind, lambda cfg: command.downgrade(cfg, f"{OPTIONAL_BRANCH}@base"), optional=True)


def has_optional_revisions(connection: Connection) -> bool:
    """Whether this database has any of our opt-in revisions applied."""
    if not connection.execute(queries.version_table_exists(VERSION_TABLE)).scalar():
        return False
    applied = set(connection.execute(queries.applied_revisions(VERSION_TABLE)).scalars())
    return bool(applied & OPTIONAL_REVISIONS)


def _run(bind: Engine | Connection, action: Any, optional: bool | None = None) -> None:
    """Run an Alembic command; the optional folder is listed when asked or already applied."""
    if isinstance(bind, Engine):
        with bind.begin() as connection:
            _run(connection, action, optional)
        return
    with_optional = has_optional_revisions(bind) if optional is None else optional
    action(alembic_config(bind, optional=with_optional))


def include_ours(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Autogenerate filter for our own environment: only our schema."""
    if type_ == "schema":
        return name == SCHEMA
    return parent_names.get("schema_name") == SCHEMA if "schema_name" in parent_names else True


def run_alembic_env() -> None:
    """The body of our Alembic `env.py` (the package's and this repository's)."""
    from alembic import context

    config = context.config
    options: dict[str, Any] = {
        "target_metadata": Base.metadata,
        "version_table": VERSION_TABLE,
        "include_schemas": True,
        "include_name": include_ours,
    }
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, **options)
        with context.begin_transaction():
            context.run_migrations()
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
            context.run_migrations()
        return
    engine = create_queue_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, **options)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


def _revision_number(revision: str) -> int:
    return int(revision.rsplit("_", 1)[-1])


def schema_revision(connection: Connection) -> str | None:
    """Our schema's revision in this database, or None if it has no sqla-queue schema."""
    comment = connection.execute(queries.schema_revision()).scalar()
    if not comment:
        return None
    return str(comment).rsplit(" ", 1)[-1]


def check_schema(bind: Engine | Connection) -> str:
    """Raise `SchemaMissingError` unless our schema is at `SCHEMA_REVISION` or later."""
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            return check_schema(connection)
    found = schema_revision(bind)
    if found is None or _revision_number(found) < _revision_number(SCHEMA_REVISION):
        raise SchemaMissingError(found=found or "none", expected=SCHEMA_REVISION)
    return found
