"""sqla-queue: less work for the server in every claim and heartbeat.

A claim's UPDATE changes indexed columns (status, the lease), so every index whose
predicate the new row version matches gets an entry: the claim and every heartbeat pay
for each such index. Two of them were paid for by every job and used by almost none:

- `ix_jobs_tags` (GIN) indexed every row, the untagged ones too (an empty array is an
  entry of its own in a GIN index). It now covers tagged jobs only (`tags <> '{}'`); the
  tag filter of `jobs list` says so too, so the planner can use it (the dashboard's reads
  a bounded window by primary key and needs no index).
- `ix_jobs_locked_by` served the reaper's look-up of a dead worker's jobs, which reads
  running jobs only: `ix_jobs_lease_expires_at` (running jobs) already holds those few.

And PostgreSQL checks every CHECK constraint of a row on every UPDATE, whatever columns
it sets: `ck_jobs_args_size` (`octet_length(args::text)`) wrote each job's args out as
text on every claim, heartbeat and retry (about 6 µs per job for 1 kB of args). It is
now an AFTER trigger of the same name on INSERT and on UPDATE OF args only, whose WHEN
clause (the same test, evaluated without calling a function) lets a row through unless
it is too large; the error is the same (SQLSTATE 23514, constraint `ck_jobs_args_size`),
raised at the end of the statement. An AFTER trigger keeps COPY's batched inserts (a
BEFORE trigger would turn them off).

Workers report a blocked event loop in their registration (`workers.loop_blocked_since`,
NULL while the loop runs), so `doctor` can say which worker has an async handler calling
blocking code. A NULL column rewrites no row.

Measured on a private PostgreSQL 15 with stock settings (benchmarks/before_after.py, c=4,
batch 50, no-op jobs): without the two indexes the server's CPU per drained job fell from
45 to 43.5 µs (before the claim's own changes of the same release). 20,000 UPDATEs that
leave args alone, of rows with 1.2 kB of args: 158 ms without the size check, 275 ms with
the CHECK constraint.

Dropping an index and building a partial one over few rows are short, but the build reads
the whole table under a lock that blocks writes to it: on a very large jobs table, run
this revision when the queue is quiet.

Revision ID: sqlaq_0007
Revises: sqlaq_0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0007"
down_revision: str | Sequence[str] | None = "sqlaq_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
TAGGED = sa.text("tags <> '{}'::text[]")
RUNNING = sa.text("status = 'running'")
MAX_ARGS_BYTES = 1_000_000  # models.SCHEMA_MAX_ARGS_BYTES as of this revision
TOO_LARGE = f"octet_length(NEW.args::text) > {MAX_ARGS_BYTES}"

REFUSE_LARGE_ARGS = f"""
CREATE FUNCTION {SCHEMA}.refuse_large_args() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "ck_jobs_args_size"'
        USING ERRCODE = 'check_violation', SCHEMA = '{SCHEMA}', TABLE = 'jobs',
              CONSTRAINT = 'ck_jobs_args_size',
              DETAIL = format('args are %s bytes as jsonb text, more than {MAX_ARGS_BYTES}',
                              octet_length(NEW.args::text));
END
$$
"""
ARGS_SIZE_TRIGGER = f"""
CREATE TRIGGER ck_jobs_args_size AFTER INSERT OR UPDATE OF args ON {SCHEMA}.jobs
FOR EACH ROW WHEN ({TOO_LARGE}) EXECUTE FUNCTION {SCHEMA}.refuse_large_args()
"""


def upgrade() -> None:
    # online first (sqla_queue.db.online): the partial index built beside the full one
    online.drop_index("ix_jobs_locked_by")
    online.build_replacement("ix_jobs_tags", "jobs", ["tags"], postgresql_using="gin",
                             postgresql_where=TAGGED)  # fmt: skip
    op.add_column(
        "workers", sa.Column("loop_blocked_since", sa.DateTime(timezone=True)), schema=SCHEMA
    )
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT ck_jobs_args_size")
    op.execute(REFUSE_LARGE_ARGS)
    op.execute(ARGS_SIZE_TRIGGER)
    online.swap_index("ix_jobs_tags")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP TRIGGER ck_jobs_args_size ON {SCHEMA}.jobs")
    op.execute(f"DROP FUNCTION {SCHEMA}.refuse_large_args()")
    op.execute(
        f"ALTER TABLE {SCHEMA}.jobs ADD CONSTRAINT ck_jobs_args_size "
        f"CHECK (octet_length(args::text) <= {MAX_ARGS_BYTES})"
    )
    op.drop_index("ix_jobs_tags", table_name="jobs", schema=SCHEMA)
    op.create_index("ix_jobs_tags", "jobs", ["tags"], schema=SCHEMA, postgresql_using="gin")
    op.create_index(
        "ix_jobs_locked_by", "jobs", ["locked_by"], schema=SCHEMA, postgresql_where=RUNNING
    )
    op.drop_column("workers", "loop_blocked_since", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
