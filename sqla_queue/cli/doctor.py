"""`sqla-queue doctor`: check the database for the ways a Postgres queue breaks."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from sqla_queue.cli import base
from sqla_queue.cli.base import Command
from sqla_queue.cli.types import DURATION

if TYPE_CHECKING:
    from sqla_queue.doctor import Finding


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
    "--worker-role",
    default=None,
    help="The role your workers log in as: check it has every privilege a worker needs.",
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
    worker_role: str | None,
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
        worker_role=worker_role,
    )
    engine = base.engine(database_url)
    try:
        findings = diagnose(engine, options)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps([finding.as_dict() for finding in findings], indent=2))
    elif not _on_a_terminal():
        for line in findings_as_lines(findings):
            click.echo(line)
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


PLAIN_WIDTH = 100
"""Columns of doctor's text off a terminal (a pipe, a file, CI): each finding's value and
fix wrap to it, a command in backticks never split."""
_SEVERITY_WIDTH = len("critical") + 2


def _on_a_terminal() -> bool:
    from rich.console import Console

    return Console().is_terminal


def findings_as_lines(findings: Sequence[Finding]) -> list[str]:
    """Doctor's findings as plain text for a pipe or a file: per finding, a line
    `SEVERITY  check: value`, then `fix: ...` unless it is ok, each wrapped to
    `PLAIN_WIDTH` columns under its first line (a `command` in backticks kept whole)."""
    from sqla_queue.doctor import Severity

    lines: list[str] = []
    indent = " " * _SEVERITY_WIDTH
    for finding in findings:
        head = f"{finding.severity.value:<{_SEVERITY_WIDTH}}{finding.name}: {finding.value}"
        lines += _wrapped(head, indent)
        if finding.severity is not Severity.ok and finding.fix:
            lines += _wrapped(f"{indent}fix: {finding.fix}", indent + "     ")
    return lines


_KEPT_SPACE = "\0"
"""Stands for a space inside a backticked command while the text is wrapped."""


def _wrapped(text: str, indent: str) -> list[str]:
    kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", _KEPT_SPACE), text)
    lines = textwrap.wrap(
        kept,
        PLAIN_WIDTH,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(_KEPT_SPACE, " ") for line in lines] or [text]
