"""`sqla-queue queues`, `stats` and `prune`: queues, their settings and their finished jobs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click
from rich.markup import escape
from sqlalchemy import Connection

from sqla_queue import admin
from sqla_queue.admin import partitions
from sqla_queue.brokers.kinds import BROKER_KINDS
from sqla_queue.cli import base
from sqla_queue.cli.base import Command, Group
from sqla_queue.cli.types import DURATION, RATE, count
from sqla_queue.db import rollup
from sqla_queue.db.models import JobStatus, Retention
from sqla_queue.job.states import COUNTED
from sqla_queue.job.validation import check_partition, describe_age, describe_duration


@click.group(cls=Group)
def queues() -> None:
    """Create, list, pause, resume and delete queues."""


_ROUTE_HELP = (
    "Send its jobs to a broker: "
    + " or ".join(kind.route_form for kind in BROKER_KINDS.values())
    + " (see relay)."
)
_MAX_RUNNING_HELP = (
    "At most N of its jobs run at once, across all workers (a worker's own -c/--concurrency "
    "is its threads)."
)
_RATE_HELP = (
    "At most COUNT of its jobs start per window, across all workers: 100/s, 10/min, 20/30s."
)
_RESULT_TTL_HELP = "How long kept results stay readable when the queue deletes jobs (default 1d)."
_FAIR_HELP = (
    "Claims take turns between the queue's partitions (enqueue --partition): one job from "
    "each before a second from any; --no-fair: first in, first out."
)
_PARTITION_LIMIT_HELP = "At most N running jobs per partition, across all workers."
_AGING_HELP = (
    "A waiting job's priority improves one step per interval (5m, 30s), so low priority "
    "never starves."
)
_SEQUENCE_HELP = (
    "Whether a failed job of a sequence holds it until retried or deleted "
    "(hold, the default) or the sequence goes on past it (skip)."
)


def _turn_options(command: Any) -> Any:
    """The options of fair, partition-limited and aging queues (`queues create`, `set`)."""
    for option in reversed(
        (
            click.option("--fair/--no-fair", default=None, help=_FAIR_HELP),
            click.option(
                "--partition-limit", type=count(), default=None, help=_PARTITION_LIMIT_HELP
            ),
            click.option("--no-partition-limit", is_flag=True, help="Lift the partition limit."),
            click.option("--aging", type=DURATION, default=None, help=_AGING_HELP),
            click.option("--no-aging", is_flag=True, help="Priorities stay as enqueued."),
            click.option(
                "--sequence-on-failure",
                type=click.Choice(partitions.SEQUENCE_POLICIES),
                default=None,
                help=_SEQUENCE_HELP,
            ),
        )
    ):
        command = option(command)
    return command


def _apply_turns(conn: Connection, name: str, turns: dict[str, Any]) -> None:
    """Apply the options `_turn_options` gave (a given value and its --no- form refused)."""
    for option in ("partition_limit", "aging"):
        if turns.get(option) is not None and turns.get(f"no_{option}"):
            flag = option.replace("_", "-")
            raise click.UsageError(f"pass --{flag} or --no-{flag}, not both")
    if turns.get("fair") is not None:
        partitions.set_fair(conn, name, turns["fair"])
    if turns.get("partition_limit") is not None or turns.get("no_partition_limit"):
        partitions.set_partition_limit(conn, name, turns.get("partition_limit"))
    if turns.get("aging") is not None or turns.get("no_aging"):
        partitions.set_aging(conn, name, turns.get("aging"))
    if turns.get("sequence_on_failure") is not None:
        partitions.set_sequence_on_failure(conn, name, turns["sequence_on_failure"])


def _apply_limits(
    conn: Connection,
    name: str,
    max_running: int | None,
    rate: tuple[int, float] | None,
    result_ttl: float | None,
) -> None:
    if max_running is not None:
        admin.set_max_running(conn, name, max_running or None)
    if rate is not None:
        admin.set_rate(conn, name, rate)
    if result_ttl is not None:
        admin.set_result_ttl(conn, name, result_ttl)


def _describe(info: admin.QueueInfo) -> str:
    """A queue's settings, as `queues create`, `set` and `list` print them."""
    parts = [f"retention {info.retention}"]
    if info.route:
        parts.append(f"route {info.route}")
    if info.max_running is not None:
        parts.append(f"max-running {info.max_running}")
    if info.rate is not None:
        parts.append(f"rate {info.rate_text}")
    if info.fair:
        parts.append("fair")
    if info.partition_limit is not None:
        parts.append(f"partition-limit {info.partition_limit}")
    if info.aging is not None:
        parts.append(f"aging {describe_duration(info.aging)}")
    if info.sequence_on_failure != "hold":
        parts.append(f"sequence-on-failure {info.sequence_on_failure}")
    return ", ".join(parts)


