"""How a worker runs (`WorkerConfig`) and what it did (`WorkerStats`)."""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqla_queue.db.models import HISTORY_AHEAD, HISTORY_PERIOD_DAYS
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.validation import (
    MAX_BATCH,
    MAX_WORKER_CONCURRENCY,
    check_count,
    check_duration,
    validate_name,
)
from sqla_queue.registry import MIN_LEASE
from sqla_queue.runtime.health_server import DEFAULT_HEALTH_HOST

BURST_GIVE_UP_AFTER = 30.0
"""Seconds a `--burst` worker waits for an unreachable database before it gives up."""


def _queues_error(detail: str) -> ConfigurationError:
    return ConfigurationError(detail=f"queues: {detail}")


@dataclass
class WorkerConfig:
    """How a worker runs. Most fields are a `sqla-queue worker` option of the same name,
    whose default is the field's default here."""

    queues: Sequence[str] | None = None
    """Queues to claim from; None claims from every queue that is not paused."""
    concurrency: int = 4
    """Handlers running at once."""
    batch: int = 10
    """Jobs a claim asks for; while the jobs are quick and the backlog deep, claims grow
    from it to `max_batch` (`sqla_queue.worker.claim_size`)."""
    max_batch: int | None = None
    """The most jobs one claim asks for: claims double from `batch` while the handlers return
    at least half of each full claim's jobs within 0.1 s of it, and fall back when they do
    not, or when a claim comes back short. None is max(batch, 500); `batch` or less keeps
    every claim at `batch`. The worker holds at most concurrency + the current claim's size
    - 1 jobs; concurrency + twice the size while a grown claim is sent ahead of the handlers
    (no queue has a limit: `Producer.ahead`)."""
    lease: float = 60.0
    """Seconds a claimed job may go without a heartbeat before any worker requeues it (at
    least 1). Stored on each job at its claim; a task's own `lease` overrides it."""
    poll_interval: float = 2.0
    """Longest sleep between polls when idle (polls back off exponentially up to it)."""
    poll_only: bool = False
    """Never LISTEN (for PgBouncer in transaction pooling mode): poll with backoff only."""
    burst: bool = False
    """Exit once no job is due and none is running."""
    burst_wait: float = 0.0
    """With `burst`: seconds ahead to look for work. While a queued job of its queues falls
    due within that long (a retry, a snooze, a delayed job), the worker waits for it
    instead of exiting; 0 exits once nothing is due now."""
    burst_until_empty: bool = False
    """With `burst`: wait for every queued job of its queues due later (a retry, a snooze, a
    delayed job), however far off, and exit only once none is left (`--until-empty`)."""
    shutdown_timeout: float = 30.0
    """Seconds in-flight handlers get to finish after SIGTERM before their jobs are requeued."""
    heartbeat: float = 2.0
    """Seconds between the worker's own heartbeats (its row in the workers table)."""
    dead_after: float = 6.0
    """Seconds without a worker heartbeat after which other workers requeue all its jobs."""
    give_up_after: float | None = None
    """Seconds to wait for an unreachable database before giving up with an error; None
    waits forever (a `burst` worker gives up after 30 s unless told otherwise)."""
    synchronous_commit: bool = False
    """Whether the worker's own claim and finish statements wait for their commit to reach
    disk. Off (the default), a server crash can lose the last fraction of a second of
    claims and finishes: those jobs run again, as the queue's at-least-once already allows,
    and no committed job is lost (docs/durability.md). Enqueues, `ctx.session()` and the
    application's own connections always commit as the server is configured."""
    job_logs: bool = True
    """Keep the log records each handler emits (through `logging`, on its thread or task)
    with its attempt, in `sqla_queue.job_logs` (one insert per attempt that logged); False
    keeps none (`ctx.progress` is written either way)."""
    vacuum_threshold: int | None = 1000
    """Dead rows in the jobs table (beyond a tenth of its live rows) at which a worker runs
    VACUUM on it itself, one worker at a time; None leaves the table to autovacuum."""
    history_period_days: int = HISTORY_PERIOD_DAYS
    """Days of finished jobs per partition of the history (`jobs_history`) the keeper makes
    from now on (1: a partition a day, pruned a day at a time); partitions already made keep
    their span."""
    history_ahead: int = HISTORY_AHEAD
    """Periods ahead of now the keeper keeps history partitions made for."""
    health_port: int | None = None
    """Serve `/livez`, `/readyz` and `/health` over HTTP on this port while the worker runs
    (`sqla_queue.worker.health`); None serves nothing."""
    health_host: str = DEFAULT_HEALTH_HOST
    """The address the health server listens on: every interface by default, as a
    Kubernetes probe needs; 127.0.0.1 keeps it to this machine."""
    health_stuck_after: float = 60.0
    """Seconds one round of a worker loop (a statement, a connection attempt) may take
    before `/livez` calls the loop stuck. Waiting (idle, or out a database outage) never is."""
    resources: Mapping[str, Any] = field(default_factory=dict)
    """Handed to every job as `ctx.resources`, over the registry's own of the same name."""
    worker_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    )

    def __post_init__(self) -> None:
        check_count("concurrency", self.concurrency, 1, MAX_WORKER_CONCURRENCY)
        check_count("batch", self.batch, 1, MAX_BATCH)
        if self.max_batch is not None:
            check_count("max_batch", self.max_batch, 1, MAX_BATCH)
        if not isinstance(self.synchronous_commit, bool):
            raise ConfigurationError(
                detail=f"synchronous_commit must be True or False, got {self.synchronous_commit!r}"
            )
        if not isinstance(self.job_logs, bool):
            raise ConfigurationError(
                detail=f"job_logs must be True or False, got {self.job_logs!r}"
            )
        if self.vacuum_threshold is not None:
            check_count("vacuum_threshold", self.vacuum_threshold, 0)
        check_count("history_period_days", self.history_period_days, 1, 366)
        check_count("history_ahead", self.history_ahead, 0, 366)
        if self.health_port is not None:
            check_count("health_port", self.health_port, 1, 65535)
        if not isinstance(self.health_host, str) or not self.health_host:
            raise ConfigurationError(
                detail=f"health_host must be a host name or address, got {self.health_host!r}"
            )
        for name in (
            "lease",
            "poll_interval",
            "shutdown_timeout",
            "heartbeat",
            "dead_after",
            "health_stuck_after",
            "burst_wait",
        ):
            setattr(self, name, check_duration(name, getattr(self, name)))  # a timedelta too
        if self.give_up_after is not None:
            self.give_up_after = check_duration("give_up_after", self.give_up_after)
        checks = (
            (
                self.lease >= MIN_LEASE,
                f"lease must be at least {MIN_LEASE:g} s (heartbeats must fit in it), "
                f"got {self.lease}",
            ),
            (self.poll_interval > 0, f"poll interval must be positive, got {self.poll_interval}"),
            (self.heartbeat > 0, f"heartbeat must be positive, got {self.heartbeat}"),
            (self.burst_wait >= 0, f"burst_wait must not be negative, got {self.burst_wait}"),
            (
                self.burst or not self.burst_wait,
                "burst_wait waits for jobs due soon before a burst worker exits: it needs "
                "burst (--burst)",
            ),
            (
                self.burst or not self.burst_until_empty,
                "burst_until_empty waits until a burst worker's queues are empty: it needs "
                "burst (--burst --until-empty)",
            ),
            (
                not (self.burst_until_empty and self.burst_wait),
                "burst_until_empty already waits for every job due later: drop burst_wait "
                "(--burst-wait), or keep it and drop burst_until_empty (--until-empty)",
            ),
            (
                self.health_stuck_after > 0,
                f"health_stuck_after must be positive, got {self.health_stuck_after}",
            ),
            (
                self.dead_after >= 2 * self.heartbeat,
                f"dead_after ({self.dead_after}) must be at least twice the heartbeat "
                f"({self.heartbeat})",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise ConfigurationError(detail=message)
        if isinstance(self.queues, str):  # one name, not a sequence of one-letter queues
            self.queues = [self.queues]
        if self.queues is not None:
            self.queues = [q for q in self.queues if q]
            if not self.queues:
                raise ConfigurationError(detail="the queue list is empty; omit -q for all queues")
            for queue in self.queues:
                validate_name("queue name", queue, _queues_error)
        if self.burst and self.give_up_after is None:
            self.give_up_after = BURST_GIVE_UP_AFTER


@dataclass
class WorkerStats:
    """Counts of what a worker did; `run()` returns them."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0
    cancelled: int = 0
    timed_out: int = 0
    reaped: int = 0
    snoozed: int = 0
    overran: int = 0
    """Handlers that had not returned a second after their timeout or cancel (each kept
    its slot until it returned)."""
    deferred: int = 0
    """Jobs put back for a worker that has a handler for their task."""
    waiting: int = 0
    """Runs that ended parked by `ctx.wait_for_signal` (the job waits for its signal)."""
    largest_claim: int = 0
    """The most jobs one claim asked for (`batch`, or more while claims grew)."""
    claims_ahead: int = 0
    """Claims sent while jobs of the claim before still waited to start: sent ahead, their
    round trip overlapped the handlers (`Producer.ahead`)."""
    not_yet_due: int = 0
    """A burst worker's: the queued jobs of its queues due later when it exited (a retry,
    a snooze, a delayed job), which it left."""
    next_due_at: dt.datetime | None = None
    """A burst worker's: when the earliest of `not_yet_due` falls due."""
