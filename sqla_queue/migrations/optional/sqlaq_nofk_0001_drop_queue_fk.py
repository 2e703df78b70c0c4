"""sqla-queue, optional: drop the foreign key from jobs.queue to queues.name.

Opt-in, on its own branch ("sqla_queue_no_queue_fk") in its own folder, so that
`alembic upgrade heads` over the default versions folder never applies it. Apply it with
`sqla-queue migrate --drop-queue-fk`; revert it with `--restore-queue-fk`.

Why: every insert into jobs takes a KEY SHARE lock on its queue's row, and concurrent
enqueuers into one queue share that lock through a MultiXact (about one per insert).

Revision ID: sqlaq_nofk_0001
Revises:
Depends on: sqlaq_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqla_queue.db import queries
from sqla_queue.errors import OrphanJobsError

revision: str = "sqlaq_nofk_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sqla_queue_no_queue_fk",)
depends_on: str | Sequence[str] | None = "sqlaq_0001"
migration_kind = "expand"

SCHEMA = "sqla_queue"
CONSTRAINT = "fk_jobs_queue_queues"


def upgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS {CONSTRAINT}")


def downgrade() -> None:
    # The lock ADD FOREIGN KEY takes anyway, taken first: no orphan can appear after the check.
    op.execute(f"LOCK TABLE {SCHEMA}.jobs IN SHARE ROW EXCLUSIVE MODE")
    if not op.get_context().as_sql:
        orphans = op.get_bind().execute(queries.orphan_queues()).all()
        if orphans:
            listed = ", ".join(f"{queue!r}: {count} job(s)" for queue, count in orphans)
            raise OrphanJobsError(orphans=listed)
    op.create_foreign_key(
        CONSTRAINT,
        "jobs",
        "queues",
        ["queue"],
        ["name"],
        source_schema=SCHEMA,
        referent_schema=SCHEMA,
        onupdate="CASCADE",
    )
