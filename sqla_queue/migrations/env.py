"""Alembic environment for sqla-queue's own revisions (used by `sqla-queue migrate`)."""

from sqla_queue.db.migrate import run_alembic_env

run_alembic_env()
