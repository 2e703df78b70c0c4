"""sqla-queue: the history of finished jobs, a table partitioned by finish time.

A succeeded job of an `archive` queue moves out of the hot `jobs` table into
`jobs_history`, in the statement that finishes it (a `DELETE ... RETURNING` feeding an
`INSERT`, one statement fenced on the attempt), as it moved to `jobs_archive` before.
`jobs_history` is partitioned by range of `finished_at` (a day per partition by default);
a DEFAULT partition takes a row whose finish time has no partition yet. The workers'
keeper calls `keep_history(period_days, ahead, batch)` about once a minute: it makes the
partitions of the next periods, moves the rows of a period out of the DEFAULT partition
once that period has its own, ANALYZEs a partition once its period has passed, and moves
a batch of the rows releases before this one left in the unpartitioned `jobs_archive`
into the history: the upgrade of existing rows is online, a batch per call, never one
transaction over the whole table. The function is SECURITY DEFINER (its owner is the
schema's): a worker's role needs no right to create tables.

`sqla-queue prune` drops whole partitions older than its cut-off (a `DROP TABLE` of a
partition, under `lock_timeout`) and deletes only the rows of the partition the cut-off
falls in. `sqla_queue.all_jobs` is a view of every job, live or finished, with the
history's columns.

The journal trigger keeps a job's steps, progress and log lines when it moves to the
history (they stay readable on `jobs show`); the prune deletes them with the partition.

New empty tables, a view and functions, one function replaced: no table is rewritten and
`jobs` is not locked beyond a moment (the trigger function's replacement). Code built for
sqlaq_0029 runs on it unchanged (expand): it writes `jobs_archive`, and the keeper of
head's workers moves those rows.

Revision ID: sqlaq_0030_history
Revises: sqlaq_0029_ops
Create Date: 2026-12-07
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0030_history"
down_revision: str | Sequence[str] | None = "sqlaq_0029_ops"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind: online.MigrationKind = "expand"

SCHEMA = "sqla_queue"

HISTORY_COLUMNS = (
    "id, queue, task, args, status, priority, run_at, attempts, max_attempts, locked_at, "
    "locked_by, heartbeat_at, last_error, created_at, finished_at, started_at, tags, meta, "
    "result, workflow_id, errors, about, partition, sequence, expires_at"
)
"""The history's columns as of this revision (models.HISTORY_COLUMNS)."""

HISTORY_TABLE = f"""
CREATE TABLE {SCHEMA}.jobs_history (
    id bigint NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    args jsonb NOT NULL,
    status text NOT NULL,
    priority smallint NOT NULL,
    run_at timestamptz NOT NULL,
    attempts integer NOT NULL,
    max_attempts integer,
    locked_at timestamptz,
    locked_by text,
    heartbeat_at timestamptz,
    last_error text,
    created_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    started_at timestamptz,
    tags text[] NOT NULL DEFAULT '{{}}'::text[],
    meta jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    result jsonb,
    workflow_id text,
    errors jsonb,
    about text,
    partition text,
    sequence text,
    expires_at timestamptz,
    CONSTRAINT pk_jobs_history PRIMARY KEY (id, finished_at)
) PARTITION BY RANGE (finished_at)
"""

INDEXES = (
    f"CREATE INDEX ix_jobs_history_finished_at ON {SCHEMA}.jobs_history (finished_at)",
    f"CREATE INDEX ix_jobs_history_workflow_id ON {SCHEMA}.jobs_history (workflow_id) "
    "WHERE workflow_id IS NOT NULL",
    f"CREATE INDEX ix_jobs_history_about ON {SCHEMA}.jobs_history (about) WHERE about IS NOT NULL",
)

HOT_ONLY_COLUMNS = (
    "lease_expires_at, unique_key, unique_states, deps_left, has_dependents, signal_key"
)
"""The columns of `jobs` the history does not keep (a claim's, a wait's): NULL (false) for a
finished job in `all_jobs`."""

ALL_JOBS = f"""
CREATE VIEW {SCHEMA}.all_jobs AS
SELECT {HISTORY_COLUMNS}, {HOT_ONLY_COLUMNS} FROM {SCHEMA}.jobs
UNION ALL
SELECT {HISTORY_COLUMNS}, NULL::timestamptz, NULL::bytea, NULL::smallint, NULL::integer,
       false, NULL::text
FROM {SCHEMA}.jobs_history
"""
"""Every job, live or finished, with every column of `jobs`: what a reader of "the job"
reads (a query by id or by finished_at is one index probe per table and partition)."""

