"""sqla-queue: per-queue concurrency and rate limits, and stored results.

Queues get `concurrency` (at most that many of its jobs `running` at once, across all
workers), `rate_limit` jobs per `rate_window` seconds (at most that many starts in any
window of that length), and `result_ttl` (seconds a kept result of a job in a queue that
deletes its jobs stays readable; `ix_jobs_kept_results` finds those that expired).
`queue_starts` records the starts of rate-limited queues
(one row per claim, pruned as windows pass). Jobs and the archive get `result` (jsonb).

`sqla_queue.claim_slots` is what the claim statement calls once per limited queue that has
a due job: it takes an advisory transaction lock of that queue only (held to the claim's
commit, so claims of the same limited queue take turns and claims of other queues never
wait), then counts with a fresh snapshot (a VOLATILE function's queries see what other
claims committed while it waited for the lock), and returns how many jobs may start now.

Every new column is NULL or has a constant default: adding them rewrites no row.

Revision ID: sqlaq_0006
Revises: sqlaq_0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0006"
down_revision: str | Sequence[str] | None = "sqlaq_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
LOCK_SPACE = 1936814449  # the advisory lock namespace ('sqlq' as an int4), keyed by queue

CLAIM_SLOTS = f"""
CREATE FUNCTION {SCHEMA}.claim_slots(
    queue_name text, max_running integer, rate_limit integer, rate_window double precision,
    finishing_ids bigint[], finishing_attempts integer[]
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    slots integer := 2147483647;
    used integer;
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_SPACE}, hashtext(queue_name));
    IF max_running IS NOT NULL THEN
        -- the jobs this same statement finishes (id and attempt) no longer hold a slot
        SELECT count(*) INTO used FROM {SCHEMA}.jobs j
        WHERE j.status = 'running' AND j.queue = queue_name
          AND NOT EXISTS (
              SELECT 1 FROM unnest(finishing_ids, finishing_attempts) AS f(id, attempt)
              WHERE f.id = j.id AND f.attempt = j.attempts);
        slots := greatest(max_running - used, 0);
    END IF;
    IF rate_limit IS NOT NULL THEN
        DELETE FROM {SCHEMA}.queue_starts s WHERE s.queue = queue_name
          AND s.started_at <= clock_timestamp() - make_interval(secs => rate_window);
        SELECT coalesce(sum(s.jobs), 0) INTO used FROM {SCHEMA}.queue_starts s
        WHERE s.queue = queue_name;
        slots := least(slots, greatest(rate_limit - used, 0));
    END IF;
    RETURN slots;
END
$$
"""


def upgrade() -> None:
    # online first (sqla_queue.db.online), then the small tables in the transaction
    for table in ("jobs", "jobs_archive"):
        online.add_columns(table, sa.Column("result", postgresql.JSONB(), nullable=True))
    online.create_index(
        "ix_jobs_kept_results",
        "jobs",
        ["finished_at"],
        postgresql_where=sa.text("status = 'done' AND result IS NOT NULL"),
    )
    op.add_column("queues", sa.Column("concurrency", sa.Integer(), nullable=True), schema=SCHEMA)
    op.add_column("queues", sa.Column("rate_limit", sa.Integer(), nullable=True), schema=SCHEMA)
    op.add_column("queues", sa.Column("rate_window", sa.Float(), nullable=True), schema=SCHEMA)
    op.add_column(
        "queues",
        sa.Column("result_ttl", sa.Float(), server_default=sa.text("86400"), nullable=False),
        schema=SCHEMA,
    )
    op.create_check_constraint(
        op.f("ck_queues_concurrency"), "queues", "concurrency > 0", schema=SCHEMA
    )
    op.create_check_constraint(
        op.f("ck_queues_rate"),
        "queues",
        "(rate_limit IS NULL) = (rate_window IS NULL) AND rate_limit > 0 AND rate_window > 0",
        schema=SCHEMA,
    )
    op.create_check_constraint(
        op.f("ck_queues_result_ttl"), "queues", "result_ttl >= 0", schema=SCHEMA
    )
    op.create_table(
        "queue_starts",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["queue"],
            [f"{SCHEMA}.queues.name"],
            name=op.f("fk_queue_starts_queue_queues"),
            onupdate="CASCADE",
            ondelete="CASCADE",
        ),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_queue_starts_queue_started_at", "queue_starts", ["queue", "started_at"], schema=SCHEMA
    )
    op.execute(CLAIM_SLOTS)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SCHEMA}.claim_slots")
    op.drop_table("queue_starts", schema=SCHEMA)
    op.drop_index("ix_jobs_kept_results", table_name="jobs", schema=SCHEMA)
    for table in ("jobs", "jobs_archive"):
        op.drop_column(table, "result", schema=SCHEMA)
    for name in ("ck_queues_result_ttl", "ck_queues_rate", "ck_queues_concurrency"):
        op.drop_constraint(name, "queues", schema=SCHEMA)
    for column in ("result_ttl", "rate_window", "rate_limit", "concurrency"):
        op.drop_column("queues", column, schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
