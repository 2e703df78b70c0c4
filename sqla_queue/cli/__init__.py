"""`sqla-queue`: migrate, run workers, enqueue, manage queues, look at the queue.

One module per command group; `base.Command` gives each command `--database-url` and the
friendly error lines, so a new command is a function in the module of its group."""

from __future__ import annotations

import click

from sqla_queue.cli import base
from sqla_queue.cli.base import Group
from sqla_queue.cli.brokers import relay
from sqla_queue.cli.dashboard import dashboard
from sqla_queue.cli.doctor import doctor
from sqla_queue.cli.embedded import embedded
from sqla_queue.cli.jobs import enqueue, jobs
from sqla_queue.cli.migrate import alembic_group, migrate
from sqla_queue.cli.periodic import periodic
from sqla_queue.cli.queues import prune, queues, stats
from sqla_queue.cli.worker import WORKER_APPLICATION_NAME, worker
from sqla_queue.cli.workers import workers
from sqla_queue.db.database import URL_ENV_VAR

__all__ = ["WORKER_APPLICATION_NAME", "main"]


@click.group(cls=Group)
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


for _command in (
    migrate,
    worker,
    workers,
    relay,
    enqueue,
    queues,
    stats,
    prune,
    jobs,
    periodic,
    doctor,
    dashboard,
    alembic_group,
    embedded,
):
    main.add_command(_command)
