"""The rollup a worker keeps of the attempts it ends: per (minute, queue, task), how many
succeeded, failed (ended the job failed), were retried, and the handlers' run seconds.

Counted in memory as each attempt ends (`JobRunner.finished`: no statement per job), until
`sqla_queue.db.rollup` writes them. Counts that could not be written are put back, up to
`MAX_KEYS` keys (the oldest minutes are dropped beyond, and the drop is logged).
"""

from __future__ import annotations

import logging
import threading
import time

from sqla_queue.job.outcome import Outcome, OutcomeKind

log = logging.getLogger("sqla_queue.worker")

MAX_KEYS = 10_000
"""(minute, queue, task) keys kept while writes fail; the oldest minutes go beyond."""

Key = tuple[int, str, str]
"""(minute as Unix seconds, queue, task)."""


class JobCounts:
    """Counts of ended attempts, per minute, queue and task, until written. Thread-safe:
    handler threads add, the writer takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Key, list[float]] = {}
        self.dropped = 0
        """Keys dropped (beyond `MAX_KEYS`) while writes failed."""

    def add(
        self,
        queue: str,
        task: str,
        succeeded: int = 0,
        failed: int = 0,
        retried: int = 0,
        seconds: float = 0.0,
    ) -> None:
        """Count attempts that ended now."""
        key = (int(time.time()) // 60 * 60, queue, task)
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                counts = self._counts[key] = [0, 0, 0, 0.0]
            counts[0] += succeeded
            counts[1] += failed
            counts[2] += retried
            counts[3] += seconds

    def record(self, outcome: Outcome, seconds: float | None) -> None:
        """Count one attempt's outcome: succeeded; retried (it raised or timed out and
        runs again); failed (it ended the job failed). Others (snoozed, deferred,
        cancelled, lost, released) are not counted."""
        kind, job = outcome.kind, outcome.job
        if kind is OutcomeKind.succeeded:  # `add`, inlined: one per job
            key = (int(time.time()) // 60 * 60, job.queue, job.task)
            with self._lock:
                counts = self._counts.get(key)
                if counts is None:
                    counts = self._counts[key] = [0, 0, 0, 0.0]
                counts[0] += 1
                counts[3] += seconds or 0.0
        elif kind in (OutcomeKind.retried, OutcomeKind.timed_out, OutcomeKind.failed):
            if outcome.requeues:
                self.add(job.queue, job.task, retried=1, seconds=seconds or 0.0)
            else:
                self.add(job.queue, job.task, failed=1, seconds=seconds or 0.0)

    def pending(self) -> dict[Key, list[float]]:
        """A copy of the counts not yet written."""
        with self._lock:
            return {key: list(counts) for key, counts in self._counts.items()}

    def take(self) -> dict[Key, list[float]]:
        with self._lock:
            taken, self._counts = self._counts, {}
        return taken

    def put_back(self, taken: dict[Key, list[float]]) -> None:
        """Add counts that could not be written back to the pending ones (bounded)."""
        with self._lock:
            for key, counts in taken.items():
                mine = self._counts.setdefault(key, [0, 0, 0, 0.0])
                for i, value in enumerate(counts):
                    mine[i] += value
            over = len(self._counts) - MAX_KEYS
            if over > 0:
                for key in sorted(self._counts)[:over]:
                    del self._counts[key]
                self.dropped += over
                log.warning("job counts not written: dropped the %d oldest of them", over)
