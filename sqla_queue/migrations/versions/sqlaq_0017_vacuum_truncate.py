"""sqla-queue: no VACUUM of the jobs table truncates it on the hot path.

`vacuum_truncate = false` on `sqla_queue.jobs`: neither autovacuum nor a plain VACUUM gives
the empty pages at the table's end back to the operating system. That step takes an ACCESS
EXCLUSIVE lock, which blocks every claim while it is held, and it retries for up to 5 s to
get it while the VACUUM keeps holding its own lock, so anything that waits for that one
(an ANALYZE) waits too: the 5-second claim stalls of issue 40. A queue's table refills the
pages at once; `doctor` (the jobs_truncatable check) names the space a truncation could
give back and the command that does it at a quiet moment (`VACUUM (TRUNCATE true)
sqla_queue.jobs`). A storage parameter: nothing is rewritten.

Revision ID: sqlaq_0017
Revises: sqlaq_0016
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "sqlaq_0017"
down_revision: str | Sequence[str] | None = "sqlaq_0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.jobs SET (vacuum_truncate = false)")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.jobs RESET (vacuum_truncate)")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
