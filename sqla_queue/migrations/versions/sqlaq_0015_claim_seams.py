"""sqla-queue: where the claim meets sequences, partitions and cancel.

- A job cancelled while its handler runs (`cancel_jobs` keeps its lease until the worker says
  the handler returned, sqlaq_0008) still holds its sequence and its partition's slot, as it
  holds its queue's `--max-running` slot: `claim_turns` counts it among its partition's
  running jobs and `SEQUENCE_FREE` lets no other job of its sequence start; its dependents
  are told it ended (`job_ended`) when its lease is cleared, not when it is cancelled.
- A fair claim reads the 2 x `want` least served partitions with a claimable job (a due job
  no sequence holds), not any due job: a partition whose due jobs all wait behind a failed
  job of their sequence is never served, so it stayed least served and filled the window,
  and the other partitions starved.
- A job that depends on a failed job of its own sequence through an `on_failure = 'run'`
  edge (a clean-up) is not held by it, nor by the jobs waiting behind it: it runs in the
  failed job's place, and the sequence stays held for the rest.

No table changes; `claim_turns` (sqlaq_0013's) and `job_ended` (sqlaq_0014's, amended) and the
`job_ended_update` trigger are replaced.

Revision ID: sqlaq_0015
Revises: sqlaq_0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from alembic import op

revision: str = "sqlaq_0015"
down_revision: str | Sequence[str] | None = "sqlaq_0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"

# The condition a claimable job of a sequence meets (the same text as
# `sqla_queue.db.queries.claim.sequence_free`): no earlier job of its sequence is queued,
# running, waiting, or failed in a queue that holds sequences on failure, no later one runs,
# and none was cancelled while its handler runs and has not returned. A job that depends on
# a failed job of its sequence through an on_failure = 'run' edge is held neither by it nor
# by the jobs behind it, only by running ones and those before it.
SEQUENCE_FREE = f"""(j.sequence IS NULL OR (NOT EXISTS (
            SELECT 1 FROM {SCHEMA}.jobs e
            WHERE e.sequence = j.sequence
              AND e.status IN ('queued', 'running', 'waiting', 'failed') AND e.id < j.id
              AND (e.status <> 'failed' OR NOT EXISTS (
                  SELECT 1 FROM {SCHEMA}.queues s
                  WHERE s.name = e.queue AND s.sequence_on_failure = 'skip'))
              AND (e.status = 'running' OR NOT EXISTS (
                  SELECT 1 FROM {SCHEMA}.job_deps d JOIN {SCHEMA}.jobs f ON f.id = d.parent_id
                  WHERE d.child_id = j.id AND d.on_failure = 'run' AND f.status = 'failed'
                    AND f.sequence = j.sequence AND f.id <= e.id)))
        AND NOT EXISTS (
            SELECT 1 FROM {SCHEMA}.jobs e
            WHERE e.sequence = j.sequence AND e.status = 'running' AND e.id > j.id)
        AND NOT EXISTS (
            SELECT 1 FROM {SCHEMA}.jobs e
            WHERE e.status = 'cancelled' AND e.lease_expires_at IS NOT NULL
              AND e.sequence = j.sequence)))"""

# As in sqlaq_0013; a partition's running jobs now count those cancelled while their
# handler runs (ix_jobs_cancelled_held: a few rows).
_NAMED = """j.queue = queue_name AND j.status = 'queued' AND j.priority >= 0
                      AND j.partition = p.partition"""
_UNNAMED = """j.queue = queue_name AND j.status = 'queued' AND j.priority >= 0
                      AND j.partition IS NULL"""
_RUNNING = """(SELECT count(*) FROM {schema}.jobs r
                     WHERE r.queue = queue_name AND r.status = 'running' AND {which}
                       AND NOT EXISTS (
                           SELECT 1 FROM unnest(finishing_ids, finishing_attempts) AS x(id, attempt)
                           WHERE x.id = r.id AND x.attempt = r.attempts))
                    + (SELECT count(*) FROM {schema}.jobs r
                       WHERE r.queue = queue_name AND r.status = 'cancelled'
                         AND r.lease_expires_at IS NOT NULL AND {which})"""
_CANDIDATES = """SELECT j.id, j.priority, j.run_at FROM {schema}.jobs j
                    WHERE {which} AND j.run_at <= now() AND {free}
                    ORDER BY j.partition, j.priority, j.run_at, j.id
                    LIMIT least(want, coalesce(partition_limit - p.running::integer, want))"""

CLAIM_TURNS = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.claim_turns(
    queue_name text, want integer, fair boolean, partition_limit integer,
    aging double precision, finishing_ids bigint[], finishing_attempts integer[]
) RETURNS TABLE (id bigint, turn integer, priority integer) LANGUAGE plpgsql VOLATILE
-- a claim's worth of rows, not the default 1000: the claim statement then joins them to the
-- jobs by primary key (for 1000 it hashed a scan of the whole table: 8 ms at 21,000 jobs)
ROWS 16
-- no JIT: on a table never analyzed the estimates pass jit_above_cost, and compiling the
-- choice took 100 ms a claim for a query that runs in 1 ms
SET jit = off
AS $$
DECLARE
    chosen bigint[];
    ranks integer[];
    locked bigint[];
BEGIN
    IF want IS NULL OR want <= 0 OR NOT (fair OR partition_limit IS NOT NULL OR aging IS NOT NULL)
    THEN
        RETURN;
    END IF;
    -- The claim statement called claim_slots first, which holds this queue's advisory lock to
    -- the claim's commit: claims of this queue take turns, so the jobs are chosen unlocked
    -- (each query here sees what the claim before committed) and only the chosen are locked.
    IF NOT fair AND partition_limit IS NULL THEN
        -- aging alone: the first due jobs of each priority present, by effective priority
        SELECT array_agg(c.id ORDER BY c.n), array_agg(c.rank ORDER BY c.n) INTO chosen, ranks
        FROM (
            WITH RECURSIVE levels(priority) AS (
                (SELECT j.priority FROM {SCHEMA}.jobs j
                 WHERE j.queue = queue_name AND j.status = 'queued'
                 ORDER BY j.priority LIMIT 1)
                UNION ALL
                SELECT (SELECT j.priority FROM {SCHEMA}.jobs j
                        WHERE j.queue = queue_name AND j.status = 'queued'
                          AND j.priority > l.priority
                        ORDER BY j.priority LIMIT 1)
                FROM levels l WHERE l.priority IS NOT NULL
            )
            SELECT a.id, a.rank, row_number() OVER (ORDER BY a.rank, a.run_at, a.id) AS n
            FROM (
                SELECT t.id, t.run_at, greatest(
                    0, t.priority - floor(extract(epoch FROM now() - t.run_at) / aging)
                )::integer AS rank
                FROM levels l CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at FROM {SCHEMA}.jobs j
                    WHERE j.queue = queue_name AND j.priority = l.priority
                      AND j.status = 'queued' AND j.run_at <= now() AND {SEQUENCE_FREE}
                    ORDER BY j.run_at, j.id LIMIT want
                ) t
                WHERE l.priority IS NOT NULL
            ) a
            ORDER BY a.rank, a.run_at, a.id
            LIMIT want
        ) c;
    ELSE
        -- fair or partition-limited: the partitions with a claimable job (a due one no
        -- sequence holds: a partition whose due jobs all wait behind a failed job of their
        -- sequence would stay least served forever and fill the window), their running jobs
        -- (and cancelled ones whose handler has not returned); up
        -- to `want` candidates of each (fewer under the partition limit), in turn order: a
        -- partition's k-th candidate has turn (running + k) / weight, so the partitions with
        -- the fewest running jobs for their weight go first (one from each before a second
        -- from any). A fair claim reads the 2 x `want` least served partitions only.
        SELECT array_agg(c.id ORDER BY c.n), array_agg(c.rank ORDER BY c.n) INTO chosen, ranks
        FROM (
            WITH RECURSIVE found(partition) AS (
                -- the partitions with a queued job, one index probe each
                (SELECT j.partition FROM {SCHEMA}.jobs j
                 WHERE j.queue = queue_name AND j.status = 'queued' AND j.priority >= 0
                   AND j.partition IS NOT NULL
                 ORDER BY j.partition LIMIT 1)
                UNION ALL
                SELECT (SELECT j.partition FROM {SCHEMA}.jobs j
                        WHERE j.queue = queue_name AND j.status = 'queued' AND j.priority >= 0
                          AND j.partition > f.partition
                        ORDER BY j.partition LIMIT 1)
                FROM found f WHERE f.partition IS NOT NULL
            ),
            parts AS (
                SELECT f.partition, false AS unnamed FROM found f WHERE f.partition IS NOT NULL
                UNION ALL  -- the jobs without a partition are one partition of their own
                SELECT NULL, true
            ),
            counted AS (
                -- running jobs per partition; those this statement finishes do not count
                SELECT p.partition, p.unnamed,
                    CASE WHEN p.unnamed
                        THEN ({_RUNNING.format(schema=SCHEMA, which="r.partition IS NULL")})
                        ELSE ({_RUNNING.format(schema=SCHEMA, which="r.partition = p.partition")})
                    END::double precision AS running,
                    coalesce((SELECT w.weight FROM {SCHEMA}.partition_weights w
                              WHERE w.queue = queue_name AND w.partition = p.partition), 1.0)
                        AS weight,
                    (SELECT u.served_at FROM {SCHEMA}.partition_turns u
                     WHERE u.queue = queue_name AND u.partition = coalesce(p.partition, ''))
                        AS served
                FROM parts p
                -- a claimable job: a scalar subquery, probed per partition (an EXISTS may be
                -- planned as one hashed read of every due job of the queue: 20 ms at 100,000)
                WHERE CASE WHEN p.unnamed
                    THEN (SELECT j.id FROM {SCHEMA}.jobs j
                          WHERE {_UNNAMED} AND j.run_at <= now() AND {SEQUENCE_FREE}
                          ORDER BY j.partition, j.priority, j.run_at, j.id LIMIT 1)
                    ELSE (SELECT j.id FROM {SCHEMA}.jobs j
                          WHERE {_NAMED} AND j.run_at <= now() AND {SEQUENCE_FREE}
                          ORDER BY j.partition, j.priority, j.run_at, j.id LIMIT 1)
                END IS NOT NULL
            ),
            eligible AS (
                SELECT c.* FROM counted c
                WHERE partition_limit IS NULL OR c.running < partition_limit
                ORDER BY CASE WHEN fair THEN c.running / c.weight ELSE 0 END,
                    c.served NULLS FIRST, c.partition
                LIMIT CASE WHEN fair THEN 2 * want END
            ),
            picked AS (
                SELECT p.partition, p.running, p.weight, p.served, t.id, t.priority, t.run_at,
                    row_number() OVER (
                        PARTITION BY p.partition ORDER BY t.priority, t.run_at, t.id) AS turn
                FROM eligible p CROSS JOIN LATERAL (
                    SELECT n.* FROM (
                    {_CANDIDATES.format(schema=SCHEMA, which=_NAMED, free=SEQUENCE_FREE)}
                    ) n WHERE NOT p.unnamed
                    UNION ALL
                    SELECT u.* FROM (
                    {_CANDIDATES.format(schema=SCHEMA, which=_UNNAMED, free=SEQUENCE_FREE)}
                    ) u WHERE p.unnamed
                ) t
            )
            SELECT y.id, y.rank, row_number() OVER (
                ORDER BY y.k, y.served NULLS FIRST, y.rank, y.run_at, y.id) AS n
            FROM (
                SELECT x.id, x.run_at, x.served,
                    CASE WHEN fair THEN (x.running + x.turn) / x.weight ELSE 0 END AS k,
                    CASE WHEN aging IS NULL THEN x.priority
                         ELSE greatest(
                             0, x.priority - floor(extract(epoch FROM now() - x.run_at) / aging))
                    END::integer AS rank
                FROM picked x
            ) y
            ORDER BY y.k, y.served NULLS FIRST, y.rank, y.run_at, y.id
            LIMIT want
        ) c;
    END IF;
    -- lock what was chosen; a job another statement locked or changed meanwhile is left.
    -- The status is read from the locked rows: said in the WHERE, it led a planner without
    -- statistics to read the whole queued index (a BitmapAnd) for 16 ids.
    SELECT array_agg(l.id) INTO locked FROM (
        SELECT j.id, j.status FROM {SCHEMA}.jobs j WHERE j.id = ANY(chosen)
        OFFSET 0 FOR UPDATE SKIP LOCKED  -- OFFSET: the status test is not pushed down here
    ) l
    WHERE l.status = 'queued';
    IF fair AND locked IS NOT NULL THEN
        -- when each partition was last served: among partitions with as many running jobs,
        -- the one served longest ago goes first (a worker at -c 1 takes turns too)
        INSERT INTO {SCHEMA}.partition_turns AS u (queue, partition, served_at)
        SELECT queue_name, x.partition, clock_timestamp() FROM (
            SELECT DISTINCT coalesce(j.partition, '') AS partition
            FROM {SCHEMA}.jobs j WHERE j.id = ANY(locked)
        ) x
        ON CONFLICT (queue, partition) DO UPDATE SET served_at = excluded.served_at;
        IF random() < 0.001 THEN  -- now and then, forget partitions not served for a day
            DELETE FROM {SCHEMA}.partition_turns u
            WHERE u.queue = queue_name AND u.served_at < now() - interval '1 day';
        END IF;
    END IF;
    -- Each comes with its turn (its place in the choice) and the priority it has (aged, in an
    -- aging queue), which the claim statement orders by.
    RETURN QUERY
    SELECT c.id, c.n::integer, c.rank
    FROM unnest(chosen, ranks) WITH ORDINALITY AS c(id, rank, n)
    WHERE c.id = ANY(locked);
END
$$
"""


