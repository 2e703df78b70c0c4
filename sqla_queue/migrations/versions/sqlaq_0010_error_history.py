"""sqla-queue: every attempt's error, kept.

`jobs.errors` and `jobs_archive.errors` (jsonb, NULL until a job's first error) hold a job's
error history: one entry per attempt that ended without success (its handler raised or
timed out, or the reaper found it lost), each {attempt, worker, started_at, finished_at,
class, message, traceback}, at most 20 (the first and the latest 19). The statement that
retries or fails a job appends its entry (`sqla_queue.job.history`).

Every new column is NULL: adding it rewrites no row.

Revision ID: sqlaq_0010
Revises: sqlaq_0009
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "sqlaq_0010"
down_revision: str | Sequence[str] | None = "sqlaq_0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    for table in ("jobs", "jobs_archive"):
        op.add_column(table, sa.Column("errors", postgresql.JSONB()), schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    for table in ("jobs", "jobs_archive"):
        op.drop_column(table, "errors", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
