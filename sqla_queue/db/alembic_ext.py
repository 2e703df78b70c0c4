"""sqla-queue in an application's own Alembic environment.

Two ways, both tested from the output of a real `alembic init`:

**One linear history (recommended).** `sqla-queue alembic revision` writes a revision into
your versions folder whose `upgrade()` calls `upgrade_schema("sqlaq_000N")` and whose
`downgrade()` calls `downgrade_schema(...)`: sqla-queue's schema becomes ordinary steps of
your history, `alembic revision --autogenerate` keeps working (one head), and a later
sqla-queue release is one more `sqla-queue alembic revision`. Our revisions are recorded
in our own version table inside our schema (as `sqla-queue migrate` records them).

**Our branch beside yours.** Add `sqla_queue.db.migrate.versions_folder()` to
`version_locations` (`sqla-queue alembic version-locations` prints the line) and run
`alembic upgrade heads`; your version table records our revisions, and each autogenerate
needs `--head <your branch>@head`.

Autogenerate: a stock `env.py` looks at your default schema only, and sees nothing of ours.
With `include_schemas=True`, add our filters, or it would drop our tables:

    from sqla_queue.db.alembic_ext import include_name, include_object
    context.configure(..., include_schemas=True,
                      include_name=include_name, include_object=include_object)
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError, rev_id

from sqla_queue.db import migrate
from sqla_queue.db.migrate import VERSION_TABLE
from sqla_queue.db.models import SCHEMA
from sqla_queue.errors import ConfigurationError

_UPGRADE_CALL = re.compile(r"""\bupgrade_schema\(\s*["']([^"']+)["']""")
_SEPARATORS = {"os": os.pathsep, ":": ":", ";": ";", "space": " ", "newline": "\n"}


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Skip the `sqla_queue` schema, its tables, and our version table."""
    if type_ == "schema":
        return name != SCHEMA
    if type_ == "table":
        return parent_names.get("schema_name") != SCHEMA and name != VERSION_TABLE
    return True


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Skip every object whose table lives in the `sqla_queue` schema."""
    table = obj if type_ == "table" else getattr(obj, "table", None)
    if table is not None and getattr(table, "schema", None) == SCHEMA:
        return False
    return not (type_ == "table" and name == VERSION_TABLE)


def upgrade_schema(revision: str) -> None:
    """In a revision of your own history: bring sqla-queue's schema up to `revision`.

    Online when your environment gives each revision a transaction of its own
    (`context.configure(..., transaction_per_migration=True)`): it steps out of it
    (`autocommit_block`, which commits what the revision did before the call: keep the
    revision as `sqla-queue alembic revision` wrote it) and applies our revisions as
    `sqla-queue migrate` does, on a connection of its own (each in its own transaction,
    indexes built concurrently, locks waited for at most `migrate.DEFAULT_LOCK_TIMEOUT`
    and retried, each wait logged on `alembic.runtime.migration`). Otherwise it runs on
    your migration's connection and transaction, every revision in it. Does nothing if the
    database is already there (for instance after `sqla-queue migrate`).
    """
    from alembic import op

    connection = _online_connection("upgrade_schema")
    context = op.get_context()
    if _may_step_out(context):
        say = logging.getLogger("alembic.runtime.migration").warning
        with context.autocommit_block():
            migrate.upgrade(connection.engine, revision, report=say, within_alembic=True)
        return
    migrate.run_steps(connection, revision, upgrading=True)


def _may_step_out(context: Any) -> bool:
    """Whether the running revision's transaction is Alembic's own, one per revision:
    leaving it commits only what this revision did before the call (nothing, in the
    revision `write_revision` writes; Alembic's own version table on a first run)."""
    if getattr(context, "_in_external_transaction", True) or context._transaction is None:
        return False
    return bool(getattr(context, "_transaction_per_migration", False))


def downgrade_schema(revision: str | None) -> None:
    """In a revision of your own history: take sqla-queue's schema back to `revision`.

    None removes everything sqla-queue created (its schema and its version table).
    """
    migrate.run_steps(_online_connection("downgrade_schema"), revision or "base", upgrading=False)


def _online_connection(caller: str) -> Any:
    from alembic import op

    if op.get_context().as_sql:
        raise ConfigurationError(
            detail=f"{caller}() needs a database connection; Alembic's offline (--sql) mode "
            "cannot run it; run this migration without --sql"
        )
    return op.get_bind()


def write_revision(
    config_file: str | os.PathLike[str], message: str | None = None, revision: str | None = None
) -> Path | None:
    """Write a revision into the application's history that brings our schema to `revision`.

    `config_file` is the application's `alembic.ini`; `revision` defaults to our newest.
    Its downgrade returns our schema to what the history's previous such revision applied.
    Returns the new file, or None when the history already applies `revision`.
    """
    config = Config(str(config_file))
    script = ScriptDirectory.from_config(config)
    heads = script.get_heads()
    if len(heads) > 1:
        raise ConfigurationError(
            detail=f"the Alembic history of {config_file} has {len(heads)} heads "
            f"({', '.join(heads)}); merge them first (`alembic merge heads`)"
        )
    target = revision or migrate.head_revision()
    previous = _applied_by_history(script)
    if previous == target:
        return None
    written = script.generate_revision(
        rev_id(),
        message or f"sqla-queue schema {target}",
        head="head",
        imports="from sqla_queue.db.alembic_ext import downgrade_schema, upgrade_schema",
        upgrades=f"upgrade_schema({target!r})",
        downgrades=f"downgrade_schema({previous!r})",
    )
    if written is None or _UPGRADE_CALL.search(Path(written.path).read_text()) is None:
        raise ConfigurationError(
            detail=f"the revision template of {config_file} did not take the upgrade and "
            "downgrade bodies (it needs ${upgrades}, ${downgrades} and ${imports}, as "
            "alembic init writes it)"
        )
    return Path(written.path)


def _applied_by_history(script: ScriptDirectory) -> str | None:
    """The target of the newest revision in the history that calls `upgrade_schema`."""
    try:
        revisions = list(script.iterate_revisions("heads", "base"))
    except CommandError:
        return None
    for rev in revisions:
        found = _UPGRADE_CALL.search(Path(rev.path).read_text())
        if found:
            return found.group(1)
    return None


def version_locations_line(config_file: str | os.PathLike[str]) -> str:
    """The `version_locations` line for the application's `alembic.ini` that adds our folder.

    It keeps the locations the file lists (or its default, `<script_location>/versions`) and
    joins them with the separator its `path_separator` names (`os` in `alembic init` output).
    """
    config = Config(str(config_file))
    section = config.config_ini_section
    parser = config.file_config
    separator_name = parser.get(section, "path_separator", fallback="space")
    separator = _SEPARATORS.get(separator_name, " ")
    existing = parser.get(section, "version_locations", raw=True, fallback=None)
    if not existing:
        script_location = parser.get(section, "script_location", raw=True, fallback="alembic")
        existing = f"{script_location.rstrip('/')}/versions"
    ours = migrate.versions_folder()
    if ours in existing.split(separator):
        return f"version_locations = {existing}"
    return f"version_locations = {existing}{separator}{ours}"
