"""The executor: the table worker's handler threads and event loop around `run_job`.

Handler threads (`serve`) take claimed jobs from the board, run each through the job
core's `JobRunner.run_job` (the one place a handler is called, shared with the broker
worker), and settle it with the `Outcome`. A handler's awaitable result is run on the
worker's event loop (`loop`) while the thread waits for it. Timeouts are watched by the
producer (`time_out`), which decides the job's outcome, tells its context, and cancels an
async handler's task; the outcome is written only once the handler has returned (a sync
handler cannot be interrupted): until then the job stays running and keeps its slot of the
worker and of its queue's limit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from sqla_queue.db import queries
from sqla_queue.db.models import JobStatus
from sqla_queue.job.outcome import JobAttempt, Outcome, OutcomeKind, error_text
from sqla_queue.job.run import JobRunner, lost_kind, max_attempts_of
from sqla_queue.registry import Registry
from sqla_queue.worker.board import JobBoard
from sqla_queue.worker.jobs import ClaimedJob

log = logging.getLogger("sqla_queue.worker")

__all__ = ["RECHECK_AFTER", "Executor"]

RECHECK_AFTER = 1.0
"""Seconds a claimed job may wait locally before the executor checks it is still ours."""


class Executor:
    """The handler threads and the event loop; each job runs through `JobRunner.run_job`."""

    def __init__(
        self,
        registry: Registry,
        board: JobBoard,
        engine: Engine,
        on_finished: Callable[[Outcome], None],
        worker_id: str = "?",
    ) -> None:
        self.registry = registry
        self.board = board
        self.engine = engine
        self._on_finished = on_finished
        self.runner = JobRunner(registry, self.loop, self._watch_deadline, worker_id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self.loop_seen = time.monotonic()
        """When the event loop last ran a probe (the keeper's check for a blocked loop)."""
        self._probe_sent = 0.0
        self.reporter = self.runner.reporter

    # -- handler threads ----------------------------------------------------------------------

    def start_thread(self) -> None:
        threading.Thread(target=self.serve, name="sqla-queue-job", daemon=True).start()

    def serve(self) -> None:
        """A handler thread: run ready jobs while there is room, one lock round per job."""
        job: ClaimedJob | None = None
        outcome: Outcome | None = None
        owned = False
        while True:
            job = self.board.next_job(job, outcome, owned)
            if job is None:
                return
            # a handler that overran its timeout ends with the outcome decided then
            outcome = self.execute(job)
            if job.deadline is None:  # nothing held for it (`hold_overrun` needs a deadline)
                outcome = outcome if job.take() else None
            else:
                outcome = self.board.returned(job, outcome)
            owned = outcome is not None
            if outcome is not None:  # before the outcome is visible: hooks run first
                self._on_finished(outcome)

    def execute(self, job: ClaimedJob) -> Outcome:
        """Run one job (unless it was cancelled or lost while it waited here); always
        returns its outcome."""
        try:
            if job.ctx.cancelled or time.monotonic() - job.claimed_at >= RECHECK_AFTER:
                skipped = self._skip_reason(job)
                if skipped is not None:
                    return Outcome(skipped, job, f"job was {skipped.value} before it started")
        except BaseException as exc:  # a bug in the worker itself must still settle the job
            log.exception("job %s (%s): the worker failed to run it", job.id, job.task)
            return Outcome(OutcomeKind.failed, job, error_text(exc), None, exc)
        return self.runner.run_job(job)

    def _watch_deadline(self, job: JobAttempt, deadline: float) -> None:
        assert isinstance(job, ClaimedJob)  # the runner runs only this worker's jobs
        self.board.watch_deadline(job, deadline)

    def _skip_reason(self, job: ClaimedJob) -> OutcomeKind | None:
        """Whether a job must not start: cancelled or lost while it waited here (called for a
        job already cancelled, or one that waited `RECHECK_AFTER` seconds)."""
        if not job.ctx.cancelled:
            self._recheck(job)
        return lost_kind(job.ctx) if job.ctx.cancelled else None

    def _recheck(self, job: ClaimedJob) -> None:
        """A job that waited locally: is it still ours? (A cancel may have come meanwhile.)"""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(queries.job_status(), {"job_id": job.id}).mappings().first()
        except Exception as exc:  # unknown: run it; the finishing statement is fenced
            log.debug("could not re-check job %s before it started: %s", job.id, exc)
            return
        if row is None or row["status"] != JobStatus.running.value:
            job.ctx.mark_lost("cancelled" if row and row["status"] == "cancelled" else "lost")
        elif row["attempts"] != job.attempt:
            job.ctx.mark_lost("lost")

    # -- async handlers -----------------------------------------------------------------------

    def give_up(self, job: ClaimedJob, reason: str) -> None:
        """Tell a job's handler it is timed out or cancelled (`ctx.cancelled`); an async
        handler's task is cancelled at its next await."""
        self.runner.give_up(job, reason, self._loop)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The worker's event loop, started on first use by an async handler."""
        with self._loop_lock:
            if self._loop is None:
                self.loop_seen = time.monotonic()
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(
                    target=self._loop.run_forever, name="sqla-queue-async", daemon=True
                )
                self._loop_thread.start()
            return self._loop

    @property
    def has_loop(self) -> bool:
        return self._loop is not None

    def probe_loop(self) -> float | None:
        """How long the event loop has left a probe unrun (None without a loop, 0 when it
        ran the last one); sends a new probe once the last one has run."""
        loop = self._loop
        if loop is None:
            return None
        lag = self.loop_lag()
        if not lag:
            self._probe_sent = time.monotonic()
            loop.call_soon_threadsafe(self._loop_alive)
        return lag

    def loop_lag(self) -> float:
        """Seconds the last probe has waited for the event loop (0 once it ran)."""
        if self._loop is None or self._probe_sent <= self.loop_seen:
            return 0.0
        return time.monotonic() - self._probe_sent

    def _loop_alive(self) -> None:
        self.loop_seen = time.monotonic()

    def stop_loop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        # Abandoned async handlers get a CancelledError to clean up, not a silent drop.
        cancelled = asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), loop)
        try:
            cancelled.result(2)
        except Exception:
            log.warning("async handlers did not finish cancelling within 2 s")
        loop.call_soon_threadsafe(loop.stop)
        if self._loop_thread is not None:
            self._loop_thread.join(2)

    # -- timeouts -----------------------------------------------------------------------------

    def time_out(self, job: ClaimedJob, deadline: float) -> None:
        """Called by the producer for a job past its deadline: its outcome is decided and
        held until the handler returns (`JobBoard.hold_overrun`), the handler told."""
        if job.ctx.committed:  # its own ctx.session() commit finished it in time
            return
        task = self.registry[job.task]
        outcome = self.runner.timed_out(job)
        if not self.board.hold_overrun(job, outcome):  # it returned meanwhile
            return
        job.gave_up_at = deadline
        log.warning(
            "job %s (%s) timed out after %ss; it keeps its slot until its handler returns",
            job.id,
            job.task,
            task.timeout,
        )
        self.reporter.report(outcome, max_attempts_of(job.max_attempts, task))
        self.give_up(job, "timed out")


async def _cancel_other_tasks() -> None:
    """Cancel every task on the running loop but this one, and wait for them to end."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
