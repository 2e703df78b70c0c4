"""Fair queues, partition limits, priority aging and sequences: their settings, and what an
operator reads of them.

A job names its partition (`enqueue(..., partition="tenant-42")`) and its sequence
(`sequence="order-42"`). A queue may then be

- **fair** (`set_fair`): claims take its due jobs round-robin across partitions, the
  partitions with the fewest running jobs (for their weight, `set_partition_weight`) first;
- **partition-limited** (`set_partition_limit`): at most N running jobs per partition,
  across all workers;
- **aging** (`set_aging`): a waiting job's priority improves one step per interval.

Jobs of one sequence run one at a time in enqueue order, in any queue;
`set_sequence_on_failure` says whether a failed job holds its sequence (the default) or
not. All of it is enforced inside the claim statement (see docs/fairness.md).

Each function takes a `Connection` or `Session` and runs in the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from sqla_queue.db.queries import partitions as queries
from sqla_queue.errors import ConfigurationError, UnknownQueueError
from sqla_queue.job.validation import check_count, check_duration, check_partition, validate_name

Bind = Connection | Session

SEQUENCE_POLICIES = ("hold", "skip")
"""What a failed job of a sequence does: holds the sequence until it is retried or deleted
(`hold`), or lets the sequence go on (`skip`)."""
MAX_WEIGHT = 1000.0


def _set(bind: Bind, statement: Any, name: str, **params: Any) -> None:
    validate_name("queue name", name)
    if bind.execute(statement, {"queue_name": name, **params}).first() is None:
        raise UnknownQueueError(queue=name)


def set_fair(bind: Bind, name: str, fair: bool = True) -> None:
    """Make queue `name` fair (claims take turns between its partitions) or FIFO again."""
    if not isinstance(fair, bool):
        raise ConfigurationError(detail=f"fair must be True or False, got {fair!r:.60}")
    _set(bind, queries.set_queue_fair(), name, fair=fair)


def set_partition_limit(bind: Bind, name: str, limit: int | None) -> None:
    """At most `limit` running jobs per partition of queue `name`, across all workers (None:
    no limit). Jobs without a partition count as one partition."""
    if limit is not None:
        check_count("partition_limit", limit)
    _set(bind, queries.set_queue_partition_limit(), name, partition_limit=limit)


def set_aging(bind: Bind, name: str, interval: float | dt.timedelta | None) -> None:
    """A waiting job of queue `name` gains one priority step per `interval` (seconds or a
    timedelta; None: no aging), so a low priority job never waits forever."""
    seconds = None if interval is None else check_duration("aging", interval, 0.001)
    _set(bind, queries.set_queue_aging(), name, aging=seconds)


def set_sequence_on_failure(bind: Bind, name: str, policy: str) -> None:
    """Whether a failed job of queue `name` holds its sequence (`hold`, the default) until
    it is retried or deleted, or the sequence goes on past it (`skip`)."""
    if policy not in SEQUENCE_POLICIES:
        raise ConfigurationError(
            detail=f"sequence_on_failure must be 'hold' or 'skip', got {policy!r:.60}"
        )
    _set(bind, queries.set_queue_sequence_on_failure(), name, policy=policy)


def set_partition_weight(bind: Bind, name: str, partition: str, weight: float | None) -> None:
    """Give `partition` of fair queue `name` `weight` times the turns of a partition of
    weight 1 (the default; None sets it back). From 0.001 to 1000."""
    validate_name("queue name", name)
    check_partition(partition)  # the key a job can have: enqueue's check
    params = {"queue_name": name, "partition": partition}
    if weight is None:
        bind.execute(queries.clear_partition_weight(), params)
        return
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ConfigurationError(detail=f"weight must be a number, got {weight!r:.60}")
    if not 0.001 <= weight <= MAX_WEIGHT:
        raise ConfigurationError(
            detail=f"weight must be between 0.001 and {MAX_WEIGHT:.0f}, got {weight!r}"
        )
    from sqlalchemy.exc import IntegrityError

    try:
        bind.execute(queries.set_partition_weight(), {**params, "weight": float(weight)})
    except IntegrityError as exc:
        if "fk_partition_weights_queue_queues" in str(exc.orig):
            raise UnknownQueueError(queue=name) from None
        raise


def partition_weights(bind: Bind) -> dict[tuple[str, str], float]:
    """The weights given, by (queue, partition)."""
    return {(r[0], r[1]): float(r[2]) for r in bind.execute(queries.partition_weights())}


@dataclass(frozen=True)
class PartitionDepth:
    """A partition of a fair or partition-limited queue: its queued and running jobs
    (`partition` None: the jobs without one)."""

    queue: str
    partition: str | None
    queued: int
    running: int


def top_partitions(
    bind: Bind, queues: list[str] | None = None, top: int = 10
) -> list[PartitionDepth]:
    """The `top` deepest partitions of each fair or partition-limited queue (of `queues`,
    or all), deepest first."""
    check_count("top", top)
    rows = bind.execute(queries.top_partitions(), {"queue_names": queues, "top": top})
    return [PartitionDepth(r[0], r[1], int(r[2]), int(r[3])) for r in rows]


@dataclass(frozen=True)
class HeldSequence:
    """A sequence a failed job holds: nothing behind it runs until the job is retried or
    deleted (`jobs cancel` ends queued, waiting and running jobs, not failed ones)."""

    sequence: str
    queue: str
    job_id: int
    failed_at: dt.datetime | None
    held_for: float
    """Seconds since the job failed."""
    behind: int
    """Queued jobs of the sequence waiting behind it."""


def held_sequences(
    bind: Bind, limit: int = 100, queue: str | None = None, waiting: bool = False
) -> list[HeldSequence]:
    """The sequences held by a failed job, the longest held first (at most `limit`): of
    `queue` only if given, and only those a queued job waits behind if `waiting`."""
    check_count("limit", limit)
    params = {"limit": limit, "queue_name": queue, "waiting": waiting}
    rows = bind.execute(queries.held_sequences(), params)
    return [HeldSequence(r[0], r[1], int(r[2]), r[3], float(r[4] or 0.0), int(r[5])) for r in rows]


def aged_jobs(bind: Bind) -> dict[str, int]:
    """Per aging queue, its due jobs whose priority aging has improved (waited at least one
    interval, not already at priority 0)."""
    return {r[0]: int(r[2]) for r in bind.execute(queries.aged_jobs())}


__all__ = [
    "SEQUENCE_POLICIES",
    "HeldSequence",
    "PartitionDepth",
    "aged_jobs",
    "held_sequences",
    "partition_weights",
    "set_aging",
    "set_fair",
    "set_partition_limit",
    "set_partition_weight",
    "set_sequence_on_failure",
    "top_partitions",
]