@queues.command("create")
@click.argument("name")
@click.option(
    "--retention",
    type=click.Choice([r.value for r in Retention]),
    default=None,
    help="What happens to succeeded jobs: delete (the default for a new queue), keep, archive.",
)
@click.option("--route", default=None, help=_ROUTE_HELP)
@click.option("--max-running", type=count(), default=None, help=_MAX_RUNNING_HELP)
@click.option("--rate", type=RATE, default=None, help=_RATE_HELP)
@click.option("--result-ttl", type=DURATION, default=None, help=_RESULT_TTL_HELP)
@_turn_options
def queues_create(
    database_url: str | None,
    name: str,
    retention: str | None,
    route: str | None,
    max_running: int | None,
    rate: tuple[int, float] | None,
    result_ttl: float | None,
    **turns: Any,
) -> None:
    """Create queue NAME; if it exists, change only the settings given."""
    with base.transaction(database_url) as conn:
        created = admin.create_queue(conn, name, retention or Retention.delete.value)
        if not created and retention is not None:
            admin.set_retention(conn, name, retention)
        if route is not None:
            admin.set_route(conn, name, route)
        _apply_limits(conn, name, max_running, rate, result_ttl)
        _apply_turns(conn, name, turns)
        (info,) = [q for q in admin.list_queues(conn) if q.name == name]
    state = "created" if created else "exists"
    click.echo(f"queue {name!r} {state} ({_describe(info)})")


@queues.command("set")
@click.argument("name")
@click.option("--retention", type=click.Choice([r.value for r in Retention]), default=None)
@click.option("--route", default=None, help=_ROUTE_HELP)
@click.option("--no-route", is_flag=True, help="Back to table workers (clears the route).")
@click.option("--max-running", type=count(), default=None, help=_MAX_RUNNING_HELP)
@click.option("--no-max-running", is_flag=True, help="Lift the limit on running jobs.")
@click.option("--rate", type=RATE, default=None, help=_RATE_HELP)
@click.option("--no-rate", is_flag=True, help="Lift the rate limit.")
@click.option("--result-ttl", type=DURATION, default=None, help=_RESULT_TTL_HELP)
@_turn_options
def queues_set(
    database_url: str | None,
    name: str,
    retention: str | None,
    route: str | None,
    no_route: bool,
    max_running: int | None,
    no_max_running: bool,
    rate: tuple[int, float] | None,
    no_rate: bool,
    result_ttl: float | None,
    **turns: Any,
) -> None:
    """Change the settings of queue NAME."""
    for given, lifted, option in (
        (route, no_route, "route"),
        (max_running, no_max_running, "max-running"),
        (rate, no_rate, "rate"),
    ):
        if given is not None and lifted:
            raise click.UsageError(f"pass --{option} or --no-{option}, not both")
    with base.transaction(database_url) as conn:
        if retention is not None:
            admin.set_retention(conn, name, retention)
        if route is not None or no_route:
            admin.set_route(conn, name, route)
        if no_max_running:
            admin.set_max_running(conn, name, None)
        if no_rate:
            admin.set_rate(conn, name, None)
        _apply_limits(conn, name, max_running, rate, result_ttl)
        _apply_turns(conn, name, turns)
        (info,) = [q for q in admin.list_queues(conn) if q.name == name]
    click.echo(f"queue {name!r}: {_describe(info)}, route {info.route or '(none)'}")


@queues.command("sync")
@click.option("--app", "app_path", required=True, help="The task registry, as pkg.module:name.")
@click.option("--yes", is_flag=True, help="Create the missing queues (without it: the diff only).")
def queues_sync(database_url: str | None, app_path: str, yes: bool) -> None:
    """Create the queues the registry's tasks name or declares that the database lacks: the
    diff first (one `+ NAME` line each), then, with --yes, the queues created (a declared
    queue with its settings, `Registry.declare_queue`; others with retention delete)."""
    registry = base.app_registry(app_path)
    wanted = registry.queue_names()
    with base.transaction(database_url) as conn:
        existing = {info.name for info in admin.list_queues(conn)}
        missing = [name for name in wanted if name not in existing]
        for name in missing:
            click.echo(f"+ {name}")
        if not missing:
            click.echo(f"every queue its tasks name exists ({', '.join(wanted) or 'none'})")
            return
        if not yes:
            click.echo(f"{len(missing)} queue(s) to create: run again with --yes to create them")
            return
        for name in missing:
            admin.create_declared_queue(conn, registry.queue_declaration(name))
    click.echo(f"created {len(missing)} queue(s)")


