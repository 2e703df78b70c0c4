"""sqla-queue: the row a job is about.

`jobs.about` and `jobs_archive.about` (text, NULL for a job about no row): the mapped row a
job was enqueued about (`enqueue(..., about=order)`), as `<table>:<primary key>`, e.g.
`orders:42` (a composite key as a JSON array: `lines:[42, 1]`). A partial index finds a row's
jobs (`sqla_queue.orm.jobs_of`, `order.jobs`, `jobs list --about`, and the cancel when the
row is deleted).

Every new column is NULL: adding it rewrites no row.

Revision ID: sqlaq_0012
Revises: sqlaq_0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0012"
down_revision: str | Sequence[str] | None = "sqlaq_0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    # online (sqla_queue.db.online): the indexes built concurrently, outside the transaction
    for table in ("jobs", "jobs_archive"):
        online.add_columns(table, sa.Column("about", sa.Text()))
        online.create_index(
            f"ix_{table}_about", table, ["about"], postgresql_where=sa.text("about IS NOT NULL")
        )
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    for table in ("jobs", "jobs_archive"):
        op.drop_index(f"ix_{table}_about", table_name=table, schema=SCHEMA)
        op.drop_column(table, "about", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
