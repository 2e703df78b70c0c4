"""sqla-queue: a start deadline for jobs, `expires_at`.

`jobs.expires_at` (NULL: no deadline): a job not started by then is never run. The claim
checks it on the rows it has just locked (a job past it is marked `cancelled` with the
reason "expired" instead of running), so the plain claim reads no more rows and no index
is needed; `enqueue(..., expires_in=...)` or `expires_at=` set it. Adding a nullable
column without a default rewrites nothing.

Revision ID: sqlaq_0020_expires
Revises: sqlaq_0017
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0020_expires"
down_revision: str | Sequence[str] | None = "sqlaq_0019_signals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    online.add_columns("jobs", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP COLUMN expires_at")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
