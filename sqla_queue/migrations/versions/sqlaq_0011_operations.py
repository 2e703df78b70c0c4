"""sqla-queue: what operating the queue reads without scanning the jobs table.

- `job_counts`: jobs finished per minute, per queue and task (succeeded, failed, retried,
  the handlers' run seconds), added by each worker about once a minute and pruned after a
  day: the dashboard's charts and `stats` read a few hundred rows of it, whatever the jobs
  table holds.
- `stopped_workers`: workers that stopped, gracefully (they deregistered) or lost (their
  registration expired and a reaper took their jobs back), kept for a day.

Two new small tables; no existing row is touched.

Revision ID: sqlaq_0011
Revises: sqlaq_0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "sqlaq_0011"
down_revision: str | Sequence[str] | None = "sqlaq_0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    op.create_table(
        "job_counts",
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("succeeded", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("failed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("retried", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("run_seconds", sa.Float(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("minute", "queue", "task", name="pk_job_counts"),
        schema=SCHEMA,
    )
    op.create_table(
        "stopped_workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text())),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "stopped_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("how", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_stopped_workers"),
        sa.CheckConstraint("how IN ('graceful', 'lost')", name="ck_stopped_workers_how"),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_stopped_workers_stopped_at", "stopped_workers", ["stopped_at"], schema=SCHEMA
    )
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_table("stopped_workers", schema=SCHEMA)
    op.drop_table("job_counts", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
