"""`sqla-queue signal`: send a signal from the shell (an operator's approval, a test)."""

from __future__ import annotations

import click

from sqla_queue.cli import base
from sqla_queue.cli.base import Command
from sqla_queue.cli.types import Duration
from sqla_queue.job.validation import MAX_SIGNAL_SECONDS

EXPIRES_IN = Duration(1.0, MAX_SIGNAL_SECONDS)


@click.command(cls=Command)
@click.argument("key")
@click.option(
    "--payload",
    "payload_json",
    default="null",
    show_default=True,
    help="The payload as JSON: what the waiting handler's wait_for_signal returns.",
)
@click.option(
    "--wake",
    type=click.Choice(["one", "all"]),
    default="one",
    show_default=True,
    help="one: the oldest waiting job is woken and consumes it; all: every waiting job is "
    "woken, and each job that waits for KEY until it expires reads it once.",
)
@click.option(
    "--expires-in",
    type=EXPIRES_IN,
    default="7d",
    show_default=True,
    help="How long the signal is kept for a job that has not waited yet (90s, 15m, 12h, 7d).",
)
def signal(
    database_url: str | None, key: str, payload_json: str, wake: str, expires_in: float
) -> None:
    """Send signal KEY (its payload as --payload JSON) and print how many waiting jobs it
    woke; with none waiting it is kept for the first job that waits for KEY."""
    from sqla_queue.enqueue.signals import signal as send

    payload = base.json_option(payload_json, "--payload")
    with base.transaction(database_url) as conn:
        try:
            woken = send(
                conn, key, payload, wake="all" if wake == "all" else "one", expires_in=expires_in
            )
        except ValueError as exc:
            raise click.BadParameter(
                str(exc).removeprefix("signal(): "), param_hint="KEY"
            ) from None
    click.echo(f"signal {key!r} sent: woke {woken} job(s)")
