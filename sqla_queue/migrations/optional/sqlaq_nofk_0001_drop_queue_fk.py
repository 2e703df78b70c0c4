"""sqla-queue, optional: let jobs name queues that do not exist.

Opt-in, on its own branch ("sqla_queue_no_queue_fk") in its own folder, so that
`alembic upgrade heads` over the default versions folder never applies it. Apply it with
`sqla-queue migrate --drop-queue-fk`; revert it with `--restore-queue-fk`.

It drops what refuses a job of an unknown queue: since sqlaq_0031 the queue check's
triggers (`jobs_queue_known` and the three beside it), which take no lock; before it, the
foreign key from jobs.queue to queues.name, whose KEY SHARE lock on the queue's row made a
MultiXact of about every insert while producers enqueued into one queue at once (the
reason this branch was first made). Reverted, it restores the triggers (or, on a schema
before sqlaq_0031, the foreign key), refused while jobs name missing queues.

Revision ID: sqlaq_nofk_0001
Revises:
Depends on: sqlaq_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text

from alembic import op

revision: str = "sqlaq_nofk_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sqla_queue_no_queue_fk",)
depends_on: str | Sequence[str] | None = "sqlaq_0001"
migration_kind = "expand"

SCHEMA = "sqla_queue"
CONSTRAINT = "fk_jobs_queue_queues"


def _check() -> Any:
    """sqlaq_0031's module (the queue check, and the foreign key's restore)."""
    return importlib.import_module("sqla_queue.migrations.versions.sqlaq_0031_queue_check")


def _has_check() -> bool:
    """Whether the schema has the check's functions (sqlaq_0031 on); before it, the foreign
    key is what refuses an unknown queue."""
    if op.get_context().as_sql:
        return True
    found = op.get_bind().execute(
        text("SELECT to_regproc(:name) IS NOT NULL"), {"name": f"{SCHEMA}.jobs_queue_known"}
    )
    return bool(found.scalar())


def upgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS {CONSTRAINT}")
    if _has_check():
        _check().drop_check()


def downgrade() -> None:
    if _has_check():
        _check().restore_check()
    else:
        _check().restore_key()
