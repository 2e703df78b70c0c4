"""sqla-queue: durable steps, a job's recorded step results (`ctx.step`, `ctx.sleep`).

`job_steps` keeps one row per (job, step name): the step's JSON result once it finished
(`status = 'done'`), or the error of its last failed try (`status = 'failed'`), with the
attempt that wrote it, how many tries it took, and when it started and ended. A durable
sleep is a row of kind `sleep` whose result holds the time it ends (`until`).

No foreign key to `jobs`: the key-share lock an insert would take on the job's row, while
the worker updates that row (heartbeat, finish), mints a MultiXact per step. Instead a
statement-level AFTER DELETE trigger removes a job's steps in the statement that deletes
the job, whichever path does it (retention on success, prune, `jobs delete`, a bulk
delete, a queue's delete, the archive's move), reading the deleted ids from the
statement's transition table: one DELETE per statement, never one per row.

Revision ID: sqlaq_0018_steps
Revises: sqlaq_0017
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "sqlaq_0018_steps"
down_revision: str | Sequence[str] | None = "sqlaq_0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"

STEPS_GONE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_steps_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {SCHEMA}.job_steps s USING deleted_jobs d WHERE s.job_id = d.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_steps_gone AFTER DELETE ON {SCHEMA}.jobs
    REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.job_steps_gone();
"""


def upgrade() -> None:
    op.create_table(
        "job_steps",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), server_default=sa.text("'step'"), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("tries", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "finished_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("status IN ('done', 'failed')", name=op.f("ck_job_steps_status")),
        sa.CheckConstraint("kind IN ('step', 'sleep')", name=op.f("ck_job_steps_kind")),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_job_steps")),
        schema=SCHEMA,
    )
    op.execute(STEPS_GONE)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP TRIGGER IF EXISTS jobs_steps_gone ON {SCHEMA}.jobs")
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.job_steps_gone()")
    op.drop_table("job_steps", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
