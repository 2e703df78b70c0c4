"""sqla-queue: CHECK constraints for what enqueue validates (names, args, priority).

Names are held to their length (that they are printable is checked in Python only: a
regular expression per row doubled the cost of these checks), args to a JSON object of at
most 1,000,000 bytes as text, priority to 0..32767.

Enqueue checks these in Python first, with clearer messages; the constraints hold them for
every other writer too (`job.args = ...` after construction, a Core `insert(Job)`, SQL).
A row written before this revision that breaks one makes the upgrade fail, naming the
constraint: fix or delete that row, then upgrade again.

Revision ID: sqlaq_0003
Revises: sqlaq_0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqla_queue.db import online

revision: str = "sqlaq_0003"
down_revision: str | Sequence[str] | None = "sqlaq_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
migration_kind = "expand"

SCHEMA = "sqla_queue"


def _name(column: str) -> str:
    # 1 to 200 characters (sqla_queue.limits.max_name_length's ceiling).
    return f"char_length({column}) BETWEEN 1 AND 200"


CHECKS = {
    "jobs": {
        "ck_jobs_task_name": _name("task"),
        "ck_jobs_queue_name": _name("queue"),
        "ck_jobs_args_object": "jsonb_typeof(args) = 'object'",
        "ck_jobs_args_size": "octet_length(args::text) <= 1000000",
        "ck_jobs_priority": "priority BETWEEN 0 AND 32767",
    },
    "queues": {"ck_queues_name": _name("name")},
}


def upgrade() -> None:
    # NOT VALID, then validated apart: writers are not held while every row is read
    for table, checks in CHECKS.items():
        for name, condition in checks.items():
            online.add_check(table, name, condition)
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {revision}'")


def downgrade() -> None:
    for table, checks in CHECKS.items():
        for name in checks:
            op.execute(f"ALTER TABLE {SCHEMA}.{table} DROP CONSTRAINT IF EXISTS {name}")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'sqla_queue revision {down_revision}'")
