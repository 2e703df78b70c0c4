"""sqla-queue: workflows, jobs that wait for other jobs.

A job enqueued with `depends_on` is `waiting` until every job it depends on has ended; its
`deps_left` counts those that have not. The edges live in `job_deps` (no foreign key to
`jobs`: a key-share lock on hot job rows would mint MultiXacts). A job that has dependents
is flagged (`has_dependents`), and only such rows fire the triggers below, so a job outside
any workflow pays nothing but a WHEN test on its finishing row.

`job_ended` (AFTER UPDATE and AFTER DELETE, for flagged rows) runs in the transaction that
finishes a job, whichever statement does it (the worker's, the reaper's, an admin's):
- it records the outcome on the job's edges (`job_deps.parent_status`), so a dependent
  enqueued after the job was deleted by its retention still knows it succeeded;
- done: each dependent's `deps_left` falls by one; at 0 it becomes `queued`, due at once,
  and its queue is notified, in that same transaction;
- failed or cancelled (or deleted before it ended): dependents by an `on_failure = 'run'`
  edge count it as ended; the others, and their own dependents, are cancelled, each with a
  reason naming the job it depended on;
- retried (failed or cancelled back to queued): the dependents it had cancelled wait again.

`job_retried` (BEFORE UPDATE) sends a retried dependent back to `waiting` while a job it
depends on has not succeeded.

The counter is decremented by an UPDATE of the dependent's row: concurrent finishers of
its parents queue on that row lock for the length of their own short statement, and the
last one sees 0 (no lost update, no scan for "are all done?" that two finishers could
both miss).

`waiting` is a new status: its unique bit (32) joins the unique index's predicate, so that
index is built again (it reads the jobs table once: upgrade when the table is small).

Revision ID: sqlaq_0009
Revises: sqlaq_0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "sqlaq_0009"
down_revision: str | Sequence[str] | None = "sqlaq_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "sqla_queue"
NOTIFY_CHANNEL = "sqla_queue"
STATUSES = "'queued', 'running', 'done', 'failed', 'cancelled'"
UNIQUE_CASE = (
    "CASE status WHEN 'queued' THEN 1 WHEN 'running' THEN 2 WHEN 'done' THEN 4 "
    "WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16{waiting} ELSE 0 END"
)
UNIQUE_PREDICATE = "unique_key IS NOT NULL AND (unique_states & {case}) <> 0"


def _unique_predicate(with_waiting: bool) -> str:
    case = UNIQUE_CASE.format(waiting=" WHEN 'waiting' THEN 32" if with_waiting else "")
    return UNIQUE_PREDICATE.format(case=case)


JOB_ENDED = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    job_id bigint;
    job_task text;
    ended text;
    frontier bigint[];
    sent bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        job_id := OLD.id;
        job_task := OLD.task;
        IF OLD.status IN ('done', 'failed', 'cancelled') THEN
            RETURN NULL;  -- its outcome was recorded when it ended
        END IF;
        -- a running row is deleted by the worker that finished it (retention delete or
        -- archive); a queued or waiting one by an admin: it will never run
        ended := CASE WHEN OLD.status = 'running' THEN 'done' ELSE 'cancelled' END;
    ELSE
        job_id := NEW.id;
        job_task := NEW.task;
        IF NEW.status IN ('done', 'failed', 'cancelled')
           AND OLD.status NOT IN ('done', 'failed', 'cancelled') THEN
            ended := NEW.status;
        ELSIF OLD.status IN ('failed', 'cancelled') AND NEW.status IN ('queued', 'waiting') THEN
            IF pg_trigger_depth() > 1 THEN
                RETURN NULL;  -- revived below, by the retry that started it
            END IF;
            -- retried: its dependents that ended cancelled wait again, level by level
            UPDATE {SCHEMA}.job_deps SET parent_status = NULL WHERE parent_id = job_id;
            frontier := ARRAY[job_id];
            LOOP
                WITH revived AS (
                    UPDATE {SCHEMA}.jobs c
                    SET status = 'waiting', finished_at = NULL, last_error = NULL,
                        deps_left = (
                            SELECT count(*) FROM {SCHEMA}.job_deps d
                            WHERE d.child_id = c.id AND d.parent_status IS DISTINCT FROM 'done'
                              AND NOT (d.on_failure = 'run' AND d.parent_status IS NOT NULL))
                    WHERE c.status = 'cancelled'
                      AND c.id IN (SELECT d.child_id FROM {SCHEMA}.job_deps d
                                   WHERE d.parent_id = ANY (frontier))
                      AND NOT EXISTS (
                          SELECT 1 FROM {SCHEMA}.job_deps d
                          WHERE d.child_id = c.id AND d.on_failure = 'cancel'
                            AND d.parent_status IN ('failed', 'cancelled'))
                    RETURNING c.id)
                SELECT array_agg(id) INTO frontier FROM revived;
                EXIT WHEN frontier IS NULL;
                UPDATE {SCHEMA}.job_deps SET parent_status = NULL
                WHERE parent_id = ANY (frontier);
            END LOOP;
            RETURN NULL;
        ELSE
            RETURN NULL;
        END IF;
    END IF;

    IF ended = 'done' THEN
        WITH recorded AS (
            UPDATE {SCHEMA}.job_deps d SET parent_status = ended
            WHERE d.parent_id = job_id AND d.parent_status IS NULL
            RETURNING d.child_id),
        promoted AS (
            UPDATE {SCHEMA}.jobs c
            SET deps_left = c.deps_left - 1,
                status = CASE WHEN c.deps_left <= 1 THEN 'queued' ELSE c.status END
            FROM recorded r
            WHERE c.id = r.child_id AND c.status = 'waiting'
            RETURNING c.queue, c.deps_left)
        SELECT count(pg_notify('{NOTIFY_CHANNEL}', p.queue)) INTO sent
        FROM promoted p WHERE p.deps_left = 0;
        RETURN NULL;
    END IF;

    -- failed or cancelled: 'run' edges count it as ended, 'cancel' edges cancel
    WITH recorded AS (
        UPDATE {SCHEMA}.job_deps d SET parent_status = ended
        WHERE d.parent_id = job_id AND d.parent_status IS NULL
        RETURNING d.child_id, d.on_failure),
    ran AS (
        UPDATE {SCHEMA}.jobs c
        SET deps_left = c.deps_left - 1,
            status = CASE WHEN c.deps_left <= 1 THEN 'queued' ELSE c.status END
        FROM recorded r
        WHERE r.on_failure = 'run' AND c.id = r.child_id AND c.status = 'waiting'
        RETURNING c.queue, c.deps_left),
    notified AS (
        SELECT pg_notify('{NOTIFY_CHANNEL}', r.queue) FROM ran r WHERE r.deps_left = 0)
    UPDATE {SCHEMA}.jobs c
    SET status = 'cancelled', finished_at = now(),
        last_error = format('cancelled: job %s (%s), which it depends on, ended %s',
                            job_id, job_task, ended)
    FROM recorded r
    WHERE r.on_failure = 'cancel' AND c.id = r.child_id AND c.status = 'waiting'
      AND (SELECT count(*) FROM notified) >= 0;
    -- their own dependents are cancelled by this same trigger, fired by that UPDATE
    RETURN NULL;
END
$$
"""

