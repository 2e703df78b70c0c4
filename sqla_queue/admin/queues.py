"""Queues and their settings as Python calls: create, pause, route, limit, delete and list
them (re-exported by `sqla_queue.admin.jobs`; the settings of fair, partition-limited and aging
queues are in `sqla_queue.admin.partitions`).

Each takes a `Connection` or a `Session` and runs in the caller's transaction; none commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from sqla_queue.admin.jobs import rowcount
from sqla_queue.db import queries
from sqla_queue.db.models import Retention
from sqla_queue.errors import ConfigurationError, UnknownQueueError
from sqla_queue.job.validation import (
    check_count,
    check_duration,
    check_rate,
    describe_rate,
    parse_rate,
    validate_name,
)

if TYPE_CHECKING:
    from sqla_queue.registry import QueueDeclaration

Bind = Connection | Session


def _retention(value: str) -> str:
    try:
        return Retention(value).value
    except ValueError:
        choices = ", ".join(r.value for r in Retention)
        raise ConfigurationError(detail=f"retention {value!r} is not one of: {choices}") from None


def create_queue(bind: Bind, name: str, retention: str = Retention.delete.value) -> bool:
    """Create queue `name`; returns False if it already existed (it is left unchanged)."""
    validate_name("queue name", name)
    row = bind.execute(queries.create_queue(), {"name": name, "retention": _retention(retention)})
    return row.first() is not None


def set_paused(bind: Bind, name: str, paused: bool) -> None:
    """Pause (no job of it is claimed) or resume queue `name`."""
    validate_name("queue name", name)
    if bind.execute(queries.set_queue_paused(paused), {"queue_name": name}).first() is None:
        raise UnknownQueueError(queue=name)


def set_retention(bind: Bind, name: str, retention: str) -> None:
    """Set what happens to queue `name`'s succeeded jobs: delete, keep or archive."""
    validate_name("queue name", name)
    params = {"queue_name": name, "new_retention": _retention(retention)}
    if bind.execute(queries.set_queue_retention(), params).first() is None:
        raise UnknownQueueError(queue=name)


def delete_queue(bind: Bind, name: str, force: bool = False) -> int:
    """Delete queue `name` and its finished jobs. Refuses while it has queued, running or
    waiting jobs unless `force`, which deletes those too. Returns how many jobs were deleted."""
    validate_name("queue name", name)
    if bind.execute(queries.lock_queue(), {"queue_name": name}).first() is None:
        raise UnknownQueueError(queue=name)
    unfinished = bind.execute(queries.count_unfinished_in_queue(), {"queue_name": name}).scalar()
    if unfinished and not force:
        raise ConfigurationError(
            detail=f"queue {name!r} still has {unfinished} unfinished job(s) (queued, running "
            "or waiting); wait for them, or pass --force to delete them with the queue"
        )
    # Without --force only finished jobs go: a job enqueued since the count (possible once
    # the foreign key is dropped) is never deleted by accident.
    if force:  # a running job deleted would count as succeeded to the jobs that wait for it
        bind.execute(queries.workflows.cancel_parents_of_queue(), {"queue_name": name})
    statement = queries.delete_jobs_of_queue(finished_only=not force)
    deleted = rowcount(bind.execute(statement, {"queue_name": name}))
    bind.execute(queries.delete_queue(), {"queue_name": name})
    return deleted


def set_route(bind: Bind, name: str, route: str | None) -> None:
    """Route queue `name`'s jobs to a broker (`nats:SUBJECT`, `amqp:EXCHANGE/KEY`) or, with
    None, back to table workers. Jobs already in the table follow the new setting. Refused
    while the queue has jobs queued or running with a unique key, a sequence, a partition or
    an ORM row argument: a broker keeps none of them (`sqla_queue.enqueue.inserts.routed`)."""
    validate_name("queue name", name)
    from sqla_queue.brokers.kinds import parse_route
    from sqla_queue.db.queries import brokers
    from sqla_queue.enqueue.inserts.routed import refused_on_routed

    value = None if route is None else str(parse_route(route))
    params = {"queue_name": name, "new_route": value}
    if value is not None:
        held = bind.execute(brokers.count_unfinished_not_kept_on_routes(), params).one()
        for feature, count in held._mapping.items():
            if count:
                raise ConfigurationError(detail=refused_on_routed(feature, name, value, count))
    if bind.execute(queries.set_queue_route(), params).first() is None:
        raise UnknownQueueError(queue=name)


