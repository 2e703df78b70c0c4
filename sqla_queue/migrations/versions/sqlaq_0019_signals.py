"""sqla-queue: signals, and jobs that wait for them.

- `sqla_queue.signals`, the mailbox: a signal is kept until a waiting job consumes it
  (`wake = 'one'`) or it expires (`wake = 'all'`: read once by every job that waits for its
  key until then).
- `sqla_queue.signal_waits`: each `ctx.wait_for_signal` of a job, its deadline while it
  waits, then what it got (a payload or the timeout), so a later run gets the same answer.
- `jobs.signal_key`: the key a job parked in `waiting` waits for (its `run_at` the
  deadline), with two partial indexes that hold only such jobs.
- The function `sqla_queue.signal(key, payload, wake, expires_in)`, the one implementation
  of sending (`sqla_queue.signal` in Python calls it): it takes a shared advisory lock of
  the key (a waiter parks under the exclusive one, so a signal and a park cannot miss each
  other), writes the signal, and moves the waiting job (or all of them) to `queued` in the
  caller's transaction, with one NOTIFY per queue, delivered on commit.

No foreign key anywhere (a key-share lock on hot job rows would mint MultiXacts). Every new
column is NULL: adding it rewrites no row.

Revision ID: sqlaq_0019_signals
Revises: sqlaq_0017
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0019_signals"
down_revision: str | Sequence[str] | None = "sqlaq_0018_steps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"
SIGNAL_LOCK_SPACE = 1936813171  # the advisory lock namespace of signal keys ('sqls' as an int4)
WAITS_FOR_SIGNAL = "status = 'waiting' AND signal_key IS NOT NULL"

SIGNAL_FUNCTION = f"""
CREATE FUNCTION {SCHEMA}.signal(
    key text,
    payload jsonb DEFAULT NULL,
    wake text DEFAULT 'one',
    expires_in interval DEFAULT interval '7 days'
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    woken integer;
BEGIN
    IF signal.key IS NULL OR length(signal.key) = 0 OR length(signal.key) > 200 THEN
        RAISE EXCEPTION 'sqla_queue.signal: a key must be 1 to 200 characters, got %',
            coalesce(quote_literal(left(signal.key, 40)), 'NULL')
            USING ERRCODE = '22023', HINT = 'name what the signal is about, e.g. ''payment:42''';
    END IF;
    IF signal.wake IS NULL OR signal.wake NOT IN ('one', 'all') THEN
        RAISE EXCEPTION 'sqla_queue.signal: wake must be ''one'' or ''all'', got %',
            coalesce(quote_literal(signal.wake), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF signal.expires_in IS NULL OR signal.expires_in <= interval '0' THEN
        RAISE EXCEPTION 'sqla_queue.signal: expires_in must be a positive interval, got %',
            coalesce(signal.expires_in::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    -- Shared: senders of one key never wait for each other; a waiter parks under the
    -- exclusive lock, so this transaction either sees its park below or it sees the signal.
    PERFORM pg_advisory_xact_lock_shared({SIGNAL_LOCK_SPACE}, hashtext(signal.key));
    INSERT INTO {SCHEMA}.signals (key, payload, wake, expires_at)
    VALUES (signal.key, signal.payload, signal.wake, now() + signal.expires_in);
    WITH chosen AS (
        SELECT j.id FROM {SCHEMA}.jobs j
        WHERE j.status = 'waiting' AND j.signal_key IS NOT NULL AND j.signal_key = signal.key
        ORDER BY j.id
        LIMIT CASE WHEN signal.wake = 'one' THEN 1 END
        FOR UPDATE SKIP LOCKED
    ), promoted AS (
        UPDATE {SCHEMA}.jobs j SET status = 'queued', run_at = now()
        FROM chosen WHERE j.id = chosen.id AND j.status = 'waiting'
        RETURNING j.queue
    )
    SELECT coalesce(sum(n), 0)::integer INTO woken
    FROM (SELECT count(*) AS n, pg_notify('{SCHEMA}', queue) FROM promoted GROUP BY queue) q;
    RETURN woken;
END
$$
"""


def upgrade() -> None:
    # online first (sqla_queue.db.online): the column, then its indexes, concurrently
    online.add_columns("jobs", sa.Column("signal_key", sa.Text()))
    for name, column in (
        ("ix_jobs_signal_key", "signal_key"),
        ("ix_jobs_signal_deadline", "run_at"),
    ):
        online.create_index(name, "jobs", [column], postgresql_where=sa.text(WAITS_FOR_SIGNAL))
    op.create_table(
        "signals",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=True),
        sa.Column("wake", sa.Text(), server_default=sa.text("'one'"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("wake IN ('one', 'all')", name="ck_signals_wake"),
        sa.PrimaryKeyConstraint("id", name="pk_signals"),
        schema=SCHEMA,
    )
    op.create_index("ix_signals_key", "signals", ["key", "id"], schema=SCHEMA)
    op.create_index("ix_signals_expires_at", "signals", ["expires_at"], schema=SCHEMA)
    op.create_table(
        "signal_waits",
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'waiting'"), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("signal_id", sa.BigInteger(), nullable=True),
        sa.Column("payload", postgresql.JSONB(), nullable=True),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('waiting', 'received', 'timed_out')", name="ck_signal_waits_state"
        ),
        sa.PrimaryKeyConstraint("job_id", "key", "seq", name="pk_signal_waits"),
        schema=SCHEMA,
    )
    op.execute(SIGNAL_FUNCTION)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SCHEMA}.signal(text, jsonb, text, interval)")
    op.drop_table("signal_waits", schema=SCHEMA)
    op.drop_index("ix_signals_expires_at", table_name="signals", schema=SCHEMA)
    op.drop_index("ix_signals_key", table_name="signals", schema=SCHEMA)
    op.drop_table("signals", schema=SCHEMA)
    for name in ("ix_jobs_signal_deadline", "ix_jobs_signal_key"):
        op.drop_index(name, table_name="jobs", schema=SCHEMA)
    op.drop_column("jobs", "signal_key", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
