"""The producer: the claim loop on the dispatcher thread.

It claims batches when handler threads have room, folds pending successes into the claim,
asks the completer to write other outcomes, times out overrunning handlers, and in burst
mode returns once nothing is due and nothing runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError

from sqla_queue.db import queries
from sqla_queue.db.queries.claim import TaskSettings
from sqla_queue.job.outcome import Outcome
from sqla_queue.worker.board import WAKE_MORE_AFTER, JobBoard
from sqla_queue.worker.claim_size import DEFAULT_MAX_BATCH, GROW_WITHIN, ClaimSize
from sqla_queue.worker.completer import FLUSH_DELAY, Completer
from sqla_queue.worker.config import WorkerConfig, WorkerStats
from sqla_queue.worker.connection import (
    JOB_ARRAYS,
    DatabaseLink,
    DriverStatement,
    Stopped,
    describe,
    is_row_error,
)
from sqla_queue.worker.executor import Executor
from sqla_queue.worker.jobs import ClaimColumns, ClaimedJob
from sqla_queue.worker.keeper import Keeper

log = logging.getLogger("sqla_queue.worker")

BURST_RECHECK = 0.05
"""The shortest wait of a burst worker for a job due soon (it looks again after it)."""


@dataclass(frozen=True, kw_only=True)
class ProducerSettings:
    """What a `Producer` is built with: the worker's config and the parts it drives."""

    config: WorkerConfig
    db: DatabaseLink
    """The dispatcher's connection: claims and folded successes go through it."""
    board: JobBoard
    executor: Executor
    completer: Completer
    keeper: Keeper
    stats: WorkerStats
    wake: threading.Event
    """Set to wake the dispatch loop (a notification, room on the board, an outcome)."""
    stopping: threading.Event
    make_job: Callable[[Any, ClaimColumns], ClaimedJob]
    """Builds a job from a claimed row."""
    on_finished: Callable[[Outcome], None]
    on_claimed: Callable[[ClaimedJob], None] | None = None
    """Called with each claimed job before it goes on the board (the job_claimed hook)."""


