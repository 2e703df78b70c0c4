"""Writing the rollup (`job_counts`): the counts a worker's runner keeps in memory
(`sqla_queue.job.counts`) go to the database about once a minute, and at shutdown, in ONE
upsert that adds to the rows other workers wrote for the same minute. The same writer
deletes rows older than a day, at most once every `PRUNE_EVERY` seconds.

Called from the table worker's keeper thread and the broker worker's own task, never on
the claim or finish statements' path. A write that fails is logged once per outage; its
counts wait for the next try (bounded by `job.counts.MAX_KEYS`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from sqla_queue.db.database import autocommit_read_committed, describe
from sqla_queue.db.queries import dashboard as dashboard_reads
from sqla_queue.db.queries import rollup
from sqla_queue.job.counts import JobCounts

log = logging.getLogger("sqla_queue.worker")

WRITE_EVERY = 60.0
"""Seconds between two writes of a worker's counts."""
PRUNE_EVERY = 300.0
"""Seconds between two prunes of rows older than a day by one worker."""


class RollupWriter:
    """Writes one runner's `JobCounts` when due (`tick`)."""

    def __init__(
        self, counts: JobCounts, write_every: float = WRITE_EVERY, prune_every: float = PRUNE_EVERY
    ) -> None:
        self.counts = counts
        self.write_every = write_every
        self.prune_every = prune_every
        self._next_write = time.monotonic() + write_every
        self._next_prune = time.monotonic()
        self._failing = False

    def write(self, conn: Connection) -> int:
        """Write the pending counts in one upsert (keys in order, so two writers never
        deadlock); returns the keys written. On failure they are pending again."""
        taken = self.counts.take()
        if not taken:
            return 0
        keys = sorted(taken)
        params: dict[str, list[Any]] = {
            "minutes": [dt.datetime.fromtimestamp(k[0], dt.timezone.utc) for k in keys],
            "queues": [k[1] for k in keys],
            "tasks": [k[2] for k in keys],
            "succeeded": [int(taken[k][0]) for k in keys],
            "failed": [int(taken[k][1]) for k in keys],
            "retried": [int(taken[k][2]) for k in keys],
            "run_seconds": [float(taken[k][3]) for k in keys],
        }
        try:
            conn.execute(rollup.add_counts(), params)
        except BaseException:
            self.counts.put_back(taken)
            raise
        return len(keys)

    def tick(self, engine: Engine, force: bool = False) -> None:
        """Write when due (or `force`d: at shutdown), prune when due; never raises: a
        failure is logged once per outage and the counts wait for the next try."""
        now = time.monotonic()
        if not force and now < self._next_write:
            return
        self._next_write = now + self.write_every
        try:
            with autocommit_read_committed(engine) as conn:
                self.write(conn)
                if now >= self._next_prune:
                    self._next_prune = now + self.prune_every
                    conn.execute(rollup.prune_counts())
        except Exception as exc:
            if not self._failing:
                log.warning(
                    "could not write the job counts (%s); kept for the next try "
                    "(repeats are not logged until it recovers)",
                    describe(exc),
                )
            self._failing = True
            return
        if self._failing:
            log.warning("job counts written again")
        self._failing = False


# -- reading -----------------------------------------------------------------------------------

BIG_TABLE = 100_000
"""Jobs (the planner's estimate) from which the dashboard's counts and doctor's failed jobs
stop reading every job: the counts are bounded, the failures come from the rollup."""


def plan_rows(conn: Connection, statement: Any, params: dict[str, Any] | None = None) -> int:
    """The planner's estimate of the rows an `EXPLAIN (FORMAT JSON)` statement returns."""
    (plan,) = conn.execute(statement, params or {}).one()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def big_table(conn: Connection) -> bool:
    """Whether the jobs table and the history hold `BIG_TABLE` jobs or more, by the
    planner's estimate."""
    return plan_rows(conn, dashboard_reads.ESTIMATED_ROWS) >= BIG_TABLE


@dataclass(frozen=True)
class Span:
    """A series' length: `buckets` buckets of `step` minutes, the last one the current."""

    step: int
    buckets: int
    label: str


HOUR = Span(1, 60, "last hour, per minute")
DAY = Span(10, 144, "last day, per 10 minutes")


@dataclass
class Series:
    """One queue's (or task's) counts per bucket, the oldest first."""

    start: dt.datetime
    """The first bucket's start (UTC)."""
    succeeded: list[int]
    failed: list[int]
    retried: list[int]
    run_seconds: list[float]

    @property
    def finished(self) -> list[int]:
        """Jobs ended per bucket (succeeded or failed)."""
        return [s + f for s, f in zip(self.succeeded, self.failed, strict=True)]

    def total(self, name: str) -> float:
        return float(sum(getattr(self, name)))


def span_start(span: Span, now: dt.datetime | None = None) -> dt.datetime:
    """The first bucket's start: `span.buckets - 1` steps before the current one's."""
    now = now or dt.datetime.now(dt.timezone.utc)
    minutes = int(now.timestamp()) // 60
    current = minutes - minutes % span.step
    return dt.datetime.fromtimestamp(
        (current - span.step * (span.buckets - 1)) * 60, dt.timezone.utc
    )


def recent(
    conn: Connection, span: Span, queue: str | None = None, by_task: bool = False
) -> dict[str, Series]:
    """Each queue's series over `span` (only `queue`'s if given), or with `by_task` each
    task's of `queue`: read from `job_counts` alone (a few hundred rows)."""
    start = span_start(span)
    params = {"step": dt.timedelta(minutes=span.step), "since": start, "queue": queue}
    statement = rollup.series(by_task, queue is not None)
    found: dict[str, Series] = {}
    for bucket, key, succeeded, failed, retried, seconds in conn.execute(statement, params):
        index = int((bucket - start).total_seconds()) // (60 * span.step)
        if not 0 <= index < span.buckets:
            continue
        entry = found.get(key)
        if entry is None:
            empty = [0] * span.buckets
            entry = found[key] = Series(
                start, list(empty), list(empty), list(empty), [0.0] * span.buckets
            )
        entry.succeeded[index] += int(succeeded)
        entry.failed[index] += int(failed)
        entry.retried[index] += int(retried)
        entry.run_seconds[index] += float(seconds)
    return found
