"""sqla-queue: a retry does not revive a cancelled dependent whose unique key is held.

Retrying a workflow parent revives the dependents its failure cancelled (`job_ended`, as of
sqlaq_0014). A unique dependent whose key another job took meanwhile could not go back to
`waiting` without a second row for its key: the revival hit `ux_jobs_unique_key`, the whole
retry failed, and every try after it failed the same way (issue 33, defect 5).

`job_revived_unique` (BEFORE UPDATE, only on a unique row going from `cancelled` to
`waiting` inside another trigger, which is how a revival moves it) skips that row when
another job holds its key: it stays cancelled, and so do its own dependents (the revival
goes on from the jobs it did revive). It records `<id>:<holder>,` in the transaction's
`sqla_queue.not_revived` setting, which `admin.retry_jobs` reads and reports. A job retried
by name is not its business: `retry_jobs` leaves such a job alone itself.

Revision ID: sqlaq_0016
Revises: sqlaq_0015
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "sqlaq_0016"
down_revision: str | Sequence[str] | None = "sqlaq_0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
HOLDS_KEY = (
    "o.unique_key IS NOT NULL AND (o.unique_states & CASE o.status WHEN 'queued' THEN 1 "
    "WHEN 'running' THEN 2 WHEN 'done' THEN 4 WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 "
    "WHEN 'waiting' THEN 32 ELSE 0 END) <> 0"
)
"""`ux_jobs_unique_key`'s predicate over alias `o`, as of this revision."""

JOB_REVIVED_UNIQUE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_revived_unique() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    holder bigint;
BEGIN
    IF pg_trigger_depth() < 2 THEN
        RETURN NEW;  -- retried by name: retry_jobs checks the key itself
    END IF;
    SELECT min(o.id) INTO holder FROM {SCHEMA}.jobs o
    WHERE o.unique_key = NEW.unique_key AND o.id <> NEW.id AND {HOLDS_KEY};
    IF holder IS NULL THEN
        RETURN NEW;
    END IF;
    PERFORM set_config(
        'sqla_queue.not_revived',
        coalesce(current_setting('sqla_queue.not_revived', true), '') || NEW.id || ':'
            || holder || ',',
        true);
    RETURN NULL;  -- stays cancelled, and is not among the revived whose dependents follow
END
$$
"""

TRIGGER = f"""
CREATE TRIGGER job_revived_unique BEFORE UPDATE ON {SCHEMA}.jobs
    FOR EACH ROW WHEN (NEW.unique_key IS NOT NULL AND OLD.status = 'cancelled'
                       AND NEW.status = 'waiting')
    EXECUTE FUNCTION {SCHEMA}.job_revived_unique();
"""


def upgrade() -> None:
    op.execute(JOB_REVIVED_UNIQUE)
    op.execute(TRIGGER)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP TRIGGER job_revived_unique ON {SCHEMA}.jobs")
    op.execute(f"DROP FUNCTION {SCHEMA}.job_revived_unique()")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
