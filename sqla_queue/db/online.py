"""The rules of an online revision, as calls a revision's `upgrade()` makes.

A revision of ours runs while the queue runs: enqueues and claims go on writing the jobs
table. So a revision

1. does its **online steps first**, each outside the revision's transaction (Alembic's
   `autocommit_block`) and each idempotent, so a step cut short is resumed by running the
   revision again: nullable or constant-default columns (`add_columns`), indexes built with
   `CREATE INDEX CONCURRENTLY` (`create_index`: an INVALID index a killed build left behind
   is dropped and built again), CHECK constraints added `NOT VALID` and validated apart
   (`add_check`), and replacements built beside what they replace (`build_replacement`);
2. then its **transactional part** (new small tables, functions, triggers, swaps of what
   step 1 built, the schema's marker), which commits with the revision's row in our version
   table: every statement in it that takes a strong lock waits at most `lock_timeout`
   (`sqla-queue migrate` sets it for the session) and the revision is retried after a
   pause if it did not get its lock (`migrate.upgrade` does the retrying).

A revision declares `migration_kind = "expand"` (code built for earlier revisions keeps
working on it) or `"contract"` (it removes or changes what earlier code uses); see
docs/migrations.md.

When the revision runs inside a transaction that is not its own (an application's history
through `alembic_ext.upgrade_schema`, a connection passed in a transaction), nothing can
leave it: the same steps then run in that transaction, with plain `CREATE INDEX` (the same
index), and the locks wait as that environment's `lock_timeout` says.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import sqlalchemy as sa

from sqla_queue.db.models import SCHEMA

_log = logging.getLogger("sqla_queue.migrate")

MigrationKind = Literal["expand", "contract"]
MIGRATION_KINDS: tuple[MigrationKind, ...] = ("expand", "contract")
REPLACEMENT_SUFFIX = "_new"
"""The name a replacement index or constraint is built under, before `swap_index` or
`swap_check` gives it the name of what it replaces."""


class OnlineOrderError(RuntimeError):
    """An online step ran after the revision's transaction had written something: leaving
    the transaction would commit half a revision. Put the online steps first."""


def _context() -> Any:
    from alembic import op

    return op.get_context()


def can_leave_transaction() -> bool:
    """Whether the running revision may step out of its transaction: our environment runs
    it (`sqla-queue migrate`, `alembic upgrade` from this repository) in a transaction of
    its own that Alembic owns. Inside an application's history (`upgrade_schema`) the
    revisions share the application's transaction and stay in it."""
    context = _context()
    if context.as_sql or not context.opts.get("sqla_queue_online", False):
        return False  # not our environment's own transaction per revision
    return not getattr(context, "_in_external_transaction", False)


@contextmanager
def outside_transaction() -> Iterator[sa.Connection]:
    """Run what follows in autocommit, outside the revision's transaction, when it may;
    else in that transaction. Refuses once the revision's transaction wrote anything."""
    context = _context()
    connection: sa.Connection = context.connection
    if not can_leave_transaction():
        yield connection
        return
    if connection.in_transaction():
        wrote = connection.execute(sa.text("SELECT txid_current_if_assigned()")).scalar()
        if wrote is not None:
            raise OnlineOrderError()
    with context.autocommit_block():
        yield context.connection


def index_state(connection: sa.Connection, name: str, schema: str = SCHEMA) -> bool | None:
    """None when the index does not exist, else whether it is valid (`pg_index.indisvalid`)."""
    row = connection.execute(
        sa.text(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :schema AND c.relname = :name"
        ),
        {"schema": schema, "name": name},
    ).first()
    return None if row is None else bool(row[0])


