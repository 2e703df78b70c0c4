"""`sqla-queue embedded`: the embedded PostgreSQL used when no database URL is given."""

from __future__ import annotations

import click

from sqla_queue.cli.base import Group


@click.group(cls=Group)
def embedded() -> None:
    """The embedded PostgreSQL used when no database URL is given."""


_EMBEDDED_DIR = click.option(
    "--data-dir",
    envvar="SQLA_QUEUE_EMBEDDED_DIR",
    default=None,
    help="Its data folder (default .sqla_queue/pgdata).",
)


@embedded.command("url", database=False)
@_EMBEDDED_DIR
def embedded_url_command(data_dir: str | None) -> None:
    """Start the embedded server unless it runs, and print its URL (it keeps running)."""
    from sqla_queue.db.database import embedded_url

    click.echo(embedded_url(data_dir))


@embedded.command("stop", database=False)
@_EMBEDDED_DIR
def embedded_stop(data_dir: str | None) -> None:
    """Stop the embedded server (it keeps running between commands)."""
    from sqla_queue.db.database import stop_embedded

    click.echo("stopped" if stop_embedded(data_dir) else "no embedded server runs there")
