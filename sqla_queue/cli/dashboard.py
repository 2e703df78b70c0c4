"""`sqla-queue dashboard`: serve the web dashboard."""

from __future__ import annotations

import click

from sqla_queue.cli import base
from sqla_queue.cli.base import Command
from sqla_queue.cli.types import PORT


@click.command(cls=Command)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=PORT, default=8080, show_default=True)
@click.option(
    "--auth",
    envvar="SQLA_QUEUE_DASHBOARD_AUTH",
    show_envvar=True,
    default=None,
    help="user:password (HTTP Basic) or a token (Bearer, or the Basic password). Required "
    "on a host other than loopback.",
)
@click.option("--read-only", is_flag=True, help="Hide and refuse retry, cancel, delete, pause.")
def dashboard(
    database_url: str | None, host: str, port: int, auth: str | None, read_only: bool
) -> None:
    """Serve the web dashboard: queues, jobs, workers, doctor; retry, cancel, delete, pause."""
    try:
        import uvicorn

        from sqla_queue.dashboard import Auth, check_exposure, create_app
    except ImportError:
        raise click.ClickException(
            "the dashboard needs its extra: pip install 'sqla-queue[dashboard]'"
        ) from None
    credentials = Auth.parse(auth) if auth is not None else None
    check_exposure(host, credentials)
    engine = base.engine(database_url, application_name="sqla-queue dashboard")
    from sqla_queue.db.migrate import check_schema

    check_schema(engine)
    app = create_app(engine, read_only=read_only, auth=credentials)
    click.echo(f"sqla-queue dashboard on http://{host}:{port}/", err=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.dispose()
