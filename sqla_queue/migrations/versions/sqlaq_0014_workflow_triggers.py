"""sqla-queue: workflow triggers that stay linear and revive only what they cancelled.

Replaces `job_ended` and `jobs_ended` (sqlaq_0009); no table changes.

- A statement that ends many jobs with dependents (`jobs cancel --workflow` of a wide chord)
  recorded each ended job by appending to one text setting, copying all of it per row: n
  squared (80,000 parents: 76 s, row locks held). The row trigger now appends to a chunk of
  at most 4,000 characters and moves a full chunk to a numbered setting
  (`sqla_queue.ended_1`, ...); the statement trigger reads them all. The cancelled
  dependents' cause is found per dependent in one pass (it was a scan of the ended jobs
  per dependent).
- A retried job revives the dependents that its own end cancelled (their error is the
  trigger's "cancelled: job N (task), which it depends on, ended failed"), no longer every
  cancelled dependent: one an operator cancelled by hand, or one cancelled because the row
  it was about was deleted, stays cancelled.

Revision ID: sqlaq_0014
Revises: sqlaq_0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "sqlaq_0014"
down_revision: str | Sequence[str] | None = "sqlaq_0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
NOTIFY_CHANNEL = "sqla_queue"
CHUNK = 4000
# The error of a dependent cancelled because a job it depends on ended failed or cancelled,
# and the pattern of the dependents a retry of that job revives
CANCELLED_BY_PARENT_FORMAT = "cancelled: job %s%s, which it depends on, ended %s"
CANCELLED_BY_PARENT = "cancelled: job %, which it depends on, ended %"

JOB_ENDED = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    job_id bigint;
    ended text;
    frontier bigint[];
    pending text;
    chunks int;
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
                      -- cancelled by a job it depends on (below), not by an operator or
                      -- because the row it was about was deleted: those stay cancelled
                      AND c.last_error LIKE '{CANCELLED_BY_PARENT}'
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

    -- recorded here, acted on once per statement (jobs_ended), in child id order; in
    -- chunks of at most {CHUNK} characters (`sqla_queue.ended_1`, ...): one text that grew
    -- by a copy of itself per row made a statement ending n such jobs cost n squared (a
    -- chord 80,000 wide took 76 s to cancel)
    pending := coalesce(current_setting('sqla_queue.ended', true), '');
    IF length(pending) >= {CHUNK} THEN
        chunks := coalesce(nullif(current_setting('sqla_queue.ended_chunks', true), ''),
                           '0')::int + 1;
        PERFORM set_config('sqla_queue.ended_' || chunks, pending, true);
        PERFORM set_config('sqla_queue.ended_chunks', chunks::text, true);
        pending := '';
    END IF;
    PERFORM set_config('sqla_queue.ended', pending || job_id || ':' || ended || ',', true);
    RETURN NULL;
END
$$
"""

JOBS_ENDED = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.jobs_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    pending text := current_setting('sqla_queue.ended', true);
    chunks int;
    parts text[] := ARRAY[]::text[];
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
    chunks := coalesce(nullif(current_setting('sqla_queue.ended_chunks', true), ''), '0')::int;
    FOR i IN 1 .. chunks LOOP
        parts := parts || current_setting('sqla_queue.ended_' || i);
        PERFORM set_config('sqla_queue.ended_' || i, '', true);
    END LOOP;
    IF chunks > 0 THEN
        PERFORM set_config('sqla_queue.ended_chunks', '0', true);
    END IF;
    parts := parts || pending;
    SELECT array_agg(split_part(e, ':', 1)::bigint), array_agg(split_part(e, ':', 2))
    INTO ended_ids, ended_as
    FROM unnest(parts) AS p(chunk), unnest(string_to_array(rtrim(p.chunk, ','), ',')) AS e;
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
                   WHERE r.status <> 'done' AND r.on_failure = 'cancel') AS cause,
               (array_agg(r.status ORDER BY r.parent_id) FILTER (
                   WHERE r.status <> 'done' AND r.on_failure = 'cancel'))[1] AS how
        FROM recorded r GROUP BY r.child_id)
    SELECT array_agg(k.child_id), array_agg(k.ok), array_agg(k.cause), array_agg(k.how)
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
                '{CANCELLED_BY_PARENT_FORMAT}', x.cause,
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


def upgrade() -> None:
    op.execute(JOB_ENDED)
    op.execute(JOBS_ENDED)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    before = importlib.import_module("sqla_queue.migrations.versions.sqlaq_0009_workflows")
    op.execute(before.JOB_ENDED)
    op.execute(before.JOBS_ENDED)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