_ENDED_AT_ONCE = """        IF NEW.status IN ('done', 'failed', 'cancelled')
           AND OLD.status NOT IN ('done', 'failed', 'cancelled') THEN
            ended := NEW.status;
"""
_ENDED_WHEN_THE_HANDLER_RETURNS = """        IF NEW.status = 'cancelled' AND OLD.status = 'running'
           AND NEW.lease_expires_at IS NOT NULL THEN
            RETURN NULL;  -- cancelled while its handler runs: it ends when the handler returns
        ELSIF NEW.status IN ('done', 'failed', 'cancelled')
           AND OLD.status NOT IN ('done', 'failed', 'cancelled') THEN
            ended := NEW.status;
        ELSIF NEW.status = 'cancelled' AND OLD.status = 'cancelled'
           AND OLD.lease_expires_at IS NOT NULL AND NEW.lease_expires_at IS NULL THEN
            ended := 'cancelled';  -- the handler of a job cancelled while it ran returned
"""


def _job_ended(before: str) -> str:
    """sqlaq_0014's `job_ended` with a job cancelled while its handler runs ending for its
    dependents when the handler returns (its lease cleared), not when it is cancelled."""
    if before.count(_ENDED_AT_ONCE) != 1:
        raise RuntimeError("sqlaq_0014's job_ended is not the text sqlaq_0015 amends")
    return before.replace(_ENDED_AT_ONCE, _ENDED_WHEN_THE_HANDLER_RETURNS)


