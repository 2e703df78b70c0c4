"""sqla-queue: queues.route (jobs for a broker) and broker_done (consumer de-duplication).

Revision ID: sqlaq_0004
Revises: sqlaq_0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "sqlaq_0004"
down_revision: str | Sequence[str] | None = "sqlaq_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"


def upgrade() -> None:
    op.add_column("queues", sa.Column("route", sa.Text(), nullable=True), schema=SCHEMA)
    op.create_check_constraint(
        op.f("ck_queues_route"),
        "queues",
        "route IS NULL OR route ~ '^(nats|amqp):.'",
        schema=SCHEMA,
    )
    op.create_table(
        "broker_done",
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column(
            "done_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("job_id", name="pk_broker_done"),
        schema=SCHEMA,
    )
    op.create_index("ix_broker_done_done_at", "broker_done", ["done_at"], schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    op.drop_table("broker_done", schema=SCHEMA)
    op.drop_constraint(op.f("ck_queues_route"), "queues", type_="check", schema=SCHEMA)
    op.drop_column("queues", "route", schema=SCHEMA)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
