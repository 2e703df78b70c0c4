"""sqla-queue: tags (a text array, GIN-indexed) and meta (a JSON object) on jobs and the archive.

Both columns have a constant default, so adding them rewrites no row. Building the GIN
index reads the whole jobs table once, holding off writers meanwhile: upgrade when the
table is small (after a prune) if it is large.

Revision ID: sqlaq_0005
Revises: sqlaq_0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "sqlaq_0005"
down_revision: str | Sequence[str] | None = "sqlaq_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "sqla_queue"
NO_TAGS = sa.text("'{}'::text[]")
NO_META = sa.text("'{}'::jsonb")


def upgrade() -> None:
    for table in ("jobs", "jobs_archive"):
        op.add_column(
            table,
            sa.Column("tags", postgresql.ARRAY(sa.Text()), server_default=NO_TAGS, nullable=False),
            schema=SCHEMA,
        )
        op.add_column(
            table,
            sa.Column("meta", postgresql.JSONB(), server_default=NO_META, nullable=False),
            schema=SCHEMA,
        )
    op.execute(
        f"ALTER TABLE {SCHEMA}.jobs ADD CONSTRAINT ck_jobs_meta_object "
        "CHECK (jsonb_typeof(meta) = 'object')"
    )
    op.create_index("ix_jobs_tags", "jobs", ["tags"], schema=SCHEMA, postgresql_using="gin")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_index("ix_jobs_tags", table_name="jobs", schema=SCHEMA)
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS ck_jobs_meta_object")
    for table in ("jobs", "jobs_archive"):
        op.drop_column(table, "meta", schema=SCHEMA)
        op.drop_column(table, "tags", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
