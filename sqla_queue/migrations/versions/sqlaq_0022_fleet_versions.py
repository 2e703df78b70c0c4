"""sqla-queue: versions on the fleet, and the kind of each applied revision.

- `workers.version` and `workers.schema_revision` (text, NULL for a worker of an earlier
  release): the package version each worker runs and the schema revision its code was
  built for. `sqla-queue workers list` and the dashboard show them; `sqla-queue migrate`
  refuses a contract revision while a live worker was built for an earlier revision.
- `schema_revisions`: every applied revision of ours and its kind, `expand` (code built
  for an earlier revision keeps working) or `contract` (it removes what such code uses),
  written as each revision is applied (`sqla_queue.db.migrate.record_revision_kind`); this
  revision records the ones applied before it. A worker reads the kinds of the revisions
  it does not know: only expand ones, and it runs (saying so once); a contract one, and it
  refuses to start.

Two NULL columns on a small table and one new table: nothing is rewritten, and the only
lock on a hot table is the workers table's, for a moment, under `lock_timeout`.

Revision ID: sqlaq_0022_fleet_versions
Revises: sqlaq_0021_progress_logs
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0022_fleet_versions"
down_revision: str | Sequence[str] | None = "sqlaq_0021_progress_logs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind: online.MigrationKind = "expand"

SCHEMA = "sqla_queue"


def _applied_before() -> list[tuple[str, str]]:
    """(revision, kind) of every revision of ours below this one, from their files."""
    from alembic.script import ScriptDirectory

    from sqla_queue.db.migrate import alembic_config, revision_kind

    script = ScriptDirectory.from_config(alembic_config())
    found = []
    for rev in script.iterate_revisions(down_revision, "base"):  # type: ignore[arg-type]
        if rev is not None:
            found.append((rev.revision, revision_kind(rev.module) or "contract"))
    return found


def upgrade() -> None:
    online.add_columns(
        "workers", sa.Column("version", sa.Text()), sa.Column("schema_revision", sa.Text())
    )
    op.create_table(
        "schema_revisions",
        sa.Column("revision", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column(
            "applied_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("kind IN ('expand', 'contract')", name=op.f("ck_schema_revisions_kind")),
        sa.PrimaryKeyConstraint("revision", name=op.f("pk_schema_revisions")),
        schema=SCHEMA,
    )
    rows = _applied_before()
    if rows:
        op.bulk_insert(
            sa.table("schema_revisions", sa.column("revision"), sa.column("kind"), schema=SCHEMA),
            [{"revision": rev, "kind": kind} for rev, kind in rows],
        )
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_table("schema_revisions", schema=SCHEMA)
    op.drop_column("workers", "schema_revision", schema=SCHEMA)
    op.drop_column("workers", "version", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