class Producer:
    """Claims jobs and keeps the dispatcher's other duties (flushes, timeouts, burst exit)."""

    def __init__(self, settings: ProducerSettings) -> None:
        config, keeper = settings.config, settings.keeper
        self.config = config
        self.db = settings.db
        self.board = settings.board
        self.executor = settings.executor
        self.completer = settings.completer
        self.keeper = keeper
        self.stats = settings.stats
        self.wake = settings.wake
        self.stopping = settings.stopping
        self.notified = False
        self._make_job = settings.make_job
        self._on_claimed = settings.on_claimed
        self._on_finished = settings.on_finished
        static: dict[str, Any] = {"worker_id": config.worker_id, "lease": config.lease}
        self._settings: TaskSettings = {
            "task_leases": keeper.task_leases,
            "task_max_attempts": keeper.task_max_attempts,
        }
        if config.queues is not None:
            static["queues"] = list(config.queues)
        # Compiled on first use, one per (folds successes, some queue has a limit, size):
        # the size and the tasks' settings are constants in the text, so PostgreSQL plans
        # each once; the unchanging parameters are converted once, so each claim only sends
        # the successes it finishes. While no queue has a limit (`keeper.limits`), the
        # statement has no branch for limited queues and plans in less than half the time;
        # a queue limited meanwhile is held back by both until the next worker beat.
        self._static = static
        self._statements: dict[tuple[bool, bool, int], DriverStatement] = {}
        self._behind_warned = False
        # A burst worker's read of what is due later, until the claim after it (`_burst_wait`)
        self._look: tuple[Any, ...] | None = None
        self._flush_size = settings.board.flush_size
        max_batch = DEFAULT_MAX_BATCH if config.max_batch is None else config.max_batch
        self.sizes = ClaimSize(config.batch, max(config.batch, max_batch))

    def on_notify(self) -> None:
        self.notified = True
        self.wake.set()

    def run(self) -> None:
        """The dispatch loop, until stopping (or, in burst mode, until nothing is due)."""
        cfg, board = self.config, self.board
        idle_backoff = 0.05
        queue_empty = False
        next_poll = 0.0
        flush_after = 0.0
        # No maintenance here: the keeper's upkeep (worker.vacuum) ANALYZEs and VACUUMs.
        pulse = self.db.pulse  # busy while a round works, idle while it waits
        try:
            while not self.stopping.is_set():
                pulse.busy()
                now = time.monotonic()
                if self.notified or now >= next_poll:
                    self.notified = False
                    queue_empty = False
                # Handlers wake us for room to claim only while a claim may find jobs.
                board.claimable = not queue_empty
                size = self.sizes.next(now, board.finished)
                ahead = self.ahead(size, now)
                board.refill_at = ahead
                board.flush_size = max(self._flush_size, ahead)
                want = board.room(size, ahead)
                if board.outcomes and not flush_after:
                    flush_after = now + FLUSH_DELAY
                if (
                    (not queue_empty or (board.running == 0 and board.only_successes()))
                    and len(board.ready) <= ahead
                    and want > 0
                    and (want == size or board.running == 0)
                    and not self._keeper_behind()
                    and self.keeper.schema_refusal is None
                ):
                    wrote = cfg.burst and bool(board.outcomes)
                    # sent ahead, the claim's round trip overlaps the handlers: the jobs
                    # they return meanwhile tell the claim size how quick they are
                    finished, waiting = board.finished, len(board.ready)
                    claimed = self.claim(want)  # writes pending outcomes first
                    if not ahead:
                        finished = board.finished
                    self.sizes.claimed(size, claimed, time.monotonic(), finished)
                    self.stats.claims_ahead += waiting > 0
                    self.stats.largest_claim = max(self.stats.largest_claim, want)
                    flush_after = 0.0
                    if claimed < want:
                        # A burst looks again after writing outcomes: a job that depends on
                        # one became due in that statement, after its claim's snapshot.
                        queue_empty = not wrote
                        next_poll = time.monotonic() + idle_backoff
                        idle_backoff = min(idle_backoff * 2, cfg.poll_interval)
                    else:
                        idle_backoff = 0.05
                    continue
                if board.outcomes and (
                    len(board.outcomes) >= board.flush_size
                    or board.running == 0
                    or now >= flush_after
                ):
                    self.completer.flush()
                    self._look = None  # a retry written now is due later than it saw
                    flush_after = 0.0
                    queue_empty = queue_empty and not cfg.burst  # as after a claim's writes
                    continue
                if (
                    cfg.burst
                    and queue_empty
                    and not board.ready
                    and not board.outcomes
                    and (board.running == 0 or board.only_overrunning())
                ):
                    wait = self._burst_wait()
                    if wait is None:
                        return  # the shutdown writes overrunning handlers' outcomes
                    next_poll = now + wait
                timeouts = [next_poll - now] if queue_empty else []
                if flush_after:
                    timeouts.append(flush_after - now)
                if board.timed:
                    deadline = self._time_out(now)
                    if deadline is not None:
                        timeouts.append(deadline - now)
                if self._keeper_behind() or self.keeper.schema_refusal is not None:
                    timeouts.append(self.keeper.tick)  # look again once the keeper has
                if board.ready and board.wake_waiting(now):
                    timeouts.append(WAKE_MORE_AFTER)
                pulse.idle()
                self.wake.wait(max(0.0, min(timeouts)) if timeouts else None)
                self.wake.clear()
        except Stopped:
            return
        finally:
            pulse.idle()

    def ahead(self, size: int, now: float) -> int:
        """How many claimed jobs may still wait to start when the next claim is sent: `size`
        while the claims have grown past `batch` (the jobs are quick: `ClaimSize`) and no
        queue has a concurrency or rate limit, a fair or partition limit (the keeper's
        beat, `keeper.limits`); else 0, and the next claim waits for the ready queue to
        empty, as a limited queue's slots and slow jobs need. Sent ahead, the claim (with
        the finishes it folds) is in flight while the handlers run the batch before it:
        the worker's Python and the server's work overlap instead of adding up, and the
        worker holds at most concurrency + 2 x size jobs (the ones waiting are not
        running: they take no handler slot until a handler thread takes them). Only while
        the handlers keep up: once the oldest waiting job has waited `GROW_WITHIN`, the
        handlers, not the server, are what the jobs wait for, and the next claim waits for
        the ready queue to empty (a job claimed ahead never waits much longer than one
        claimed when the queue emptied, far from the executor's `RECHECK_AFTER`)."""
        if size <= self.config.batch or self.keeper.limits:
            return 0
        try:
            oldest = self.board.ready[0].claimed_at
        except IndexError:  # none waits (a handler thread may take the last meanwhile)
            return size
        return size if now - oldest <= GROW_WITHIN else 0

    def _burst_wait(self) -> float | None:
        """A burst worker with nothing due now: None to exit, recording what it leaves
        (`WorkerStats.not_yet_due`); or the seconds to wait, while a job of its queues
        falls due within `burst_wait`, or any does with `burst_until_empty` (polling at least
        every `poll_interval`). It reads what is due later *first*, then claims once more
        (0 seconds), and decides only when that claim found nothing: every queued job was
        then either due by the claim's snapshot or counted by the read before it, so none
        can fall due between the two unseen (as one did when the read came after the
        claim, in stop 43's CI)."""
        cfg = self.config
        look, self._look = self._look, None
        if look is None:
            self._look = tuple(self.db.execute(queries.not_yet_due(cfg.queues)).one())
            return 0.0
        count, earliest, seconds = look
        self.stats.not_yet_due, self.stats.next_due_at = int(count), earliest
        if not count or (not cfg.burst_until_empty and float(seconds) > cfg.burst_wait):
            return None
        return min(max(float(seconds), BURST_RECHECK), cfg.poll_interval)

    def _keeper_behind(self) -> bool:
        behind = self.keeper.behind()
        if behind and not self._behind_warned:
            log.warning("job heartbeats are failing: claiming no more jobs until they succeed")
        self._behind_warned = behind
        return behind

    def _statement(self, folds: bool, limits: bool, size: int) -> DriverStatement:
        key = (folds, limits, size)
        statement = self._statements.get(key)
        if statement is None:
            make = queries.complete_and_claim if folds else queries.claim_jobs
            statement = DriverStatement(
                make(self.config.queues, limits, size, self._settings),
                self.db.engine,
                self._static,
                JOB_ARRAYS if folds else (),
                kind="complete_and_claim" if folds else "claim",
            )
            self._statements[key] = statement
        return statement

    def claim(self, want: int) -> int:
        """Write pending outcomes, then claim up to `want` jobs.

        When every pending outcome is a success, finishing them and the claim are one
        statement: one commit per cycle instead of two.
        """
        limits = self.keeper.limits
        if self.board.outcomes:  # a retry written now is due later than `_look` saw
            self._look = None
        successes = self.completer.take_successes()
        if successes is None:
            self.completer.flush()
            result = self.db.execute(self._statement(False, limits, want))
            rows = result.all()
        else:
            # a job its handler's ctx.session() committed is finished already
            to_finish = [j for j in successes if not j.ctx.committed]
            params = {
                "job_ids": [j.id for j in to_finish],
                "job_attempts": [j.attempt for j in to_finish],
            }
            try:
                result = self.db.execute(self._statement(True, limits, want), params)
                rows = result.all()
            except DBAPIError as exc:  # one bad row must not cost the batch: apart, one by one
                if not is_row_error(exc):
                    raise
                log.warning("finishing and claiming at once failed (%s)", describe(exc))
                self.completer.write_successes(to_finish)
                result = self.db.execute(self._statement(False, limits, want))
                rows = result.all()
            else:
                finished = rows[0][list(result.keys()).index("finished")] if rows else 0
                if finished < len(to_finish):  # some kept or archived (or nothing to tell)
                    self.completer.write_successes(to_finish)  # fenced: the deleted are gone
            self.stats.succeeded += len(successes)
        if not rows:
            return 0
        columns = ClaimColumns(list(result.keys()))
        jobs: list[ClaimedJob] = []
        status, make_job = columns.status, self._make_job
        for row in rows:
            if row[status] == "cancelled":  # past its start deadline: cancelled by the claim
                log.info(
                    "job %s (%s) cancelled without running: expired (not started by its "
                    "expires_at)",
                    row[columns.id],
                    row[columns.task],
                )
                continue
            if row[status] != "running":  # exhausted its attempts: failed by the claim
                log.error(
                    "job %s (%s) failed: attempt %s exceeds its max_attempts",
                    row[columns.id],
                    row[columns.task],
                    row[columns.attempts],
                )
                self.stats.failed += 1
                self.executor.runner.counts.add(row[columns.queue], row[columns.task], failed=1)
                continue
            jobs.append(make_job(row, columns))
        if self._on_claimed is not None:
            for job in jobs:
                self._on_claimed(job)
        self.board.put(jobs)
        self.stats.claimed += len(rows)
        return len(rows)

    def _time_out(self, now: float) -> float | None:
        """Time out overrunning handlers; return the nearest deadline still ahead.

        A sync handler cannot be interrupted: its outcome is decided now (timed out:
        retried or failed by the usual rules), its context reports `cancelled`, and the
        outcome is written once the handler returns, whatever it returns. Until then its
        job stays running (leased, so not reaped) and keeps its slot of this worker and of
        its queue's limit. An async handler's task is cancelled, and it too keeps its slots
        until the task has ended.
        """
        expired, nearest = self.board.expired(now)
        for job in expired:
            assert job.deadline is not None
            self.executor.time_out(job, job.deadline)
        return nearest
