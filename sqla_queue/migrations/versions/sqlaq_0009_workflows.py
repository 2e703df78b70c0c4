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
- retried (failed or cancelled back to queued): the dependents it had cancelled wait again,
  and a waiting one that had counted it as ended (an `on_failure = 'run'` edge) waits for it
  again.

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
from sqla_queue.db import online

revision: str = "sqlaq_0009"
down_revision: str | Sequence[str] | None = "sqlaq_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "contract"  # a new status, `waiting`, that earlier code does not know

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
    ended text;
    frontier bigint[];
BEGIN
    IF TG_OP = 'DELETE' THEN
        job_id := OLD.id;
        IF OLD.status IN ('done', 'failed', 'cancelled') THEN
            RETURN NULL;  -- its outcome was recorded when it ended
        END IF;
        -- a running row is deleted by the worker that finished it (retention delete or
        -- archive); a queued or waiting one by an admin: it will never run
        ended := CASE WHEN OLD.status = 'running' THEN 'done' ELSE 'cancelled' END;
    ELSE
        job_id := NEW.id;
        IF NEW.status IN ('done', 'failed', 'cancelled')
           AND OLD.status NOT IN ('done', 'failed', 'cancelled') THEN
            ended := NEW.status;
        ELSIF OLD.status IN ('failed', 'cancelled') AND NEW.status IN ('queued', 'waiting') THEN
            IF pg_trigger_depth() > 1 THEN
                RETURN NULL;  -- revived below, by the retry that started it
            END IF;
            -- retried: its dependents that ended cancelled wait again, level by level;
            -- a waiting one that counted it (or a revived job) as ended through an
            -- on_failure = 'run' edge waits for it again (its next end counts once)
            frontier := ARRAY[job_id];
            LOOP
                -- (one that had become due on it goes back to waiting, if not started)
                UPDATE {SCHEMA}.jobs c
                SET deps_left = coalesce(c.deps_left, 0) + (
                    SELECT count(*) FROM {SCHEMA}.job_deps d
                    WHERE d.child_id = c.id AND d.parent_id = ANY (frontier)
                      AND d.on_failure = 'run' AND d.parent_status IN ('failed', 'cancelled')),
                    status = 'waiting'
                WHERE c.status IN ('waiting', 'queued')
                  AND c.id IN (SELECT d.child_id FROM {SCHEMA}.job_deps d
                               WHERE d.parent_id = ANY (frontier) AND d.on_failure = 'run'
                                 AND d.parent_status IN ('failed', 'cancelled'));
                UPDATE {SCHEMA}.job_deps SET parent_status = NULL
                WHERE parent_id = ANY (frontier);
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
            END LOOP;
            RETURN NULL;
        ELSE
            RETURN NULL;
        END IF;
    END IF;

    -- recorded here, acted on once per statement (jobs_ended), in child id order
    PERFORM set_config(
        'sqla_queue.ended',
        coalesce(current_setting('sqla_queue.ended', true), '') || job_id || ':' || ended || ',',
        true);
    RETURN NULL;
