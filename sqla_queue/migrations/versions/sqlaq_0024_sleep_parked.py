"""sqla-queue: a durable sleep is parked, as a signal wait is.

A job in `ctx.sleep` was `queued` with `run_at` days ahead, so it sat in the claim's
indexes (`ix_jobs_claim_any_queue`, `ix_jobs_claim`), and 100,000 sleeping jobs slowed
every claim (PostgreSQL filters `run_at <= now()` in those indexes rather than bounding
them). From this revision a sleep parks its job in `waiting` with neither a signal key nor
jobs to wait for (`signal_key` and `deps_left` NULL: `SLEEPS`), `run_at` the sleep's end;
a worker's keeper queues it as the end comes. `ix_jobs_sleep_end` holds only such jobs, so
the keeper's look costs what the due ones cost, however many sleep.

An index built concurrently: no lock on the jobs table but for a moment. Its downgrade
queues the parked sleepers again, due at their end (the earlier code's form of a sleep).

Revision ID: sqlaq_0024_sleep_parked
Revises: sqlaq_0022_fleet_versions
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0024_sleep_parked"
down_revision: str | Sequence[str] | None = "sqlaq_0022_fleet_versions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind: online.MigrationKind = "expand"

SCHEMA = "sqla_queue"
SLEEPS = "status = 'waiting' AND signal_key IS NULL AND deps_left IS NULL"


def upgrade() -> None:
    online.create_index("ix_jobs_sleep_end", "jobs", ["run_at"], postgresql_where=sa.text(SLEEPS))
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    # the earlier code wakes no parked sleeper: each is queued, due at its sleep's end
    op.execute(f"UPDATE {SCHEMA}.jobs SET status = 'queued' WHERE {SLEEPS}")
    online.drop_index("ix_jobs_sleep_end")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
