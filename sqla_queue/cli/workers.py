"""`sqla-queue workers`: the live workers, and the ones that stopped in the last day."""

from __future__ import annotations

import click

from sqla_queue.admin import workers as admin_workers
from sqla_queue.cli import base
from sqla_queue.cli.base import Group
from sqla_queue.cli.types import count


@click.group(cls=Group)
def workers() -> None:
    """The live workers, and the workers that stopped in the last day."""


@workers.command("list")
@click.option(
    "--stopped",
    is_flag=True,
    help="The workers that stopped in the last day instead, the latest first, and how: "
    "graceful (a clean stop) or lost (its registration expired: killed, crashed, cut off).",
)
@click.option(
    "--limit",
    type=count(),
    default=admin_workers.MAX_STOPPED,
    show_default=True,
    help="With --stopped: at most this many.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
def workers_list(database_url: str | None, stopped: bool, limit: int, as_json: bool) -> None:
    """The live workers: host, pid, queues, concurrency, running jobs (handlers started),
    claimed jobs (held, not started yet), version (and the schema revision it was built
    for), last heartbeat."""
    rows: list[tuple[admin_workers.WorkerInfo, list[str]]]
    with base.transaction(database_url) as conn:
        if stopped:
            gone = admin_workers.stopped_workers(conn, limit)
            rows = [
                (g, [str(g.pid), _queues(g.queues), str(g.started_at), str(g.stopped_at), g.how,
                     str(g.heartbeat_at)])
                for g in gone
            ]  # fmt: skip
            columns = ["pid", "queues", "started", "stopped", "how", "last heartbeat"]
            none = "no worker stopped in the last day"
        else:
            live = admin_workers.live_workers(conn)
            rows = [
                (w, [str(w.pid), _queues(w.queues), str(w.concurrency), str(w.running),
                     str(w.claimed), _version(w), str(w.started_at),
                     f"{w.silent_seconds:.1f} s ago"])
                for w in live
            ]  # fmt: skip
            columns = [
                "pid", "queues", "concurrency", "running", "claimed", "version", "started",
                "last beat"
            ]  # fmt: skip
            none = "no live worker is registered (`workers list --stopped`: the ones that stopped)"
    if as_json:
        base.echo_json([worker.as_dict() for worker, _ in rows])
    elif not rows:
        click.echo(none)
    else:
        from rich.table import Table

        table = Table("id", "host", *columns)
        for worker, cells in rows:
            table.add_row(worker.id, worker.hostname, *cells)
        base.print_table(table)


def _version(worker: admin_workers.LiveWorker) -> str:
    """Its package version and the schema revision it was built for."""
    return f"{worker.version or 'before 0.2'} ({worker.schema_revision or '?'})"


def _queues(names: list[str] | None) -> str:
    return "all" if names is None else ", ".join(names)
