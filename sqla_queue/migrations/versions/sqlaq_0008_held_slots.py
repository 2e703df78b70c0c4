"""sqla-queue: a handler that has not returned keeps its queue's slot.

A sync handler cannot be interrupted. When its job is cancelled while it runs, the row is
`cancelled` at once, but the handler goes on until it returns: until then it still takes
one of its queue's concurrency slots. `cancel_jobs` now keeps such a row's lease (the
worker holding it goes on extending it, and clears it once the handler has returned), and
`sqla_queue.claim_slots` counts a cancelled job whose lease is still live and whose worker
is still registered as running. A partial index holds those few rows.

(A timed-out sync handler needs no schema: its row stays `running` until it returns.)

Workers report handlers that overran their timeout or their cancel in their registration
(`workers.overruns`, jsonb, NULL when there is none), for `doctor` and the metrics.

Every new column is NULL: adding it rewrites no row.

Revision ID: sqlaq_0008
Revises: sqlaq_0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0008"
down_revision: str | Sequence[str] | None = "sqlaq_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
LOCK_SPACE = 1936814449  # the advisory lock namespace ('sqlq' as an int4), keyed by queue
CANCELLED_HELD = sa.text("status = 'cancelled' AND lease_expires_at IS NOT NULL")

CLAIM_SLOTS = """
CREATE OR REPLACE FUNCTION {schema}.claim_slots(
    queue_name text, max_running integer, rate_limit integer, rate_window double precision,
    finishing_ids bigint[], finishing_attempts integer[]
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    slots integer := 2147483647;
    used integer;
BEGIN
    PERFORM pg_advisory_xact_lock({lock_space}, hashtext(queue_name));
    IF max_running IS NOT NULL THEN
        -- the jobs this same statement finishes (id and attempt) no longer hold a slot
        SELECT count(*) INTO used FROM {schema}.jobs j
        WHERE j.status = 'running' AND j.queue = queue_name
          AND NOT EXISTS (
              SELECT 1 FROM unnest(finishing_ids, finishing_attempts) AS f(id, attempt)
              WHERE f.id = j.id AND f.attempt = j.attempts);
        {held}
        slots := greatest(max_running - used, 0);
    END IF;
    IF rate_limit IS NOT NULL THEN
        DELETE FROM {schema}.queue_starts s WHERE s.queue = queue_name
          AND s.started_at <= clock_timestamp() - make_interval(secs => rate_window);
        SELECT coalesce(sum(s.jobs), 0) INTO used FROM {schema}.queue_starts s
        WHERE s.queue = queue_name;
        slots := least(slots, greatest(rate_limit - used, 0));
    END IF;
    RETURN slots;
END
$$
"""
# a cancelled job whose handler still runs on a live worker holds its slot too
HELD = f"""used := used + (SELECT count(*) FROM {SCHEMA}.jobs j
            WHERE j.status = 'cancelled' AND j.lease_expires_at IS NOT NULL
              AND j.queue = queue_name AND j.lease_expires_at > clock_timestamp()
              AND EXISTS (SELECT 1 FROM {SCHEMA}.workers w
                          WHERE w.id = j.locked_by AND w.expires_at >= clock_timestamp()));"""


def upgrade() -> None:
    online.create_index(
        "ix_jobs_cancelled_held", "jobs", ["queue"], postgresql_where=CANCELLED_HELD
    )
    op.add_column("workers", sa.Column("overruns", postgresql.JSONB()), schema=SCHEMA)
    op.execute(CLAIM_SLOTS.format(schema=SCHEMA, lock_space=LOCK_SPACE, held=HELD))
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(CLAIM_SLOTS.format(schema=SCHEMA, lock_space=LOCK_SPACE, held=""))
    op.drop_index("ix_jobs_cancelled_held", table_name="jobs", schema=SCHEMA)
    op.drop_column("workers", "overruns", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
