"""sqla-queue: one journal trigger on `jobs` DELETE, which a plain job passes at once; the
args-size check without writing small args out as text.

A job's steps (`job_steps`, sqlaq_0018), progress (`job_progress`) and log lines
(`job_logs`, sqlaq_0021) go with the job in the statement that deletes it. Two statement
triggers did it, `jobs_steps_gone` and `job_journal_gone`: two PL/pgSQL calls and three
`DELETE ... USING` joins per DELETE of `jobs`, paid by every job a retention-delete queue
finishes, whatever it used. Now one trigger, `job_journal_gone`, does all three, and
skips each table that holds no row at all (the plain path: a deployment whose handlers
record no step, report no progress and log nothing reads three empty tables and returns).

`ck_jobs_args_size` (sqlaq_0007) wrote every inserted job's args out as text to measure
them (`octet_length(args::text)`, in the trigger's WHEN): 1.9 µs of the server's CPU per
row of a COPY (benchmarks/feature_tax.py). Its WHEN now first asks the stored datum's size
(`pg_column_size`, no conversion) and writes the args out only when it is over
`SMALL_ARGS` bytes. The bound is safe: jsonb's text is at most 6 bytes per byte of its
binary form (a control character, 1 byte, is `\\u0001` in text), and PostgreSQL's
compression (pglz, lz4) shrinks a value at most about 255 times, so args of more than
1,000,000 bytes of text are more than 650 bytes stored, however they compress. The error
and its SQLSTATE are unchanged.

Rows are deleted as before, in the deleting statement, whichever path deletes the job
(retention on success, prune, `jobs delete`, a bulk delete, a queue's delete, the
archive's move). One trigger replaced by a function of the same name: no table is
rewritten; dropping `jobs_steps_gone` takes a moment's lock on `jobs`, under
`lock_timeout`. Code built for sqlaq_0022 runs on it unchanged (expand).

Revision ID: sqlaq_0026_feature_tax
Revises: sqlaq_0025_api_idempotency
Create Date: 2026-12-06
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0026_feature_tax"
down_revision: str | Sequence[str] | None = "sqlaq_0025_api_idempotency"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind: online.MigrationKind = "expand"

SCHEMA = "sqla_queue"
MAX_ARGS_BYTES = 1_000_000  # models.SCHEMA_MAX_ARGS_BYTES as of this revision
SMALL_ARGS = 256
"""Stored args of at most this many bytes are far under MAX_ARGS_BYTES as text (see above)."""

ARGS_SIZE_TRIGGER = f"""
CREATE TRIGGER ck_jobs_args_size AFTER INSERT OR UPDATE OF args ON {SCHEMA}.jobs
FOR EACH ROW WHEN (pg_column_size(NEW.args) > {SMALL_ARGS}
                   AND octet_length(NEW.args::text) > {MAX_ARGS_BYTES})
EXECUTE FUNCTION {SCHEMA}.refuse_large_args()
"""

JOURNAL_GONE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_journal_gone() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- a table with no row has nothing of these jobs: one read of its first page, no join
    IF EXISTS (SELECT FROM {SCHEMA}.job_steps) THEN
        DELETE FROM {SCHEMA}.job_steps s USING gone g WHERE s.job_id = g.id;
    END IF;
    IF EXISTS (SELECT FROM {SCHEMA}.job_progress) THEN
        DELETE FROM {SCHEMA}.job_progress p USING gone g WHERE p.job_id = g.id;
    END IF;
    IF EXISTS (SELECT FROM {SCHEMA}.job_logs) THEN
        DELETE FROM {SCHEMA}.job_logs l USING gone g WHERE l.job_id = g.id;
    END IF;
    RETURN NULL;
END
$$;
"""
"""The one journal trigger's function (its trigger, `job_journal_gone`, is sqlaq_0021's)."""


def upgrade() -> None:
    op.execute(JOURNAL_GONE)
    op.execute(f"DROP TRIGGER IF EXISTS jobs_steps_gone ON {SCHEMA}.jobs")
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.job_steps_gone()")
    op.execute(f"DROP TRIGGER IF EXISTS ck_jobs_args_size ON {SCHEMA}.jobs")
    op.execute(ARGS_SIZE_TRIGGER)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    lean = importlib.import_module("sqla_queue.migrations.versions.sqlaq_0007_lean_claim_indexes")
    op.execute(f"DROP TRIGGER ck_jobs_args_size ON {SCHEMA}.jobs")
    op.execute(lean.ARGS_SIZE_TRIGGER)
    steps = importlib.import_module("sqla_queue.migrations.versions.sqlaq_0018_steps")
    journal = importlib.import_module("sqla_queue.migrations.versions.sqlaq_0021_progress_logs")
    op.execute(steps.STEPS_GONE)
    # 0021's text creates the function and its trigger: the trigger is still there
    op.execute(journal.JOURNAL_GONE.split("CREATE TRIGGER")[0])
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
