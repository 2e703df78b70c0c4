"""sqla-queue: the queues, jobs and jobs_archive tables and the default queue.

Revision ID: sqlaq_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "sqlaq_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sqla_queue",)
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
TZ = sa.DateTime(timezone=True)

# The essay's advice: vacuum the jobs table on a fixed schedule of its own, not as a
# fraction of its size, so a busy table is vacuumed often whatever else the database holds.
JOBS_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "1000",
    "fillfactor": "90",
}


def upgrade() -> None:
    op.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    op.create_table(
        "queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("retention", sa.Text(), server_default=sa.text("'delete'"), nullable=False),
        sa.Column("created_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "retention IN ('delete', 'keep', 'archive')", name="ck_queues_retention"
        ),
        sa.PrimaryKeyConstraint("name", name="pk_queues"),
        schema=SCHEMA,
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), server_default=sa.text("'default'"), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column(
            "args",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("status", sa.Text(), server_default=sa.text("'queued'"), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("run_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("locked_at", TZ, nullable=True),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("heartbeat_at", TZ, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed', 'cancelled')",
            name="ck_jobs_status",
        ),
        sa.CheckConstraint("max_attempts IS NULL OR max_attempts > 0", name="ck_jobs_max_attempts"),
        sa.ForeignKeyConstraint(
            ["queue"],
            [f"{SCHEMA}.queues.name"],
            name="fk_jobs_queue_queues",
            onupdate="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        schema=SCHEMA,
    )
    settings = ", ".join(f"{key} = {value}" for key, value in JOBS_STORAGE.items())
    op.execute(f"ALTER TABLE {SCHEMA}.jobs SET ({settings})")
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["queue", "priority", "run_at", "id"],
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "ix_jobs_claim_any_queue",
        "jobs",
        ["priority", "run_at", "id"],
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "ix_jobs_heartbeat",
        "jobs",
        ["heartbeat_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "ix_jobs_finished",
        "jobs",
        ["finished_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("status IN ('done', 'failed', 'cancelled')"),
    )
    op.create_table(
        "jobs_archive",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("args", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("run_at", TZ, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("locked_at", TZ, nullable=True),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("heartbeat_at", TZ, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs_archive"),
        schema=SCHEMA,
    )
    op.create_index("ix_jobs_archive_finished_at", "jobs_archive", ["finished_at"], schema=SCHEMA)
    op.execute(f"INSERT INTO {SCHEMA}.queues (name) VALUES ('default')")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_table("jobs_archive", schema=SCHEMA)
    op.drop_table("jobs", schema=SCHEMA)
    op.drop_table("queues", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS NULL")
    # Our version table may still be in the schema: whoever keeps it there drops the schema.
    op.execute(
        f"DO $$ BEGIN DROP SCHEMA {SCHEMA}; "
        "EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END $$"
    )
