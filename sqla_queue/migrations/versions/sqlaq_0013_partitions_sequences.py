"""sqla-queue: partitions (fair queues, per-partition limits), sequences and priority aging.

- `jobs.partition` and `jobs.sequence` (text, NULL when not given; also on the archive): the
  tenant a job is for (`enqueue(..., partition="tenant-42")`), and the key of the jobs that
  run one at a time in enqueue order (`enqueue(..., sequence="order-42")`).
- `queues.fair`: claims take due jobs round-robin across the queue's partitions;
  `queues.partition_limit`: at most so many running jobs per partition, across all workers;
  `queues.aging` (seconds): a waiting job's priority improves one step per interval;
  `queues.sequence_on_failure`: whether a failed job holds its sequence (`hold`) or not.
- `partition_weights`: a partition's share of a fair queue (1 when it has no row);
  `partition_turns`: when a fair queue last served each partition (`''` for the jobs without
  one), written by `claim_turns`, so partitions with as many running jobs take turns. No
  foreign key (its rows are written by every claim: a key-share lock on the queue's row
  would mint MultiXacts); rows not served for a day are forgotten.
- `ix_jobs_partition_claim` reads a fair queue's partitions and each one's first due jobs
  (every queued job has an entry, so a job without a partition is found too). Its predicate
  says `priority >= 0`, true of every row (`ck_jobs_priority`) but stated by no query other
  than `claim_turns`: the planner may use an index only for a query that implies its
  predicate, so the FIFO claim never trades `ix_jobs_claim` for it (on a table never
  analyzed it did, and sorted 100,000 due jobs per claim);
  `ix_jobs_partition_running` counts a partition's running jobs; `ix_jobs_sequence` finds
  the jobs of a sequence that hold it.
- `sqla_queue.claim_turns`: the claim of a fair, partition-limited or aging queue, called
  by the claim statement (as `claim_slots` is) once per such queue with a due job, after
  `claim_slots` took that queue's lock (so claims of the queue take turns); it counts with a
  fresh snapshot, chooses the jobs without locking them, then locks the chosen ones (FOR
  UPDATE SKIP LOCKED) and returns their ids.

Every new column is NULL or has a constant default: adding them rewrites no row. The new
indexes are built in the migration's transaction (not CONCURRENTLY): on a large queued
backlog, run it in a quiet moment.

Revision ID: sqlaq_0013
Revises: sqlaq_0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0013"
down_revision: str | Sequence[str] | None = "sqlaq_0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"

PARTITION_CLAIM = "status = 'queued' AND priority >= 0"
HOLDS_SEQUENCE = "sequence IS NOT NULL AND status IN ('queued', 'running', 'waiting', 'failed')"

# The condition a claimable job of a sequence meets (the same text as
# `sqla_queue.db.queries.claim.sequence_free`): no earlier job of its sequence is queued,
# running, waiting, or failed in a queue that holds sequences on failure, and no later one
# runs (an earlier job retried while a later one runs waits for it). Two probes, each an
# index condition on all of ix_jobs_sequence's columns (sequence, status, id): an earlier
# job reads only the earlier jobs, a head of its sequence none.
SEQUENCE_FREE = f"""(j.sequence IS NULL OR (NOT EXISTS (
            SELECT 1 FROM {SCHEMA}.jobs e
            WHERE e.sequence = j.sequence
              AND e.status IN ('queued', 'running', 'waiting', 'failed') AND e.id < j.id
              AND (e.status <> 'failed' OR NOT EXISTS (
                  SELECT 1 FROM {SCHEMA}.queues s
                  WHERE s.name = e.queue AND s.sequence_on_failure = 'skip')))
        AND NOT EXISTS (
            SELECT 1 FROM {SCHEMA}.jobs e
            WHERE e.sequence = j.sequence AND e.status = 'running' AND e.id > j.id)))"""

# A partition's queued rows, named (`{named}`) or without a partition (`{unnamed}`): two
# queries each reading ix_jobs_partition_claim in order (an OR of the two could not), of which
# only the one for the partition at hand runs (CASE; or a one-time filter). `priority >= 0`
# states the index's predicate, and each orders by `partition` first (one value: the same
# order), which only that index gives: ordered by priority, a planner without statistics
# read ix_jobs_claim and filtered every job of the queue for `partition IS NULL`.
_NAMED = """j.queue = queue_name AND j.status = 'queued' AND j.priority >= 0
                      AND j.partition = p.partition"""
_UNNAMED = """j.queue = queue_name AND j.status = 'queued' AND j.priority >= 0
                      AND j.partition IS NULL"""
_RUNNING = """SELECT count(*) FROM {schema}.jobs r
                     WHERE r.queue = queue_name AND r.status = 'running' AND {which}
                       AND NOT EXISTS (
                           SELECT 1 FROM unnest(finishing_ids, finishing_attempts) AS x(id, attempt)
                           WHERE x.id = r.id AND x.attempt = r.attempts)"""
_CANDIDATES = """SELECT j.id, j.priority, j.run_at FROM {schema}.jobs j
                    WHERE {which} AND j.run_at <= now() AND {free}
                    ORDER BY j.partition, j.priority, j.run_at, j.id
                    LIMIT least(want, coalesce(partition_limit - p.running::integer, want))"""


CLAIM_TURNS = f"""
CREATE FUNCTION {SCHEMA}.claim_turns(
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
        -- fair or partition-limited: the partitions with a due job, their running jobs; up
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
                -- a due job: a scalar subquery, probed per partition (an EXISTS may be
                -- planned as one hashed read of every due job of the queue: 20 ms at 100,000)
                WHERE CASE WHEN p.unnamed
                    THEN (SELECT j.id FROM {SCHEMA}.jobs j
                          WHERE {_UNNAMED} AND j.run_at <= now()
                          ORDER BY j.partition, j.priority, j.run_at, j.id LIMIT 1)
                    ELSE (SELECT j.id FROM {SCHEMA}.jobs j
                          WHERE {_NAMED} AND j.run_at <= now()
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


def upgrade() -> None:
    # online first (sqla_queue.db.online): the columns, then the indexes, concurrently
    for table in ("jobs", "jobs_archive"):
        online.add_columns(
            table, sa.Column("partition", sa.Text()), sa.Column("sequence", sa.Text())
        )
    online.create_index(
        "ix_jobs_partition_claim",
        "jobs",
        ["queue", "partition", "priority", "run_at", "id"],
        postgresql_where=sa.text(PARTITION_CLAIM),
    )
    online.create_index(
        "ix_jobs_partition_running",
        "jobs",
        ["queue", "partition"],
        postgresql_where=sa.text("status = 'running' AND partition IS NOT NULL"),
    )
    online.create_index(
        "ix_jobs_sequence",
        "jobs",
        ["sequence", "status", "id"],
        postgresql_where=sa.text(HOLDS_SEQUENCE),
    )
    op.add_column(
        "queues",
        sa.Column("fair", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        schema=SCHEMA,
    )
    op.add_column("queues", sa.Column("partition_limit", sa.Integer()), schema=SCHEMA)
    op.add_column("queues", sa.Column("aging", sa.Float()), schema=SCHEMA)
    op.add_column(
        "queues",
        sa.Column(
            "sequence_on_failure", sa.Text(), server_default=sa.text("'hold'"), nullable=False
        ),
        schema=SCHEMA,
    )
    op.create_check_constraint(
        op.f("ck_queues_partition_limit"), "queues", "partition_limit > 0", schema=SCHEMA
    )
    op.create_check_constraint(op.f("ck_queues_aging"), "queues", "aging > 0", schema=SCHEMA)
    op.create_check_constraint(
        op.f("ck_queues_sequence_on_failure"),
        "queues",
        "sequence_on_failure IN ('hold', 'skip')",
        schema=SCHEMA,
    )
    op.create_table(
        "partition_weights",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.CheckConstraint(
            "weight > 0 AND weight <= 1000", name=op.f("ck_partition_weights_weight")
        ),
        sa.ForeignKeyConstraint(
            ["queue"],
            [f"{SCHEMA}.queues.name"],
            name=op.f("fk_partition_weights_queue_queues"),
            onupdate="CASCADE",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("queue", "partition", name=op.f("pk_partition_weights")),
        schema=SCHEMA,
    )
    op.create_table(
        "partition_turns",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("served_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("queue", "partition", name=op.f("pk_partition_turns")),
        schema=SCHEMA,
    )
    op.execute(CLAIM_TURNS)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SCHEMA}.claim_turns")
    for index in ("ix_jobs_sequence", "ix_jobs_partition_running", "ix_jobs_partition_claim"):
        op.drop_index(index, table_name="jobs", schema=SCHEMA)
    op.drop_table("partition_turns", schema=SCHEMA)
    op.drop_table("partition_weights", schema=SCHEMA)
    for name in ("ck_queues_sequence_on_failure", "ck_queues_aging", "ck_queues_partition_limit"):
        op.drop_constraint(name, "queues", schema=SCHEMA)
    for column in ("sequence_on_failure", "aging", "partition_limit", "fair"):
        op.drop_column("queues", column, schema=SCHEMA)
    for table in ("jobs", "jobs_archive"):
        op.drop_column(table, "sequence", schema=SCHEMA)
        op.drop_column(table, "partition", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
