"""How many jobs the next claim asks for: `batch`, doubled while the jobs are quick.

A claim costs the server about the same whatever its size, so one worker drains a deep
backlog of quick jobs far faster claiming hundreds at once than 10 (a 30,000-job drain at
-c 16: about 12,500 jobs/s at batch 50, about 27,000 at batch 200, on a 2-core machine).
But a worker that claims hundreds of slow jobs sits on them while other workers idle, and a
crash leaves them waiting for their lease. So the size follows the jobs: it doubles, on a
ladder from `batch` to `max_batch`, while the handlers return at least half a claim's worth
of jobs within `GROW_WITHIN` seconds of it (jobs that only start quickly, on idle handler
threads, do not count); it steps back down when a full claim lasts longer, and back to
`batch` as soon as a claim comes back short (the backlog is gone). A worker then holds at
most about `GROW_WITHIN` seconds of work beyond its running handlers.
"""

from __future__ import annotations

GROW_WITHIN = 0.1
"""Seconds: when the handlers return at least half a full claim's jobs sooner than this after
it, the next claim is twice as large (up to `max_batch`); a full claim followed by no claim
for longer than this makes the next one half as large."""

DEFAULT_MAX_BATCH = 500
"""`WorkerConfig.max_batch` when not given: the claim grows to max(batch, this)."""


class ClaimSize:
    """The size of the next claim, on the ladder batch, 2 batch, 4 batch, ..., max_batch
    (a few sizes only: each has a statement of its own, planned once)."""

    def __init__(self, batch: int, max_batch: int) -> None:
        ladder = [batch]
        while ladder[-1] < max_batch:
            ladder.append(min(ladder[-1] * 2, max_batch))
        self.ladder = tuple(ladder)
        self._step = 0
        self._full = False
        self._claimed_at = float("-inf")
        self._finished_then = 0

    def next(self, now: float, finished: int) -> int:
        """The size to claim at `now` (monotonic seconds), from how the last claim went and
        `finished`, the count of jobs this worker's handlers have returned so far."""
        step = self._step
        if not self._full:
            step = 0
        elif now - self._claimed_at > GROW_WITHIN:
            step = max(step - 1, 0)
        elif finished - self._finished_then >= max(1, self.ladder[step] // 2):
            step = min(step + 1, len(self.ladder) - 1)
        return self.ladder[step]

    def claimed(self, size: int, got: int, now: float, finished: int) -> None:
        """A claim of `size` (a value `next` gave) returned `got` jobs at `now`, when the
        handlers had returned `finished` jobs."""
        self._step = self.ladder.index(size)
        self._full = got >= size
        self._claimed_at = now
        self._finished_then = finished
