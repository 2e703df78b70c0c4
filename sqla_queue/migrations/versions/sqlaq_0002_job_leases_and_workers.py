"""sqla-queue: a lease deadline per job, a start marker, and the table of live workers.

Revision ID: sqlaq_0002
Revises: sqlaq_0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0002"
down_revision: str | Sequence[str] | None = "sqlaq_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "contract"  # old workers set no lease, which the reaper now reads

SCHEMA = "sqla_queue"
TZ = sa.DateTime(timezone=True)
RUNNING = sa.text("status = 'running'")
OLD_WORKER_LEASE = "60 seconds"
"""The lease every worker had before leases were per job (the worker's default)."""


def upgrade() -> None:
    # online first (sqla_queue.db.online): the columns, then the indexes, concurrently
    online.add_columns(
        "jobs",
        sa.Column("lease_expires_at", TZ, nullable=True),
        sa.Column("started_at", TZ, nullable=True),
    )
    online.create_index(
        "ix_jobs_lease_expires_at", "jobs", ["lease_expires_at"], postgresql_where=RUNNING
    )
    online.create_index("ix_jobs_locked_by", "jobs", ["locked_by"], postgresql_where=RUNNING)
    online.drop_index("ix_jobs_heartbeat")
    # Jobs running now keep the deadline the default worker lease gave them.
    op.execute(
        f"UPDATE {SCHEMA}.jobs SET lease_expires_at = "
        f"coalesce(heartbeat_at, locked_at, created_at) + interval '{OLD_WORKER_LEASE}', "
        "started_at = locked_at WHERE status = 'running'"
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("heartbeat_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workers"),
        schema=SCHEMA,
    )
    op.create_index("ix_workers_expires_at", "workers", ["expires_at"], schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_index("ix_workers_expires_at", table_name="workers", schema=SCHEMA)
    op.drop_table("workers", schema=SCHEMA)
    op.drop_index("ix_jobs_locked_by", table_name="jobs", schema=SCHEMA)
    op.drop_index("ix_jobs_lease_expires_at", table_name="jobs", schema=SCHEMA)
    op.create_index(
        "ix_jobs_heartbeat", "jobs", ["heartbeat_at"], schema=SCHEMA, postgresql_where=RUNNING
    )
    op.drop_column("jobs", "started_at", schema=SCHEMA)
    op.drop_column("jobs", "lease_expires_at", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
