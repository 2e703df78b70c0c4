"""Shutdown: release jobs that have not started, let running ones finish within the
shutdown timeout, requeue the rest; and the second signal's immediate exit."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine, pool

from sqla_queue.db import queries
from sqla_queue.db.database import begin_read_committed
from sqla_queue.job.outcome import Outcome, OutcomeKind
from sqla_queue.worker.board import JobBoard
from sqla_queue.worker.completer import Completer
from sqla_queue.worker.config import WorkerConfig, WorkerStats
from sqla_queue.worker.connection import DatabaseLink, Stopped, describe
from sqla_queue.worker.jobs import ClaimedJob

log = logging.getLogger("sqla_queue.worker")

EXIT_RELEASE_TIMEOUT = 3.0
"""Seconds the second signal's release may take before the process exits regardless."""


def release_params(jobs: list[ClaimedJob], refund: int) -> dict[str, list[int]]:
    """Parameters of `queries.release_jobs` for `jobs`, each refunded `refund` attempts."""
    return {
        "job_ids": [j.id for j in jobs],
        "job_attempts": [j.attempt for j in jobs],
        "job_refunds": [refund] * len(jobs),
    }


NO_RESULT_AT_EXIT = (
    "the worker stopped before the handler returned (its session had committed the job): "
    "no result is kept"
)
"""Why a job its handler's session finished has no kept result after a shutdown."""


@dataclass(eq=False)
class Shutdown:
    """Ends a worker's claims in order, on the dispatcher thread."""

    config: WorkerConfig
    db: DatabaseLink
    board: JobBoard
    completer: Completer
    stats: WorkerStats
    wake: threading.Event
    """The dispatcher's wake event (outcomes, room on the board): the wait for running jobs
    flushes and looks again when it is set."""
    on_finished: Callable[[Outcome], None]
    """Told each job this ends without its handler's outcome (released, or as decided)."""

    def drain(self) -> None:
        """Release unstarted jobs now; give running ones the shutdown timeout, then release."""
        try:
            self._release(self.board.take_unstarted(), refund=1)
            deadline = time.monotonic() + self.config.shutdown_timeout
            while True:
                self.completer.flush()
                if self.board.running == 0 or time.monotonic() >= deadline:
                    break
                self.wake.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                self.wake.clear()
            left = [job for job in self.board.snapshot() if job.take()]
            # finished by their handler's own session: a result kept for them stays pending
            # for good unless written now (a no-op for tasks that keep none)
            committed = [job for job in left if job.ctx.committed]
            for job in committed:
                outcome = Outcome(OutcomeKind.failed, job, NO_RESULT_AT_EXIT, result_pending=True)
                self.board.settle(job, outcome)
            left = [job for job in left if not job.ctx.committed]
            decided = [job for job in left if job.pending is not None or job.ctx.cancelled]
            for job in decided:  # their handlers overran a timeout or a cancel: as decided
                outcome = job.pending or Outcome(_given_up_kind(job), job)
                self.on_finished(outcome)
                self.board.settle(job, outcome)
            left = [job for job in left if job not in decided]
            for job in left:
                job.ctx.mark_lost("lost")
                self.board.settle(job, None)
            if decided:
                log.warning(
                    "%d handler(s) past their timeout or cancel still running at exit: "
                    "their jobs are written as decided (%s)",
                    len(decided),
                    ", ".join(f"{job.id} ({job.task})" for job in decided[:10]),
                )
            if left:
                log.warning(
                    "%d job(s) still running after the %ss shutdown timeout; requeueing them",
                    len(left),
                    self.config.shutdown_timeout,
                )
            self._release(left, refund=0)
            self.completer.flush()
        except Stopped:
            log.warning("database unavailable during shutdown; the reaper will requeue held jobs")

    def _release(self, jobs: list[ClaimedJob], refund: int) -> None:
        if not jobs:
            return
        self.db.execute(queries.release_jobs(), release_params(jobs, refund))
        self.stats.released += len(jobs)
        self.board.forget(jobs)
        for job in jobs:
            self.on_finished(Outcome(OutcomeKind.released, job, "the worker stopped"))


def _given_up_kind(job: ClaimedJob) -> OutcomeKind:
    return OutcomeKind.cancelled if job.ctx.lost_reason == "cancelled" else OutcomeKind.lost


def exit_now(engine: Engine, board: JobBoard) -> None:
    """The second signal: requeue every held job on a fresh connection, within a few
    seconds, then exit at once. Never the dispatcher's connection: a statement may be in
    flight on it, and reusing it could deadlock."""
    held = board.snapshot()
    unstarted = [job for job in held if not job.started]
    started = [job for job in held if job.started]

    def release() -> None:
        fresh = create_engine(
            engine.url,
            poolclass=pool.NullPool,
            connect_args={"connect_timeout": 2},
        )
        try:
            with begin_read_committed(fresh) as conn:
                # the transaction's own: PgBouncer refuses an `options` startup parameter
                conn.exec_driver_sql("SET LOCAL statement_timeout = 2000")
                if unstarted:
                    conn.execute(queries.release_jobs(), release_params(unstarted, 1))
                if started:
                    conn.execute(queries.release_jobs(), release_params(started, 0))
        except Exception as exc:
            log.warning("could not requeue held jobs on exit (%s); the reaper will", describe(exc))
        finally:
            fresh.dispose()

    try:
        if held:
            releaser = threading.Thread(target=release, name="sqla-queue-exit", daemon=True)
            releaser.start()
            releaser.join(EXIT_RELEASE_TIMEOUT)
    finally:
        logging.shutdown()
        os._exit(1)
