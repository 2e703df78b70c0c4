"""`sqla-queue relay`: move routed queues' jobs to their broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from sqla_queue.brokers.kinds import BROKER_KINDS
from sqla_queue.brokers.relay import RelayConfig
from sqla_queue.cli import base
from sqla_queue.cli.base import Command
from sqla_queue.cli.types import DURATION, count
from sqla_queue.job.validation import MAX_BATCH

F = TypeVar("F", bound=Callable[..., Any])


def _broker_url_options(func: F) -> F:
    """One --KIND URL option per broker kind (`--nats`, `--amqp`), from `BROKER_KINDS`."""
    for kind in reversed(BROKER_KINDS.values()):
        func = click.option(
            f"--{kind.name}",
            f"{kind.name}_url",
            default=None,
            help=f"The {kind.name} broker, e.g. {kind.example_url}.",
        )(func)
    return func


@click.command(cls=Command)
@_broker_url_options
@click.option(
    "--batch",
    type=count(1, MAX_BATCH),
    default=base.config_default(RelayConfig, "batch"),
    show_default=True,
    help="Jobs per transaction.",
)
@click.option(
    "--poll-interval",
    type=DURATION,
    default=base.config_default(RelayConfig, "poll_interval"),
    show_default=True,
)
@click.option(
    "--publish-timeout",
    type=DURATION,
    default=base.config_default(RelayConfig, "publish_timeout"),
    show_default=True,
)
@click.option(
    "--duplicate-window",
    type=DURATION,
    default=base.config_default(RelayConfig, "duplicate_window"),
    show_default=True,
    help="NATS: seconds a stream the relay creates remembers message ids.",
)
@click.option("--burst", is_flag=True, help="Exit when nothing is due.")
@click.option("--poll-only", is_flag=True, help="No LISTEN (PgBouncer transaction pooling).")
@base.log_level_option
def relay(
    database_url: str | None,
    batch: int,
    poll_interval: float,
    publish_timeout: float,
    duplicate_window: float,
    burst: bool,
    poll_only: bool,
    log_level: str,
    **broker_urls: str | None,
) -> None:
    """Move committed jobs of routed queues to their broker (--nats URL or --amqp URL)."""
    from sqla_queue.cli.broker_runs import run_relay

    given = [url for url in broker_urls.values() if url is not None]
    if len(given) != 1:
        choices = " or ".join(f"--{kind} URL" for kind in BROKER_KINDS)
        raise click.ClickException(f"pass exactly one of {choices}")
    base.configure_logging(log_level)
    engine = base.engine(database_url, application_name="sqla-queue relay")
    config = base.config_from(RelayConfig, broker_url=given[0])
    stats = run_relay(engine, config)
    if burst:
        click.echo(f"done: {stats.published} published, {stats.duplicates} duplicates", err=True)
