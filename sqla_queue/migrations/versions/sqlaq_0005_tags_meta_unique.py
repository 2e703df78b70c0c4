"""sqla-queue: tags and meta on jobs, unique jobs, and the slots periodic jobs were enqueued for.

Tags (a text array, GIN-indexed) and meta (a JSON object) on jobs and the archive. Unique
jobs: a key (a SHA-256 hash) and the statuses in which a job blocks its duplicates, held by
a unique partial index. `periodic_slots`: one row per (task, slot) a periodic job was
enqueued for, whose primary key lets every worker try and exactly one succeed.

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
from sqla_queue.db import online

revision: str = "sqlaq_0005"
down_revision: str | Sequence[str] | None = "sqlaq_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
NO_TAGS = sa.text("'{}'::text[]")
NO_META = sa.text("'{}'::jsonb")
UNIQUE_PREDICATE = (
    "unique_key IS NOT NULL AND (unique_states & CASE status WHEN 'queued' THEN 1 "
    "WHEN 'running' THEN 2 WHEN 'done' THEN 4 WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 "
    "ELSE 0 END) <> 0"
)
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    # online first (sqla_queue.db.online): constant defaults rewrite no row
    for table in ("jobs", "jobs_archive"):
        online.add_columns(
            table,
            sa.Column("tags", postgresql.ARRAY(sa.Text()), server_default=NO_TAGS, nullable=False),
            sa.Column("meta", postgresql.JSONB(), server_default=NO_META, nullable=False),
        )
    online.add_check("jobs", "ck_jobs_meta_object", "jsonb_typeof(meta) = 'object'")
    online.create_index("ix_jobs_tags", "jobs", ["tags"], postgresql_using="gin")
    online.add_columns(
        "jobs",
        sa.Column("unique_key", sa.LargeBinary(), nullable=True),
        sa.Column("unique_states", sa.SmallInteger(), nullable=True),
    )
    online.create_index(
        "ux_jobs_unique_key",
        "jobs",
        ["unique_key"],
        unique=True,
        postgresql_where=sa.text(UNIQUE_PREDICATE),
    )
    op.create_table(
        "periodic_slots",
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("slot", TZ, nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("enqueued_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("task", "slot", name="pk_periodic_slots"),
        schema=SCHEMA,
    )
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_table("periodic_slots", schema=SCHEMA)
    op.drop_index("ux_jobs_unique_key", table_name="jobs", schema=SCHEMA)
    op.drop_column("jobs", "unique_states", schema=SCHEMA)
    op.drop_column("jobs", "unique_key", schema=SCHEMA)
    op.drop_index("ix_jobs_tags", table_name="jobs", schema=SCHEMA)
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS ck_jobs_meta_object")
    for table in ("jobs", "jobs_archive"):
        op.drop_column(table, "meta", schema=SCHEMA)
        op.drop_column(table, "tags", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