def set_max_running(bind: Bind, name: str, max_running: int | None) -> None:
    """At most `max_running` jobs of queue `name` run at once, across all workers (None: no
    limit; `queues create --max-running`). The claim statement enforces it; jobs running
    now are left to finish."""
    validate_name("queue name", name)
    if max_running is not None:
        check_count("max_running", max_running)
    params = {"queue_name": name, "concurrency": max_running}
    if bind.execute(queries.set_queue_concurrency(), params).first() is None:
        raise UnknownQueueError(queue=name)


def set_rate(bind: Bind, name: str, rate: str | tuple[int, float] | None) -> None:
    """At most so many jobs of queue `name` start in any window of so many seconds, across
    all workers: `"100/s"`, `"10/min"`, `"20/30s"` or (count, seconds); None: no limit."""
    validate_name("queue name", name)
    if rate is None:
        count, window = None, None
    else:
        try:
            count, window = parse_rate(rate) if isinstance(rate, str) else rate
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(detail=f"rate {rate!r}: {exc}") from None
        count, window = check_rate("rate", count, window)
    params = {"queue_name": name, "rate_limit": count, "rate_window": window}
    if bind.execute(queries.set_queue_rate(), params).first() is None:
        raise UnknownQueueError(queue=name)


def set_result_ttl(bind: Bind, name: str, seconds: float) -> None:
    """How long a kept result (`keep_result=True`) of queue `name` stays readable when the
    queue deletes its jobs: the row stays `done` that long, then the reaper deletes it."""
    validate_name("queue name", name)
    params = {"queue_name": name, "result_ttl": check_duration("result_ttl", seconds)}
    if bind.execute(queries.set_queue_result_ttl(), params).first() is None:
        raise UnknownQueueError(queue=name)


@dataclass
class QueueInfo:
    name: str
    paused: bool
    retention: str
    route: str | None = None
    max_running: int | None = None
    """At most this many of its jobs run at once, across all workers."""
    rate: tuple[int, float] | None = None
    """(count, window seconds): at most `count` starts in any window that long."""
    result_ttl: float = 86400.0
    """Seconds kept results stay readable when its retention deletes jobs."""
    fair: bool = False
    """Claims take turns between its partitions (`set_fair`)."""
    partition_limit: int | None = None
    """At most this many running jobs per partition, across all workers."""
    aging: float | None = None
    """Seconds per priority step a waiting job gains (None: no aging)."""
    sequence_on_failure: str = "hold"
    """Whether a failed job holds its sequence (`hold`) or not (`skip`)."""

    @property
    def rate_text(self) -> str | None:
        """The rate as `queues create --rate` takes it (`100/s`), or None."""
        return None if self.rate is None else describe_rate(*self.rate)


def list_queues(bind: Bind) -> list[QueueInfo]:
    rows = bind.execute(queries.queue_settings()).mappings()
    return [
        QueueInfo(
            r["name"],
            r["paused"],
            r["retention"],
            r["route"],
            r["concurrency"],
            None if r["rate_limit"] is None else (r["rate_limit"], r["rate_window"]),
            r["result_ttl"],
            r["fair"],
            r["partition_limit"],
            r["aging"],
            r["sequence_on_failure"],
        )
        for r in rows
    ]


def create_declared_queue(bind: Bind, declared: QueueDeclaration) -> bool:
    """Create a queue declared in code (`Registry.declare_queue`) with its settings; returns
    False if it existed already (it is left as it is, settings too)."""
    if not create_queue(bind, declared.name, declared.retention):
        return False
    if declared.max_running is not None:
        set_max_running(bind, declared.name, declared.max_running)
    return True
