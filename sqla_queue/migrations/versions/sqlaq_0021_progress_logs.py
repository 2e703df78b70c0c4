"""sqla-queue: a job's progress and its handler's log lines, kept beside the job.

`job_progress`: one row per job, the latest `ctx.progress(fraction, message)` of its latest
attempt. `job_logs`: one row per attempt that logged, its lines as a JSON array (capped per
attempt and per line by the worker). Neither is a column of `jobs`: a progress write (at most
one a second per job) updates a small row of its own, never the hot job row, and neither
table has a foreign key to `jobs` (a key share lock on the job row per write would make
MultiXacts on the row the worker updates). Rows go with their job: a statement-level
trigger on `jobs` deletes them for every job a statement deletes (retention on completion,
prune, delete, archive), whichever path deletes it.

Revision ID: sqlaq_0021_progress_logs
Revises: sqlaq_0020_expires
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision: str = "sqlaq_0021_progress_logs"
down_revision: str | Sequence[str] | None = "sqlaq_0020_expires"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"

JOURNAL_GONE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_journal_gone() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM {SCHEMA}.job_progress p USING gone g WHERE p.job_id = g.id;
    DELETE FROM {SCHEMA}.job_logs l USING gone g WHERE l.job_id = g.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER job_journal_gone AFTER DELETE ON {SCHEMA}.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.job_journal_gone();
"""


def upgrade() -> None:
    op.create_table(
        "job_progress",
        sa.Column("job_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("fraction", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("fraction >= 0 AND fraction <= 1", name="fraction"),
        schema=SCHEMA,
    )
    op.create_table(
        "job_logs",
        sa.Column("job_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("attempt", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("lines", JSONB(), nullable=False),
        sa.Column("dropped", sa.Integer(), server_default=sa.text("0"), nullable=False),
        schema=SCHEMA,
    )
    op.execute(JOURNAL_GONE)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP TRIGGER job_journal_gone ON {SCHEMA}.jobs")
    op.execute(f"DROP FUNCTION {SCHEMA}.job_journal_gone()")
    op.drop_table("job_logs", schema=SCHEMA)
    op.drop_table("job_progress", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
