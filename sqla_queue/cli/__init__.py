"""`sqla-queue`: migrate, run workers, enqueue, manage queues, look at the queue.

One module per command group; `base.Command` gives each command `--database-url` and the
friendly error lines, so a new command is a function in the module of its group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from sqla_queue.cli import base
from sqla_queue.cli.base import LazyGroup
from sqla_queue.db.database import URL_ENV_VAR

if TYPE_CHECKING:
    from sqla_queue.cli.worker import WORKER_APPLICATION_NAME

__all__ = ["WORKER_APPLICATION_NAME", "main"]

COMMANDS = {
    "alembic": (
        "sqla_queue.cli.migrate:alembic_group",
        "sqla-queue's schema in your application's own Alembic environment.",
    ),
    "dashboard": (
        "sqla_queue.cli.dashboard:dashboard",
        "Serve the web dashboard: queues, jobs, workers, doctor; retry, cancel, delete, pause.",
    ),
    "doctor": (
        "sqla_queue.cli.doctor:doctor",
        "Check the database for the ways a Postgres queue breaks: MultiXacts, vacuum pinned "
        "by long transactions, bloat, stuck and overdue jobs.",
    ),
    "embedded": (
        "sqla_queue.cli.embedded:embedded",
        "The embedded PostgreSQL used when no database URL is given.",
    ),
    "enqueue": (
        "sqla_queue.cli.jobs:enqueue",
        "Enqueue one job of TASK and print its id (with --unique, a duplicate's: the job "
        "already there).",
    ),
    "jobs": ("sqla_queue.cli.jobs:jobs", "Act on single jobs."),
    "migrate": (
        "sqla_queue.cli.migrate:migrate",
        "Create or upgrade the sqla_queue schema (the package's own Alembic revisions).",
    ),
    "periodic": (
        "sqla_queue.cli.periodic:periodic",
        "Periodic jobs: their schedules, next and last runs.",
    ),
    "prune": ("sqla_queue.cli.queues:prune", "Delete finished jobs older than --older-than."),
    "queues": ("sqla_queue.cli.queues:queues", "Create, list, pause, resume and delete queues."),
    "relay": (
        "sqla_queue.cli.brokers:relay",
        "Move committed jobs of routed queues to their broker (--nats URL or --amqp URL).",
    ),
    "signal": (
        "sqla_queue.cli.signals:signal",
        "Send signal KEY (its payload as --payload JSON) and print how many waiting jobs it "
        "woke; with none waiting it is kept for the first job that waits for KEY.",
    ),
    "stats": (
        "sqla_queue.cli.queues:stats",
        "Jobs per queue and status (`running`: handlers at work; `claimed`: held by a worker, "
        "its handler not started), the oldest due job's age, and the jobs ended (and failed) "
        "in the last hour and day, from the workers' rollup (`job_counts`); then the deepest "
        "partitions of fair and partition-limited queues, the sequences held by a failed job "
        "and the aged jobs of aging queues, where there are any.",
    ),
    "worker": (
        "sqla_queue.cli.worker:worker",
        "Run jobs until SIGTERM/SIGINT (a second signal exits at once), or, with --burst, "
        "until nothing is due.",
    ),
    "workers": (
        "sqla_queue.cli.workers:workers",
        "The live workers, and the workers that stopped in the last day.",
    ),
}
"""Each command: where it is (imported when it is used, `LazyGroup`) and the first sentence
of its help, which `sqla-queue --help` lists (tests/test_import_time.py holds them equal)."""


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.version_option(package_name="sqla-queue")
@click.option(
    "--database-url",
    default=None,
    help=f"PostgreSQL URL for the command that follows (or its own --database-url, or "
    f"{URL_ENV_VAR}).",
)
@base.log_format_option
@click.pass_context
def main(ctx: click.Context, database_url: str | None, log_format: str | None) -> None:
    """sqla-queue: a PostgreSQL job queue for SQLAlchemy applications."""
    ctx.obj = {"database_url": database_url, "log_format": log_format}
    if log_format == "json":  # every command's log records, as JSON lines on stderr
        base.configure_logging("warning", log_format)


def __getattr__(name: str) -> Any:
    if name == "WORKER_APPLICATION_NAME":  # the worker command's module, imported on use
        from sqla_queue.cli import worker

        return worker.WORKER_APPLICATION_NAME
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