JOB_RETRIED = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_retried() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    NEW.deps_left := (
        SELECT count(*) FROM {SCHEMA}.job_deps d
        WHERE d.child_id = NEW.id AND d.parent_status IS DISTINCT FROM 'done'
          AND NOT (d.on_failure = 'run' AND d.parent_status IS NOT NULL));
    IF NEW.deps_left > 0 THEN
        NEW.status := 'waiting';
    END IF;
    RETURN NEW;
END
$$
"""

TRIGGERS = f"""
CREATE TRIGGER job_ended_update AFTER UPDATE ON {SCHEMA}.jobs
    FOR EACH ROW WHEN (NEW.has_dependents AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {SCHEMA}.job_ended();
CREATE TRIGGER job_ended_delete AFTER DELETE ON {SCHEMA}.jobs
    FOR EACH ROW WHEN (OLD.has_dependents)
    EXECUTE FUNCTION {SCHEMA}.job_ended();
CREATE TRIGGER job_retried BEFORE UPDATE ON {SCHEMA}.jobs
    FOR EACH ROW WHEN (NEW.deps_left IS NOT NULL AND OLD.status IN ('failed', 'cancelled')
                       AND NEW.status = 'queued')
    EXECUTE FUNCTION {SCHEMA}.job_retried();
"""


def upgrade() -> None:
    op.add_column("jobs", sa.Column("deps_left", sa.Integer()), schema=SCHEMA)
    op.add_column(
        "jobs",
        sa.Column("has_dependents", sa.Boolean(), server_default=sa.false(), nullable=False),
        schema=SCHEMA,
    )
    for table in ("jobs", "jobs_archive"):
        op.add_column(table, sa.Column("workflow_id", sa.Text()), schema=SCHEMA)
    op.create_index(
        "ix_jobs_workflow_id",
        "jobs",
        ["workflow_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("workflow_id IS NOT NULL"),
    )
    op.create_index(
        "ix_jobs_archive_workflow_id",
        "jobs_archive",
        ["workflow_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("workflow_id IS NOT NULL"),
    )
    op.create_table(
        "job_deps",
        sa.Column("parent_id", sa.BigInteger(), nullable=False),
        sa.Column("child_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("on_failure", sa.Text(), server_default=sa.text("'cancel'"), nullable=False),
        sa.Column("parent_status", sa.Text()),
        sa.PrimaryKeyConstraint("parent_id", "child_id", name="pk_job_deps"),
        sa.CheckConstraint("on_failure IN ('cancel', 'run')", name="on_failure"),
        schema=SCHEMA,
    )
    op.create_index("ix_job_deps_child_id", "job_deps", ["child_id", "position"], schema=SCHEMA)
    # sqlaq_0001 named it through the naming convention twice over
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS ck_jobs_ck_jobs_status")
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS ck_jobs_status")
    op.execute(
        f"ALTER TABLE {SCHEMA}.jobs ADD CONSTRAINT ck_jobs_status "
        f"CHECK (status IN ({STATUSES}, 'waiting'))"
    )
    op.drop_index("ux_jobs_unique_key", table_name="jobs", schema=SCHEMA)
    op.create_index(
        "ux_jobs_unique_key",
        "jobs",
        ["unique_key"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text(_unique_predicate(True)),
    )
    op.execute(JOB_ENDED)
    op.execute(JOB_RETRIED)
    op.execute(TRIGGERS)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    for trigger in ("job_ended_update", "job_ended_delete", "job_retried"):
        op.execute(f"DROP TRIGGER {trigger} ON {SCHEMA}.jobs")
    op.execute(f"DROP FUNCTION {SCHEMA}.job_ended()")
    op.execute(f"DROP FUNCTION {SCHEMA}.job_retried()")
    # a waiting job has no status to go back to: it is cancelled, saying why
    op.execute(
        f"UPDATE {SCHEMA}.jobs SET status = 'cancelled', finished_at = now(), "
        "last_error = 'cancelled: the schema was downgraded below workflows' "
        "WHERE status = 'waiting'"
    )
    op.drop_index("ux_jobs_unique_key", table_name="jobs", schema=SCHEMA)
    op.create_index(
        "ux_jobs_unique_key",
        "jobs",
        ["unique_key"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text(_unique_predicate(False)),
    )
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT ck_jobs_status")
    op.execute(
        f"ALTER TABLE {SCHEMA}.jobs ADD CONSTRAINT ck_jobs_ck_jobs_status "
        f"CHECK (status IN ({STATUSES}))"
    )
    op.drop_table("job_deps", schema=SCHEMA)
    op.drop_index("ix_jobs_archive_workflow_id", table_name="jobs_archive", schema=SCHEMA)
    op.drop_index("ix_jobs_workflow_id", table_name="jobs", schema=SCHEMA)
    for table in ("jobs", "jobs_archive"):
        op.drop_column(table, "workflow_id", schema=SCHEMA)
    op.drop_column("jobs", "has_dependents", schema=SCHEMA)
    op.drop_column("jobs", "deps_left", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
