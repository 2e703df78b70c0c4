"""sqla-queue: the jobs -> queues foreign key replaced by triggers that take no lock on the
queue's row (issue 39, the feature tax).

The foreign key `fk_jobs_queue_queues` made every inserted job look its queue up and take
a `FOR KEY SHARE` lock on the queue's row. Producers enqueuing into one queue at once share
that lock through a MultiXact, about one per job (8,775 per 10,000 jobs from 8 producers in
`benchmarks/`), the essay's MultiXact failure mode by default; and it was the largest part
of what a plain job's COPY costs over a minimal table (+3.6 of 8.8 µs of the server's CPU
per row, benchmarks/feature_tax.py).

What it protected is kept, by triggers that read the queues table without locking it:

- `jobs_queue_known`, AFTER INSERT FOR EACH STATEMENT on jobs (the statement's new rows as
  a transition table): a job naming a queue that does not exist is refused, once per
  statement whatever its size, with the foreign key's own error (SQLSTATE 23503, constraint
  `fk_jobs_queue_queues`, "Key (queue)=(...) is not present"), so every release's
  `UnknownQueueError` and anyone's handling of the SQLSTATE reads it unchanged;
- `job_queue_known`, AFTER UPDATE OF queue on jobs, for a row whose queue changes;
- `queue_in_use`, BEFORE DELETE on queues: a queue that jobs still name is not deleted
  (`sqla-queue queues delete` deletes its finished jobs first, as before);
- `queue_renamed`, AFTER UPDATE OF name on queues: its jobs follow (the foreign key's
  ON UPDATE CASCADE).

One difference, and why it is taken: a queue deleted while another transaction enqueues
into it, both uncommitted, can leave that job naming a missing queue (the lock the foreign
key took is what closed this; it is the lock this revision removes). Such a job runs as a
job of an unknown queue does after `migrate --drop-queue-fk`, and `doctor` names it
(`queue_foreign_key`, "jobs name queues that do not exist").

A database that dropped the foreign key (`sqla-queue migrate --drop-queue-fk`, the opt-in
branch) lets jobs name unknown queues on purpose: it gets the functions but not the
triggers, and stays so. `--restore-queue-fk` then creates the triggers (`restore_check`).

Dropping the constraint takes a moment's lock on both tables, under `lock_timeout`; no
table is rewritten or scanned. Code built for earlier revisions runs on it unchanged: they
read the same error (expand).

Revision ID: sqlaq_0031_queue_check
Revises: sqlaq_0030_history
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqla_queue.db import online, queries
from sqla_queue.errors import OrphanJobsError

revision: str = "sqlaq_0031_queue_check"
down_revision: str | Sequence[str] | None = "sqlaq_0030_history"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind: online.MigrationKind = "expand"

SCHEMA = "sqla_queue"
CONSTRAINT = "fk_jobs_queue_queues"
"""The foreign key this revision drops, and the name its triggers' errors carry."""

_MISSING = f"""
        RAISE EXCEPTION
            'insert or update on table "jobs" violates foreign key constraint "{CONSTRAINT}"'
            USING ERRCODE = 'foreign_key_violation', SCHEMA = '{SCHEMA}', TABLE = 'jobs',
                  CONSTRAINT = '{CONSTRAINT}',
                  DETAIL = format('Key (queue)=(%s) is not present in table "queues".', missing);
"""

FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.jobs_queue_known() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    missing text;
BEGIN
    SELECT a.queue INTO missing FROM added a
    WHERE NOT EXISTS (SELECT FROM {SCHEMA}.queues q WHERE q.name = a.queue)
    LIMIT 1;
    IF FOUND THEN
{_MISSING}
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {SCHEMA}.job_queue_known() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    missing text := NEW.queue;
BEGIN
    IF NOT EXISTS (SELECT FROM {SCHEMA}.queues q WHERE q.name = NEW.queue) THEN
{_MISSING}
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {SCHEMA}.queue_in_use() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT FROM {SCHEMA}.jobs j WHERE j.queue = OLD.name) THEN
        RAISE EXCEPTION 'update or delete on table "queues" violates foreign key '
            'constraint "{CONSTRAINT}" on table "jobs"'
            USING ERRCODE = 'foreign_key_violation', SCHEMA = '{SCHEMA}', TABLE = 'queues',
                  CONSTRAINT = '{CONSTRAINT}',
                  DETAIL = format('Key (name)=(%s) is still referenced from table "jobs".',
                                  OLD.name);
    END IF;
    RETURN OLD;