@queues.command("list")
def queues_list(database_url: str | None) -> None:
    """List queues with their settings."""
    with base.transaction(database_url) as conn:
        for info in admin.list_queues(conn):
            state = "paused" if info.paused else "active"
            routed = f"\troute={info.route}" if info.route else ""
            limited = f"\tmax-running={info.max_running}" if info.max_running else ""
            limited += f"\trate={info.rate_text}" if info.rate else ""
            limited += "\tfair" if info.fair else ""
            limited += f"\tpartition-limit={info.partition_limit}" if info.partition_limit else ""
            limited += f"\taging={describe_duration(info.aging)}" if info.aging else ""
            if info.sequence_on_failure != "hold":
                limited += f"\tsequence-on-failure={info.sequence_on_failure}"
            click.echo(f"{info.name}\t{state}\tretention={info.retention}{routed}{limited}")


def _partition_key(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """PARTITION as a key a job can have (enqueue's check), else a usage error."""

    def refuse(detail: str) -> click.BadParameter:
        return click.BadParameter(f"{detail}: no job can have it", ctx, param)

    check_partition(value, refuse)
    return value


@queues.command("weight")
@click.argument("name")
@click.argument("partition", callback=_partition_key)
@click.argument("weight", type=click.FloatRange(0.001, partitions.MAX_WEIGHT), required=False)
@click.option("--clear", is_flag=True, help="Back to weight 1.")
def queues_weight(
    database_url: str | None, name: str, partition: str, weight: float | None, clear: bool
) -> None:
    """Give PARTITION of fair queue NAME WEIGHT times the turns of a partition of weight 1."""
    if (weight is None) == (not clear):
        raise click.UsageError("pass a WEIGHT or --clear (one of them)")
    with base.transaction(database_url) as conn:
        partitions.set_partition_weight(conn, name, partition, None if clear else weight)
    click.echo(f"queue {name!r} partition {partition!r}: weight {1.0 if clear else weight:g}")


def _set_paused(database_url: str | None, name: str, paused: bool) -> None:
    with base.transaction(database_url) as conn:
        admin.set_paused(conn, name, paused)
    click.echo(f"queue {name!r} {'paused' if paused else 'resumed'}")


@queues.command("pause")
@click.argument("name")
def queues_pause(database_url: str | None, name: str) -> None:
    """Stop workers claiming from NAME (running jobs finish)."""
    _set_paused(database_url, name, True)


@queues.command("resume")
@click.argument("name")
def queues_resume(database_url: str | None, name: str) -> None:
    """Let workers claim from NAME again."""
    _set_paused(database_url, name, False)


@queues.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Also delete the queue's jobs.")
def queues_delete(database_url: str | None, name: str, force: bool) -> None:
    """Delete queue NAME (refused while it has unfinished jobs, unless --force)."""
    with base.transaction(database_url) as conn:
        deleted = admin.delete_queue(conn, name, force)
    click.echo(f"queue {name!r} deleted ({deleted} job(s) deleted with it)")


TOP_PARTITIONS = 10
"""Partitions `stats` shows per fair or partition-limited queue by default."""
HELD_SHOWN = 100
"""Held sequences `stats` shows at most (the longest held)."""


@click.command(cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--top",
    type=count(),
    default=TOP_PARTITIONS,
    show_default=True,
    help="Partitions shown per fair or partition-limited queue (the deepest).",
)
def stats(database_url: str | None, as_json: bool, top: int) -> None:
    """Jobs per queue and status (`running`: handlers at work; `claimed`: held by a worker,
    its handler not started), the oldest due job's age, and the jobs ended (and failed)
    in the last hour and day, from the workers' rollup (`job_counts`); then the deepest
    partitions of fair and partition-limited queues, the sequences held by a failed job and
    the aged jobs of aging queues, where there are any."""
    with base.transaction(database_url) as conn:
        rows = admin.stats(conn)
        spans = {span: rollup.recent(conn, span) for span in (rollup.HOUR, rollup.DAY)}
        turns = _Turns.read(conn, top)
    ended = {
        name: {
            key: _ended(spans[span].get(name))
            for key, span in (("last_hour", rollup.HOUR), ("last_day", rollup.DAY))
        }
        for name in {row.queue for row in rows}.union(*spans.values())
    }
    if as_json:
        listed = [{**row.as_dict(), **ended.pop(row.queue)} for row in rows]
        for name, totals in sorted(ended.items()):  # counts but no job left (or no row)
            listed.append({**admin.QueueStats(name, None, {}, None).as_dict(), **totals})
        click.echo(
            json.dumps([{**entry, **turns.of(entry["queue"])} for entry in listed], indent=2)
        )
        return
    from rich.table import Table

    table = Table("queue", *COUNTED, "oldest due (s)", "ended 1 h", "ended 1 d")
    for row in rows:
        label = row.queue + (" (paused)" if row.paused else "")
        age = "" if row.oldest_due_age is None else f"{row.oldest_due_age:.1f}"
        hour, day = ended[row.queue]["last_hour"], ended[row.queue]["last_day"]
        table.add_row(
            escape(label),
            *(str(row.counts.get(name, 0)) for name in COUNTED),
            age,
            f"{hour['ended']} ({hour['failed']} failed)",
            f"{day['ended']} ({day['failed']} failed)",
        )
    base.print_table(table)
    turns.print_tables()


@dataclass
class _Turns:
    """What `stats` shows of fair, partition-limited and aging queues and of sequences."""

    depths: list[partitions.PartitionDepth]
    held: list[partitions.HeldSequence]
    aged: dict[str, int]

    @classmethod
    def read(cls, conn: Connection, top: int) -> _Turns:
        return cls(
            partitions.top_partitions(conn, top=top),
            partitions.held_sequences(conn, limit=HELD_SHOWN),
            partitions.aged_jobs(conn),
        )

    def of(self, queue: str) -> dict[str, Any]:
        """A queue's keys in `stats --json`."""
        return {
            "partitions": [
                {"partition": p.partition, "queued": p.queued, "running": p.running}
                for p in self.depths
                if p.queue == queue
            ],
            "held_sequences": [
                {
                    "sequence": h.sequence,
                    "job_id": h.job_id,
                    "failed_at": None if h.failed_at is None else h.failed_at.isoformat(),
                    "held_seconds": round(h.held_for, 3),
                    "behind": h.behind,
                }
                for h in self.held
                if h.queue == queue
            ],
            "aged": self.aged.get(queue, 0),
        }

    def print_tables(self) -> None:
        """The tables that have a row: partitions, held sequences, aged jobs (text escaped:
        partition and sequence keys are the application's text)."""
        from rich.table import Table

        if self.depths:
            table = Table("queue", "partition", "queued", "running", title="partitions")
            for p in self.depths:
                name = "(none)" if p.partition is None else escape(p.partition)
                table.add_row(escape(p.queue), name, str(p.queued), str(p.running))
            base.print_table(table)
        if self.held:
            table = Table(
                "sequence",
                "queue",
                "failed job",
                "held for",
                "jobs behind",
                title="sequences held by a failed job (retry or delete the job)",
            )
            for h in self.held:
                table.add_row(
                    escape(h.sequence),
                    escape(h.queue),
                    str(h.job_id),
                    describe_age(h.held_for),
                    str(h.behind),
                )
            base.print_table(table)
        aged = {queue: n for queue, n in self.aged.items() if n}
        if aged:
            table = Table("queue", "aged jobs", title="jobs whose priority aging has improved")
            for queue, n in aged.items():
                table.add_row(escape(queue), str(n))
            base.print_table(table)


def _ended(series: rollup.Series | None) -> dict[str, int]:
    """A span's totals: jobs ended (succeeded or failed), failed, retried attempts."""
    if series is None:
        return {"ended": 0, "failed": 0, "retried": 0}
    return {
        "ended": sum(series.finished),
        "failed": sum(series.failed),
        "retried": sum(series.retried),
    }


@click.command(cls=Command)
@click.option(
    "--older-than",
    type=DURATION,
    required=True,
    help="Age of finished jobs to delete: 3600, 90s, 12h, 7d.",
)
@click.option(
    "--status",
    "statuses",
    default="done",
    show_default=True,
    help=f"Comma-separated statuses to prune ({', '.join(s for s in JobStatus if s.finished)}).",
)
@click.option(
    "--archive",
    is_flag=True,
    help="Also prune the unpartitioned archive table of releases before sqlaq_0030.",
)
def prune(database_url: str | None, older_than: float, statuses: str, archive: bool) -> None:
    """Delete finished jobs older than --older-than."""
    with base.transaction(database_url) as conn:
        count = admin.prune(conn, older_than, [s.strip() for s in statuses.split(",")], archive)
    click.echo(f"pruned {count} job(s)")