# also when the lease of a job cancelled while it ran is cleared: its handler returned
JOB_ENDED_TRIGGER = f"""
DROP TRIGGER job_ended_update ON {SCHEMA}.jobs;
CREATE TRIGGER job_ended_update AFTER UPDATE ON {SCHEMA}.jobs
    FOR EACH ROW WHEN (NEW.has_dependents AND (OLD.status IS DISTINCT FROM NEW.status
        OR (NEW.status = 'cancelled' AND OLD.lease_expires_at IS NOT NULL
            AND NEW.lease_expires_at IS NULL)))
    EXECUTE FUNCTION {SCHEMA}.job_ended();
"""
OLD_JOB_ENDED_TRIGGER = f"""
DROP TRIGGER job_ended_update ON {SCHEMA}.jobs;
CREATE TRIGGER job_ended_update AFTER UPDATE ON {SCHEMA}.jobs
    FOR EACH ROW WHEN (NEW.has_dependents AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {SCHEMA}.job_ended();
"""


def _revision(name: str) -> Any:
    """An earlier revision's module (the texts of the functions it created)."""
    return importlib.import_module(f"sqla_queue.migrations.versions.{name}")


def upgrade() -> None:
    op.execute(CLAIM_TURNS)
    op.execute(_job_ended(_revision("sqlaq_0014_workflow_triggers").JOB_ENDED))
    op.execute(JOB_ENDED_TRIGGER)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SCHEMA}.claim_turns")
    op.execute(_revision("sqlaq_0013_partitions_sequences").CLAIM_TURNS)
    op.execute(_revision("sqlaq_0014_workflow_triggers").JOB_ENDED)
    op.execute(OLD_JOB_ENDED_TRIGGER)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
