"""sqla-queue: a worker's database session, by which the autoscaling signal tells a live
worker from a killed one at once.

- `workers.session_pid` (integer, NULL): the server process id (`pg_backend_pid()`) of the
  connection the worker holds open for as long as it runs (its LISTEN connection),
  written at each of its heartbeats; NULL when it holds none (`poll_only`, as behind
  PgBouncer's transaction pooling), while that connection is reconnecting, and for a
  worker of an earlier release. A worker killed with SIGKILL loses its connections, the
  server ends their backends, and the autoscaling signal (`sqla_queue.db.scaling`) stops
  counting a registration whose session is gone from `pg_stat_activity` at its next read,
  instead of when the registration expires (`dead_after`). A NULL keeps the expiry rule.

One NULL column on a small table: nothing is rewritten, and the only lock is the workers
table's, for a moment, under `lock_timeout`. Code built for sqlaq_0026 runs on it
unchanged (expand): it never writes the column, and its workers are judged by expiry.

Revision ID: sqlaq_0029_ops
Revises: sqlaq_0026_feature_tax
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0029_ops"
down_revision: str | Sequence[str] | None = "sqlaq_0026_feature_tax"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind: online.MigrationKind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    online.add_columns("workers", sa.Column("session_pid", sa.Integer()))
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_column("workers", "session_pid", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
