"""sqla-queue: the HTTP API's idempotency keys, shared by every dashboard process.

- `api_idempotency`: per token digest and `Idempotency-Key`, the request's digest and the
  answer it got (NULL while it is being answered), and when the row expires. A retried
  action that reaches another process of a fleet behind a load balancer replays the first
  answer instead of acting again. Rows past `expires_at` count as gone and are deleted, a
  bounded batch at a time, as the API takes new keys (`ix_api_idempotency_expires_at`).

One new small table: nothing is rewritten, no lock on a hot table. Only the dashboard
writes it (a worker's role needs nothing on it).

Revision ID: sqlaq_0025_api_idempotency
Revises: sqlaq_0024_sleep_parked
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0025_api_idempotency"
down_revision: str | Sequence[str] | None = "sqlaq_0024_sleep_parked"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind: online.MigrationKind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    op.create_table(
        "api_idempotency",
        sa.Column("caller", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("request", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("caller", "key", name=op.f("pk_api_idempotency")),
        schema=SCHEMA,
    )
    op.create_index(
        op.f("ix_api_idempotency_expires_at"),
        "api_idempotency",
        ["expires_at"],
        schema=SCHEMA,
    )
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_table("api_idempotency", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