END
$$
"""

JOBS_ENDED = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.jobs_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    pending text := current_setting('sqla_queue.ended', true);
    ended_ids bigint[];
    ended_as text[];
    kids bigint[];
    satisfied bigint[];
    causes bigint[];
    caused_as text[];
    locked bigint[];
    sent bigint;
BEGIN
    IF pending IS NULL OR pending = '' THEN
        RETURN NULL;  -- this statement ended no job that others wait for
    END IF;
    PERFORM set_config('sqla_queue.ended', '', true);
    SELECT array_agg(split_part(e, ':', 1)::bigint), array_agg(split_part(e, ':', 2))
    INTO ended_ids, ended_as
    FROM unnest(string_to_array(rtrim(pending, ','), ',')) AS e;
    -- their waiting dependents, locked in id order: two statements ending parents of the
    -- same jobs never take those locks in opposite orders (no deadlock). `status || ''`
    -- keeps the planner off ix_jobs_waiting: its statistics, taken when no job waited,
    -- say one row, and a nested loop over it and 10,000 dependents took 35 s (measured)
    SELECT array_agg(w.id) INTO locked FROM (
        SELECT c.id FROM {SCHEMA}.jobs c
        WHERE c.id IN (SELECT d.child_id FROM {SCHEMA}.job_deps d
                       WHERE d.parent_id = ANY (ended_ids) AND d.parent_status IS NULL)
          AND c.status || '' = 'waiting'
        ORDER BY c.id
        FOR NO KEY UPDATE OF c) w;
    -- record each outcome on its edges; per dependent: how many of its parents count as
    -- ended well (done, or any end through an on_failure = 'run' edge), and the first
    -- that ended failed or cancelled through a 'cancel' edge
    WITH ended AS (
        SELECT * FROM unnest(ended_ids, ended_as) AS t(id, status)),
    recorded AS (
        UPDATE {SCHEMA}.job_deps d SET parent_status = e.status
        FROM ended e
        WHERE d.parent_id = e.id AND d.parent_status IS NULL
        RETURNING d.child_id, d.parent_id, d.on_failure, e.status),
    counted AS (
        SELECT r.child_id,
               count(*) FILTER (WHERE r.status = 'done' OR r.on_failure = 'run') AS ok,
               min(r.parent_id) FILTER (
                   WHERE r.status <> 'done' AND r.on_failure = 'cancel') AS cause
        FROM recorded r GROUP BY r.child_id)
    SELECT array_agg(k.child_id), array_agg(k.ok), array_agg(k.cause),
           array_agg((SELECT e.status FROM ended e WHERE e.id = k.cause))
    INTO kids, satisfied, causes, caused_as
    FROM counted k JOIN unnest(locked) AS l(id) ON l.id = k.child_id;  -- waiting ones
    IF kids IS NULL THEN
        RETURN NULL;
    END IF;
    -- one UPDATE per dependent for the whole statement (a fan-in's child is written
    -- once per finishing batch, not once per parent); at 0 it is due, its queue told
    WITH promoted AS (
        UPDATE {SCHEMA}.jobs c
        SET deps_left = c.deps_left - k.ok,
            status = CASE WHEN c.deps_left - k.ok <= 0 THEN 'queued' ELSE 'waiting' END
        FROM unnest(kids, satisfied, causes) AS k(id, ok, cause)
        WHERE c.id = k.id AND k.cause IS NULL AND k.ok > 0  -- locked above, waiting
        RETURNING c.queue, c.status)
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', p.queue)) INTO sent
    FROM promoted p WHERE p.status = 'queued';
    IF EXISTS (SELECT 1 FROM unnest(causes) AS c WHERE c IS NOT NULL) THEN
        -- cancelled, with every waiting job that waits for them through 'cancel' edges,
        -- in one statement (a chain of any length is one UPDATE, not one nested trigger
        -- per link); each one's error names the job it waited for
        WITH RECURSIVE doomed(id, cause, how) AS (
            SELECT k.id, k.cause, k.how
            FROM unnest(kids, causes, caused_as) AS k(id, cause, how)
            WHERE k.cause IS NOT NULL
          UNION
            SELECT d.child_id, d.parent_id, 'cancelled'
            FROM doomed x
            JOIN {SCHEMA}.job_deps d ON d.parent_id = x.id AND d.on_failure = 'cancel'
            JOIN {SCHEMA}.jobs c ON c.id = d.child_id AND c.status || '' = 'waiting')
        UPDATE {SCHEMA}.jobs c
        SET status = 'cancelled', finished_at = now(),
            last_error = format(
                'cancelled: job %s%s, which it depends on, ended %s', x.cause,
                coalesce(' (' || (SELECT p.task FROM {SCHEMA}.jobs p WHERE p.id = x.cause)
                         || ')', ''),
                x.how)
        FROM (SELECT DISTINCT ON (id) id, cause, how FROM doomed ORDER BY id, cause) x
        WHERE c.id = x.id AND c.status || '' = 'waiting';
    END IF;
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
CREATE TRIGGER jobs_ended_update AFTER UPDATE ON {SCHEMA}.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.jobs_ended();
CREATE TRIGGER jobs_ended_delete AFTER DELETE ON {SCHEMA}.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.jobs_ended();
CREATE TRIGGER job_retried BEFORE UPDATE ON {SCHEMA}.jobs
    FOR EACH ROW WHEN (NEW.deps_left IS NOT NULL AND OLD.status IN ('failed', 'cancelled')
                       AND NEW.status = 'queued')
    EXECUTE FUNCTION {SCHEMA}.job_retried();
"""


def upgrade() -> None:
    # online first (sqla_queue.db.online): columns, indexes built concurrently, the new
    # status check and unique index built beside the ones they replace
    online.add_columns(
        "jobs",
        sa.Column("deps_left", sa.Integer()),
        sa.Column("has_dependents", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("workflow_id", sa.Text()),
    )
    online.add_columns("jobs_archive", sa.Column("workflow_id", sa.Text()))
    has_workflow = sa.text("workflow_id IS NOT NULL")
    online.create_index(
        "ix_jobs_workflow_id", "jobs", ["workflow_id"], postgresql_where=has_workflow
    )
    online.create_index(
        "ix_jobs_waiting", "jobs", ["id"], postgresql_where=sa.text("status = 'waiting'")
    )
    online.create_index(
        "ix_jobs_archive_workflow_id",
        "jobs_archive",
        ["workflow_id"],
        postgresql_where=has_workflow,
    )
    online.add_check(
        "jobs", "ck_jobs_status" + online.REPLACEMENT_SUFFIX, f"status IN ({STATUSES}, 'waiting')"
    )
    online.build_replacement(
        "ux_jobs_unique_key",
        "jobs",
        ["unique_key"],
        unique=True,
        postgresql_where=sa.text(_unique_predicate(True)),
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
    online.swap_check("jobs", "ck_jobs_status")
    online.swap_index("ux_jobs_unique_key")
    op.execute(JOB_ENDED)
    op.execute(JOBS_ENDED)
    op.execute(JOB_RETRIED)
    op.execute(TRIGGERS)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    for trigger in (
        "job_ended_update",
        "job_ended_delete",
        "jobs_ended_update",
        "jobs_ended_delete",
        "job_retried",
    ):
        op.execute(f"DROP TRIGGER {trigger} ON {SCHEMA}.jobs")
    op.execute(f"DROP FUNCTION {SCHEMA}.job_ended()")
    op.execute(f"DROP FUNCTION {SCHEMA}.jobs_ended()")
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
    op.drop_index("ix_jobs_waiting", table_name="jobs", schema=SCHEMA)
    for table in ("jobs", "jobs_archive"):
        op.drop_column(table, "workflow_id", schema=SCHEMA)
    op.drop_column("jobs", "has_dependents", schema=SCHEMA)
    op.drop_column("jobs", "deps_left", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
