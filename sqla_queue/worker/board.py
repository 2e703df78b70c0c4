"""The jobs a worker holds, and the one lock its threads meet at.

The producer puts claimed jobs on the board; handler threads take them (`next_job`) and
settle them with an `Outcome`; the completer takes settled outcomes (`take_outcomes`) to
write them, then `forget`s the jobs. Held jobs are keyed by (id, attempt), so a late
outcome of an old attempt can never remove the entry of a new attempt of the same job.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import cast

from sqla_queue.job.outcome import JobAttempt, Outcome, OutcomeKind
from sqla_queue.worker.jobs import ClaimedJob

WAKE_AT_ONCE = 4
"""Idle handler threads woken for a claimed batch: enough for quick jobs, which they run
back to back. Waking every thread (64 at -c 64) for jobs that take microseconds costs a
thread switch per job."""

WAKE_MORE_AFTER = 0.001
"""Seconds a ready job may wait before the producer wakes another idle thread for it (the
awake ones are busy: blocking handlers get a thread each within about this)."""


def wake_once(event: threading.Event) -> Callable[[], None]:
    """`event.set`, skipped while the event is set already: the dispatcher has not yet woken
    and cleared it, and it reads the board after it clears it, so it sees whatever changed
    before this call. A set costs a Condition round (a lock, a notify): with claims sent
    ahead, every handler return past `flush_size` would pay it while the dispatcher waits
    for the server."""
    is_set, set_ = event.is_set, event.set

    def wake() -> None:
        if not is_set():
            set_()

    return wake


class JobBoard:
    """Held jobs: waiting (`ready`), running (counted) and settled (outcomes to write)."""

    def __init__(self, concurrency: int, flush_size: int, wake: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self.flush_size = flush_size
        """Settled outcomes that make the producer write them: the worker's `batch`, or the
        claim's size while claims are sent ahead (then the next claim, soon, folds them)."""
        self._wake = wake
        self.mutex = threading.Lock()
        """The lock itself: `with board.mutex` costs less than entering the condition."""
        self.lock = threading.Condition(self.mutex)
        self._idle = 0
        """Handler threads waiting on `lock` and not yet notified (a notify takes them off):
        a put or a settle notifies only as many as wait, and none when none does."""
        self.held: dict[tuple[int, int], ClaimedJob] = {}
        self.ready: deque[ClaimedJob] = deque()
        self.outcomes: deque[Outcome] = deque()
        self.timed: set[ClaimedJob] = set()
        self.running = 0
        self.finished = 0
        """Handlers returned so far: the claim grows by how many return between claims."""
        self.closed = False
        self.paused = False
        """Set while stopping: handler threads take no new job."""
        self.claimable = False
        """Whether a claim may find jobs: handler threads wake the producer for room only then."""
        self.refill_at = 0
        """Ready jobs left when the producer wants its next claim sent (set by the producer):
        0 claims once the ready queue is empty; while claims are sent ahead (`room`'s
        `ahead`), a handler thread that leaves this many ready wakes it, so the next claim is
        in flight while the handlers work through these."""

    # -- the producer's side -------------------------------------------------------------------

    def put(self, jobs: list[ClaimedJob]) -> None:
        """Hold newly claimed jobs and hand them to handler threads, the batch at once."""
        with self.mutex:
            for job in jobs:
                self.held[job.key] = job
            self.ready.extend(jobs)
            self._notify(min(len(jobs), WAKE_AT_ONCE))

    def wake_waiting(self, now: float) -> bool:
        """Wake an idle handler thread for each ready job that has waited `WAKE_MORE_AFTER`
        seconds (the awake ones are not keeping up: blocking handlers). Returns whether the
        producer must check again (jobs wait and threads are idle)."""
        with self.mutex:
            late = 0
            for job in self.ready:  # no further than the idle threads it could wake
                if late >= self._idle or now - job.claimed_at < WAKE_MORE_AFTER:
                    break
                late += 1
            if late:
                self._notify(late)
            return bool(self.ready and self._idle)

    def _notify(self, count: int) -> None:
        """Under the lock: wake up to `count` idle handler threads, no more than jobs wait."""
        woken = min(count, self._idle, len(self.ready))
        if woken:
            self._idle -= woken
            self.lock.notify(woken)

    def room(self, batch: int, ahead: int = 0) -> int:
        """How many more jobs the worker may claim: it holds concurrency + batch - 1 at most;
        while claims are sent `ahead` of the handlers (up to `ahead` jobs still waiting to
        start), concurrency + batch + ahead. Never more than `concurrency` run."""
        held = self.concurrency + batch + (ahead if ahead else -1)
        return min(batch, held - len(self.ready) - self.running)

    def take_unstarted(self) -> list[ClaimedJob]:
        """Stop handing out jobs and return those not yet started (shutdown)."""
        with self.mutex:
            self.paused = True
            unstarted = list(self.ready)
            self.ready.clear()
            return unstarted

    def find(self, job_id: int) -> list[ClaimedJob]:
        with self.mutex:
            return [job for key, job in self.held.items() if key[0] == job_id]

    def held_jobs(self) -> list[ClaimedJob]:
        """Every held job, settled ones whose outcome is not yet written too."""
        with self.mutex:
            return list(self.held.values())

    def snapshot(self) -> list[ClaimedJob]:
        """Held jobs not yet settled, for heartbeats."""
        with self.mutex:
            return [job for job in self.held.values() if not job.settled]

    def close(self) -> None:
        with self.mutex:
            self.closed = True
            self._idle = 0
            self.lock.notify_all()

    # -- handler threads ----------------------------------------------------------------------

    def next_job(
        self, previous: ClaimedJob | None, outcome: Outcome | None, owned: bool
    ) -> ClaimedJob | None:
        """Settle `previous` with `outcome` if this thread `owned` it, then wait for the
        next job; None tells the thread to exit. One lock round per job. A thread whose job
        was taken by someone else (shutdown, once its timeout passed) exits.
        """
        with self.mutex:
            if previous is not None:
                if not owned:
                    return None
                self._settle(previous, outcome)
            # Once stopping, held jobs that have not started are released, not run.
            while not self.ready or self.running >= self.concurrency or self.paused:
                if self.closed:
                    return None
                self._idle += 1  # the notifier takes it off
                self.lock.wait()
            self.running += 1  # first: an unlocked reader may count it twice, never zero times
            job = self.ready.popleft()
            # room to claim the next batch while this one runs (or, claiming ahead, while
            # the handlers work through the `refill_at` jobs left)
            left = len(self.ready)
            room = left or self.running < self.concurrency
            if left == self.refill_at and self.claimable and room:
                self._wake()
            return job

    def returned(self, job: ClaimedJob, outcome: Outcome) -> Outcome | None:
        """A handler thread's job has returned: its outcome, which is the one decided at
        its timeout if it overran (`hold_overrun`); None if someone else took the job
        (shutdown), and the thread must exit."""
        with self.mutex:
            if not job.take():
                return None
            if outcome.committed:  # its own session finished it before the deadline's verdict
                return outcome
            return job.pending or outcome

    def hold_overrun(self, job: ClaimedJob, outcome: Outcome) -> bool:
        """The job's handler overran its timeout: keep `outcome` until it returns. The job
        stays held and running (its lease extended, this worker's slot and its queue's
        taken) until then. False if the handler returned meanwhile."""
        with self.mutex:
            if job.settled:
                return False
            job.pending = outcome
            return True

    def only_overrunning(self) -> bool:
        """Whether every running handler is one that overran its timeout or its cancel
        (burst mode exits to the shutdown, which writes their outcomes)."""
        with self.mutex:
            overrunning = sum(
                1
                for job in self.held.values()
                if not job.settled
                and (job.pending is not None or (job.started and job.ctx.cancelled))
            )
            return self.running == overrunning

    def watch_deadline(self, job: ClaimedJob, deadline: float) -> None:
        with self.mutex:
            job.deadline = deadline
            self.timed.add(job)
        self._wake()  # the producer times it out

    # -- settling -----------------------------------------------------------------------------

    def settle(self, job: ClaimedJob, outcome: Outcome | None) -> None:
        """Record the outcome of a running job the caller has taken (`job.take()`)."""
        with self.mutex:
            self._settle(job, outcome, taker=False)

    def _settle(self, job: ClaimedJob, outcome: Outcome | None, taker: bool = True) -> None:
        """Under the lock: record the outcome of a running job. A `taker` (a handler
        thread) takes the next ready job itself; otherwise an idle thread is woken for it."""
        # Outcome first: a producer that sees nothing running must also see it to flush.
        if outcome is not None:
            self.outcomes.append(outcome)
        self.running -= 1
        self.finished += 1
        if not taker:
            self._notify(1)  # its slot is free for a waiting handler thread
        pending = len(self.outcomes)
        # Wake the producer only when it has something to do, not once per job: to start
        # the flush delay, to flush a full batch, to claim, or to exit in burst mode.
        if (
            pending == 1
            or pending >= self.flush_size
            or (not self.ready and (self.running == 0 or self.claimable))
        ):
            self._wake()

    def expired(self, now: float) -> tuple[list[ClaimedJob], float | None]:
        """Jobs past their deadline (each returned once: the caller decides its outcome,
        `hold_overrun`), and the nearest deadline still ahead."""
        nearest: float | None = None
        expired: list[ClaimedJob] = []
        with self.mutex:
            for job in list(self.timed):
                assert job.deadline is not None
                if job.settled:
                    self.timed.discard(job)
                elif job.deadline <= now:
                    self.timed.discard(job)
                    expired.append(job)
                elif nearest is None or job.deadline < nearest:
                    nearest = job.deadline
        return expired, nearest

    # -- the completer's side -----------------------------------------------------------------

    def take_outcomes(self) -> list[Outcome]:
        with self.mutex:
            taken = list(self.outcomes)
            self.outcomes.clear()
            return taken

    def only_successes(self) -> bool:
        """Successes wait to be written and nothing else: the producer folds them into a
        claim even when the queue looked empty (the same one statement as writing them
        alone, and it takes at once any slot they free in a concurrency-limited queue)."""
        with self.mutex:
            outcomes = self.outcomes
            return bool(outcomes) and all(
                o.kind is OutcomeKind.succeeded and o.result is None for o in outcomes
            )

    def take_successes(self) -> list[ClaimedJob] | None:
        """If every settled outcome is a success, take them all and forget their jobs (one
        lock round); else None, and nothing changes."""
        with self.mutex:
            outcomes = self.outcomes
            if not outcomes:
                return None
            succeeded = OutcomeKind.succeeded
            for outcome in outcomes:
                # a kept result is written by complete_jobs, which stores it
                if outcome.kind is not succeeded or outcome.result is not None:
                    return None
            # the board's outcomes are its own jobs': each one a ClaimedJob
            jobs = cast("list[ClaimedJob]", [outcome.job for outcome in outcomes])
            outcomes.clear()
            held = self.held
            for job in jobs:
                if held.get(job.key) is job:
                    del held[job.key]
            return jobs

    def forget(self, jobs: Iterable[JobAttempt]) -> None:
        with self.mutex:
            for job in jobs:
                if self.held.get(job.key) is job:
                    del self.held[job.key]