PERIOD_START = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.history_period_start(at timestamptz, period_days integer)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM at) / (86400.0 * period_days))
                        * 86400.0 * period_days)
$$
"""
"""The start of the period of `period_days` days that holds `at` (periods count from the
Unix epoch, so a day's period starts at 00:00 UTC)."""

KEEP_HISTORY = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.keep_history(
    period_days integer, ahead integer, batch integer
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    span interval := make_interval(days => period_days);
    first timestamptz;
    start timestamptz;
    name text;
    n bigint;
    part record;
BEGIN
    -- the bounds WorkerConfig takes: any role with USAGE on the schema may call this
    -- (SECURITY DEFINER), and must not make it create thousands of tables
    IF period_days NOT BETWEEN 1 AND 366 OR ahead NOT BETWEEN 0 AND 366
       OR batch NOT BETWEEN 0 AND 100000 THEN
        RAISE EXCEPTION 'keep_history: period_days 1-366, ahead 0-366, batch 0-100000: %, %, %',
            period_days, ahead, batch;
    END IF;
    -- partitions for the period of now() and `ahead` after it, and for the periods of the
    -- rows the DEFAULT partition took (at most 10 periods a call)
    first := {SCHEMA}.history_period_start(now(), period_days);
    FOR start IN
        SELECT s FROM generate_series(first, first + span * ahead, span) AS s
        UNION
        (SELECT DISTINCT {SCHEMA}.history_period_start(finished_at, period_days)
         FROM {SCHEMA}.jobs_history_default LIMIT 10)
    LOOP
        name := 'jobs_history_p' || to_char(start AT TIME ZONE 'UTC', 'YYYYMMDD');
        CONTINUE WHEN to_regclass('{SCHEMA}.' || name) IS NOT NULL;
        BEGIN
            CREATE TEMP TABLE IF NOT EXISTS sqlaq_history_strays
                (LIKE {SCHEMA}.jobs_history) ON COMMIT DROP;
            WITH strays AS (
                DELETE FROM {SCHEMA}.jobs_history_default
                WHERE finished_at >= start AND finished_at < start + span RETURNING *)
            INSERT INTO sqlaq_history_strays SELECT * FROM strays;
            EXECUTE format(
                'CREATE TABLE {SCHEMA}.%I PARTITION OF {SCHEMA}.jobs_history '
                'FOR VALUES FROM (%L) TO (%L)', name, start, start + span);
            INSERT INTO {SCHEMA}.jobs_history SELECT * FROM sqlaq_history_strays;
            TRUNCATE sqlaq_history_strays;
        EXCEPTION WHEN invalid_object_definition THEN
            -- overlaps a partition of another period length: that one takes these rows
            NULL;
        END;
    END LOOP;
    -- a partition whose period has passed is analyzed once (autovacuum's own threshold
    -- may come late for a table that will never change again)
    FOR part IN
        SELECT c.oid::regclass AS rel
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        LEFT JOIN pg_stat_all_tables t ON t.relid = c.oid
        WHERE i.inhparent = '{SCHEMA}.jobs_history'::regclass
          AND c.relname <> 'jobs_history_default'
          AND t.last_analyze IS NULL AND t.last_autoanalyze IS NULL
          AND substring(pg_get_expr(c.relpartbound, c.oid)
                        FROM 'TO \\(''([^'']+)''\\)')::timestamptz <= now()
    LOOP
        EXECUTE format('ANALYZE %s', part.rel);
    END LOOP;
    IF batch = 0 THEN
        RETURN 0;
    END IF;
    -- rows an earlier release archived: the unpartitioned archive's
    WITH gone AS (
        DELETE FROM {SCHEMA}.jobs_archive a
        WHERE a.id IN (SELECT b.id FROM {SCHEMA}.jobs_archive b
                       LIMIT batch FOR UPDATE SKIP LOCKED)
        RETURNING a.*)
    INSERT INTO {SCHEMA}.jobs_history ({HISTORY_COLUMNS})
    SELECT id, queue, task, args, status, priority, run_at, attempts, max_attempts,
           locked_at, locked_by, heartbeat_at, last_error, created_at,
           coalesce(finished_at, now()), locked_at, tags, meta, result, workflow_id, errors,
           about, partition, sequence, NULL
    FROM gone;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$
"""
"""The keeper's history upkeep: partitions ahead, strays out of DEFAULT, ANALYZE of filled
partitions, a batch of older releases' rows moved in; returns how many rows it moved in."""

JOURNAL_GONE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.job_journal_gone() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- a table with no row has nothing of these jobs: one read of its first page, no join;
    -- a job the same statement moved to the history keeps its journal
    IF EXISTS (SELECT FROM {SCHEMA}.job_steps) THEN
        DELETE FROM {SCHEMA}.job_steps s USING gone g WHERE s.job_id = g.id
            AND NOT EXISTS (SELECT FROM {SCHEMA}.jobs_history h WHERE h.id = g.id);
    END IF;
    IF EXISTS (SELECT FROM {SCHEMA}.job_progress) THEN
        DELETE FROM {SCHEMA}.job_progress p USING gone g WHERE p.job_id = g.id
            AND NOT EXISTS (SELECT FROM {SCHEMA}.jobs_history h WHERE h.id = g.id);
    END IF;
    IF EXISTS (SELECT FROM {SCHEMA}.job_logs) THEN
        DELETE FROM {SCHEMA}.job_logs l USING gone g WHERE l.job_id = g.id
            AND NOT EXISTS (SELECT FROM {SCHEMA}.jobs_history h WHERE h.id = g.id);
    END IF;
    RETURN NULL;
END
$$;
"""
"""The journal trigger's function: as sqlaq_0026's, but a job moved to the history keeps
its steps, progress and log lines."""

HISTORY_JOURNAL_GONE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.history_journal_gone() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
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
CREATE TRIGGER history_journal_gone AFTER DELETE ON {SCHEMA}.jobs_history
REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
EXECUTE FUNCTION {SCHEMA}.history_journal_gone();
"""
"""A job deleted from the history (`jobs delete`, a bulk delete, prune's rows) takes its
steps, progress and log lines; a dropped partition's go in prune's own statements."""


def upgrade() -> None:
    op.execute(HISTORY_TABLE)
    op.execute(
        f"CREATE TABLE {SCHEMA}.jobs_history_default PARTITION OF {SCHEMA}.jobs_history DEFAULT"
    )
    for statement in INDEXES:
        op.execute(statement)
    op.execute(ALL_JOBS)
    op.execute(PERIOD_START)
    op.execute(KEEP_HISTORY)
    op.execute(JOURNAL_GONE)
    op.execute(HISTORY_JOURNAL_GONE)
    op.execute(f"SELECT {SCHEMA}.keep_history(1, 3, 0)")  # today's and 3 days' partitions
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    feature_tax = importlib.import_module("sqla_queue.migrations.versions.sqlaq_0026_feature_tax")
    op.execute(feature_tax.JOURNAL_GONE)
    # the history's rows go back where sqlaq_0029's code reads them: the archive
    op.execute(
        f"INSERT INTO {SCHEMA}.jobs_archive (id, queue, task, args, status, priority, run_at, "
        "attempts, max_attempts, locked_at, locked_by, heartbeat_at, last_error, created_at, "
        "finished_at, tags, meta, result, workflow_id, errors, about, partition, sequence) "
        "SELECT id, queue, task, args, status, priority, run_at, attempts, max_attempts, "
        "locked_at, locked_by, heartbeat_at, last_error, created_at, finished_at, tags, meta, "
        f"result, workflow_id, errors, about, partition, sequence FROM {SCHEMA}.jobs_history "
        "ON CONFLICT DO NOTHING"
    )
    op.execute(f"DROP VIEW {SCHEMA}.all_jobs")
    op.execute(f"DROP FUNCTION {SCHEMA}.keep_history(integer, integer, integer)")
    op.execute(f"DROP FUNCTION {SCHEMA}.history_period_start(timestamptz, integer)")
    op.execute(f"DROP TABLE {SCHEMA}.jobs_history")
    op.execute(f"DROP FUNCTION {SCHEMA}.history_journal_gone()")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