def create_index(
    name: str,
    table: str,
    columns: Sequence[str | sa.TextClause],
    *,
    schema: str = SCHEMA,
    **options: Any,
) -> None:
    """Build an index with `CREATE INDEX CONCURRENTLY`, outside the revision's transaction.

    Writers go on while it reads the table. Resumable: an INVALID index of that name (a
    build that was killed or timed out) is dropped concurrently and built again; a valid one
    is kept. `options` are `op.create_index`'s (`unique`, `postgresql_where`, ...).
    """
    from alembic import op

    online = can_leave_transaction()
    with outside_transaction() as connection:
        if index_state(connection, name, schema) is False:
            _log.warning(
                "index %s.%s was left INVALID by an interrupted build: dropping it and "
                "building it again",
                schema,
                name,
            )
            drop = f"DROP INDEX {'CONCURRENTLY ' if online else ''}IF EXISTS {schema}.{name}"
            connection.execute(sa.text(drop))
        if online:
            options["postgresql_concurrently"] = True
        op.create_index(name, table, list(columns), schema=schema, if_not_exists=True, **options)


def drop_index(name: str, *, schema: str = SCHEMA) -> None:
    """Drop an index with `DROP INDEX CONCURRENTLY` (writers are not held), if it exists."""
    online = can_leave_transaction()
    with outside_transaction() as connection:
        concurrently = "CONCURRENTLY " if online else ""
        connection.execute(sa.text(f"DROP INDEX {concurrently}IF EXISTS {schema}.{name}"))


def build_replacement(
    name: str,
    table: str,
    columns: Sequence[str | sa.TextClause],
    *,
    schema: str = SCHEMA,
    **options: Any,
) -> None:
    """Build the index that will replace `name` under `name + "_new"` (concurrently,
    resumable); the transactional part then calls `swap_index(name)`."""
    create_index(name + REPLACEMENT_SUFFIX, table, columns, schema=schema, **options)


def swap_index(name: str, *, schema: str = SCHEMA) -> None:
    """In the revision's transaction: drop `name` and give its replacement its name (two
    catalog changes, a brief lock under the migration's `lock_timeout`)."""
    from alembic import op

    op.execute(f"DROP INDEX IF EXISTS {schema}.{name}")
    op.execute(f"ALTER INDEX {schema}.{name}{REPLACEMENT_SUFFIX} RENAME TO {name}")


def add_columns(table: str, *columns: sa.Column[Any], schema: str = SCHEMA) -> None:
    """Add columns that rewrite no row (NULL, or a constant default) outside the revision's
    transaction, each if it is not there yet: a brief ACCESS EXCLUSIVE lock each, under the
    migration's `lock_timeout`, and nothing held while the rest of the revision runs."""
    from alembic import op

    with outside_transaction():
        for column in columns:
            op.add_column(table, column, schema=schema, if_not_exists=True)


def _constraint_state(connection: sa.Connection, table: str, name: str, schema: str) -> Any:
    return connection.execute(
        sa.text(
            "SELECT c.convalidated FROM pg_constraint c "
            "JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
            "WHERE n.nspname = :schema AND t.relname = :table AND c.conname = :name"
        ),
        {"schema": schema, "table": table, "name": name},
    ).first()


def add_check(table: str, name: str, condition: str, *, schema: str = SCHEMA) -> None:
    """Add a CHECK constraint without holding writers for a scan of the table: added
    `NOT VALID` (a brief lock; new rows are checked from then on), then validated apart
    (`VALIDATE CONSTRAINT` reads every row under a lock that lets writes through).
    Idempotent: what is already there is kept."""
    with outside_transaction() as connection:
        state = _constraint_state(connection, table, name, schema)
        if state is None:
            connection.execute(
                sa.text(
                    f"ALTER TABLE {schema}.{table} ADD CONSTRAINT {name} "
                    f"CHECK ({condition}) NOT VALID"
                )
            )
        if state is None or not state[0]:
            connection.execute(sa.text(f"ALTER TABLE {schema}.{table} VALIDATE CONSTRAINT {name}"))


def swap_check(table: str, name: str, *, schema: str = SCHEMA) -> None:
    """In the revision's transaction: drop constraint `name` and give the one `add_check`
    built as `name + "_new"` its name."""
    from alembic import op

    op.execute(f"ALTER TABLE {schema}.{table} DROP CONSTRAINT IF EXISTS {name}")
    op.execute(
        f"ALTER TABLE {schema}.{table} RENAME CONSTRAINT {name}{REPLACEMENT_SUFFIX} TO {name}"
    )
