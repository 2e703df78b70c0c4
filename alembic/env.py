"""This repository's Alembic environment: the same revisions `sqla-queue migrate` applies."""

from sqla_queue.db.migrate import run_alembic_env

run_alembic_env()