END
$$;

CREATE OR REPLACE FUNCTION {SCHEMA}.queue_renamed() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE {SCHEMA}.jobs SET queue = NEW.name WHERE queue = OLD.name;
    RETURN NULL;
END
$$;
"""
"""The check's functions (created by this revision whatever the database's mode). They run
as their owner, as the foreign key's checks did: a role that may insert jobs need not
read the queues table, nor update the jobs of a queue it renames."""

TRIGGERS = f"""
CREATE TRIGGER jobs_queue_known AFTER INSERT ON {SCHEMA}.jobs
REFERENCING NEW TABLE AS added
FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.jobs_queue_known();

CREATE TRIGGER job_queue_known AFTER UPDATE OF queue ON {SCHEMA}.jobs
FOR EACH ROW WHEN (OLD.queue IS DISTINCT FROM NEW.queue)
EXECUTE FUNCTION {SCHEMA}.job_queue_known();

CREATE TRIGGER queue_in_use BEFORE DELETE ON {SCHEMA}.queues
FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.queue_in_use();

CREATE TRIGGER queue_renamed AFTER UPDATE OF name ON {SCHEMA}.queues
FOR EACH ROW WHEN (OLD.name IS DISTINCT FROM NEW.name)
EXECUTE FUNCTION {SCHEMA}.queue_renamed();
"""
"""The check's triggers: what the foreign key held, without its lock (see above)."""

CHECK_TRIGGERS = {
    "jobs_queue_known": "jobs",
    "job_queue_known": "jobs",
    "queue_in_use": "queues",
    "queue_renamed": "queues",
}
"""Each check trigger and its table (`drop_check`, and the drift check's exception)."""


def checked() -> bool:
    """Whether the check's triggers are in place (offline SQL: assumed, the default)."""
    if op.get_context().as_sql:
        return True
    names = {row.name for row in op.get_bind().execute(queries.schema_triggers())}
    return "jobs_queue_known" in names


def drop_check() -> None:
    """Drop the check's triggers (the opt-in branch: jobs may name unknown queues)."""
    for name, table in CHECK_TRIGGERS.items():
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON {SCHEMA}.{table}")


def refuse_orphans() -> None:
    """Lock jobs against writes (the lock ADD FOREIGN KEY takes anyway), then refuse
    (`OrphanJobsError`, naming them) while jobs name queues that do not exist: none can
    appear after the look."""
    op.execute(f"LOCK TABLE {SCHEMA}.jobs IN SHARE ROW EXCLUSIVE MODE")
    if not op.get_context().as_sql:
        orphans = op.get_bind().execute(queries.orphan_queues()).all()
        if orphans:
            listed = ", ".join(f"{queue!r}: {count} job(s)" for queue, count in orphans)
            raise OrphanJobsError(orphans=listed)


def restore_check() -> None:
    """Create the check's triggers (`--restore-queue-fk`), refused while jobs name queues
    that do not exist."""
    refuse_orphans()
    drop_check()
    op.execute(TRIGGERS)


def upgrade() -> None:
    op.execute(FUNCTIONS)
    if op.get_context().as_sql:
        had_key = True  # offline SQL: written for a database on the default branch
    else:
        had_key = bool(op.get_bind().execute(queries.queue_foreign_keys()).first())
    if had_key:  # the default: the key's checks move to the triggers
        op.execute(TRIGGERS)
        op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS {CONSTRAINT}")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def restore_key() -> None:
    """Add the foreign key of the schemas before this revision, refused while jobs name
    queues that do not exist."""
    refuse_orphans()
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


def downgrade() -> None:
    if checked():  # the default: back to the foreign key
        restore_key()
    drop_check()
    for name in CHECK_TRIGGERS:
        op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.{name}()")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
