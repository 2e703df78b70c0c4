"""`sqla-queue periodic`: periodic tasks' schedules, next and last runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from sqla_queue.cli import base
from sqla_queue.cli.base import Group


@click.group(cls=Group)
def periodic() -> None:
    """Periodic jobs: their schedules, next and last runs."""


@periodic.command("list")
@click.option("--app", "app_path", required=True, help="The task registry, as pkg.module:name.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
def periodic_list(database_url: str | None, app_path: str, as_json: bool) -> None:
    """Each periodic task of the registry: its schedule, next run, and last run (by anyone)."""
    from sqla_queue.worker.periodic import schedule_states

    registry = base.app_registry(app_path)  # as `worker --app` finds the app
    with base.transaction(database_url) as conn:
        states = schedule_states(conn, registry)
    if as_json:
        base.echo_json([{k: _iso(v) for k, v in dataclasses.asdict(s).items()} for s in states])
        return
    if not states:
        click.echo(
            f"{app_path} has no periodic tasks (register one with @registry.periodic; in "
            "another module? name it in Registry(include=[...]))"
        )
        return
    from rich.table import Table

    table = Table("task", "schedule", "next run", "last run", "last job")
    for state in states:
        table.add_row(
            state.task,
            state.schedule,
            str(state.next_run),
            "never" if state.last_run is None else str(state.last_run),
            "" if state.last_job_id is None else str(state.last_job_id),
        )
    base.print_table(table)


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value
