"""`sqla-queue doctor`: check the database for the ways a Postgres queue breaks."""

from __future__ import annotations

import json
import sys

import click

from sqla_queue.durations import DURATION

from . import base
from .base import Command


@click.command(cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option(
    "--stuck-after",
    type=DURATION,
    default="60",
    show_default=True,
    help="Grace for stuck jobs (past their lease, or held by a dead worker): overdue by twice "
    "this is critical (60, 90s, 5m).",
)
@base.deprecated_alias("--lease", "--stuck-after", "stuck_after", type=DURATION, default=None)
@click.option(
    "--backlog-threshold",
    type=DURATION,
    default="300",
    show_default=True,
    help="Queued jobs more than this past their run_at are backlog (300, 5m, 1h).",
)
@click.option(
    "--long-transaction",
    type=DURATION,
    default="60",
    show_default=True,
    help="A transaction open longer than this warns (ten times as long: critical).",
)
@click.option(
    "--sample",
    type=DURATION,
    default=1.0,
    show_default=True,
    help="Seconds to watch the MultiXact counter (0 skips it).",
)
@click.option(
    "--show-queries",
    is_flag=True,
    help="Include other sessions' SQL text in --json details (it may hold their secrets).",
)
def doctor(
    database_url: str | None,
    as_json: bool,
    stuck_after: float,
    backlog_threshold: float,
    long_transaction: float,
    sample: float,
    show_queries: bool,
) -> None:
    """Check the database for the ways a Postgres queue breaks: MultiXacts, vacuum pinned
    by long transactions, bloat, stuck and overdue jobs. Exit status 1 if any is critical."""
    from sqla_queue.doctor import DoctorOptions, Severity, diagnose, worst

    options = DoctorOptions(
        stuck_after=stuck_after,
        backlog_threshold=backlog_threshold,
        long_transaction=long_transaction,
        sample=sample,
        show_queries=show_queries,
    )
    engine = base.engine(database_url)
    try:
        findings = diagnose(engine, options)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps([finding.as_dict() for finding in findings], indent=2))
    else:
        from rich.table import Table

        colours = {Severity.ok: "green", Severity.warn: "yellow", Severity.critical: "bold red"}
        table = Table("check", "severity", "value", "fix", show_lines=True)
        for finding in findings:
            severity = f"[{colours[finding.severity]}]{finding.severity.value}[/]"
            shown_fix = "" if finding.severity is Severity.ok else finding.fix
            table.add_row(finding.name, severity, finding.value, shown_fix)
        base.print_table(table)
    if worst(findings) is Severity.critical:
        sys.exit(1)
