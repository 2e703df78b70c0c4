"""The completer: writes outcomes in batches, one statement per kind of outcome.

Succeeded jobs are finished by their queue's retention, read inside the statement. When
every pending outcome is a success, the producer folds the finishing into its next claim
(`take_successes`): one statement and one commit per cycle. A batch statement that fails
with a database error other than a lost connection is retried one job at a time, so one
bad row costs only its own outcome, never the batch's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError

from sqla_queue import queries

from .board import JobBoard
from .config import WorkerStats
from .connection import JOB_ARRAYS, DatabaseLink, DriverStatement, describe, is_row_error
from .jobs import WRITES_NOTHING, ClaimedJob, Outcome, OutcomeKind, storable

log = logging.getLogger("sqla_queue.worker")

FLUSH_DELAY = 0.05
"""Seconds an outcome may wait for others before it is written."""


class Completer:
    """Turns settled outcomes into finishing statements."""

    def __init__(self, board: JobBoard, db: DatabaseLink, stats: WorkerStats) -> None:
        self.board = board
        self.db = db
        self.stats = stats
        self._complete = DriverStatement(
            queries.complete_jobs(), db.engine, {}, JOB_ARRAYS, kind="complete"
        )
        self._retry = queries.retry_jobs()
        self._fail = queries.fail_jobs()
        self._snooze = queries.snooze_jobs()
        self._free_cancelled = queries.free_cancelled_jobs()

    def take_successes(self) -> list[ClaimedJob] | None:
        """Take the pending outcomes' jobs if all are successes (for the claim to finish);
        else None. The caller counts them once its statement has run."""
        return self.board.take_successes()

    def write_successes(self, jobs: Sequence[ClaimedJob]) -> None:
        """Finish succeeded jobs on their own (when folding them into a claim failed)."""
        self._write(self._complete, [Outcome(OutcomeKind.succeeded, job) for job in jobs], _none)

    def flush(self) -> None:
        """Write every settled outcome."""
        outcomes = self.board.take_outcomes()
        if not outcomes:
            return
        succeeded = [o for o in outcomes if o.kind is OutcomeKind.succeeded]
        self.stats.succeeded += sum(1 for o in succeeded if o.committed)
        succeeded = [o for o in succeeded if not o.committed]  # written by their own commit
        retried = [o for o in outcomes if o.kind not in WRITES_NOTHING and o.requeues]
        failed = [
            o
            for o in outcomes
            if o.kind in (OutcomeKind.failed, OutcomeKind.timed_out) and not o.requeues
        ]
        self._write(self._complete, succeeded, _result)
        self.stats.succeeded += len(succeeded)
        self._write(
            self._retry,
            retried,
            lambda o: {"job_delays": o.retry_in, "job_errors": storable(o.error)},
        )
        self.stats.retried += len(retried)
        self._write(self._fail, failed, lambda o: {"job_errors": storable(o.error)})
        self.stats.failed += len(failed)
        snoozed = [o for o in outcomes if o.kind is OutcomeKind.snoozed]
        self._write(self._snooze, snoozed, _snoozed)
        self.stats.snoozed += len(snoozed)
        # a job cancelled while its handler ran kept its queue's slot until now
        given_up = [o for o in outcomes if o.job.ctx.cancelled]
        self._write(self._free_cancelled, given_up, _none)
        for outcome in outcomes:
            if outcome.kind is OutcomeKind.timed_out:
                self.stats.timed_out += 1
            elif outcome.kind is OutcomeKind.cancelled:
                self.stats.cancelled += 1
            elif outcome.kind is OutcomeKind.lost:
                self.stats.lost += 1
        self.board.forget(o.job for o in outcomes)

    def _write(
        self,
        statement: Any,
        outcomes: Sequence[Outcome],
        extra: Callable[[Outcome], dict[str, Any]],
    ) -> None:
        """One statement for the batch; on a database error, one per job."""
        if not outcomes:
            return
        try:
            self.db.execute(statement, _params(outcomes, extra))
        except DBAPIError as exc:
            if not is_row_error(exc):  # e.g. a missing privilege: no row would go in
                raise
            if len(outcomes) == 1:
                (outcome,) = outcomes
                log.error(
                    "could not record the outcome (%s) of job %s (%s): %s; the reaper will "
                    "requeue it when its lease expires",
                    outcome.kind.value,
                    outcome.job.id,
                    outcome.job.task,
                    describe(exc),
                )
                return
            log.warning(
                "writing %d outcomes failed (%s); one at a time", len(outcomes), describe(exc)
            )
            for outcome in outcomes:
                self._write(statement, [outcome], extra)


def _none(outcome: Outcome) -> dict[str, Any]:
    return {}


def _result(outcome: Outcome) -> dict[str, Any]:
    return {"job_results": outcome.result}


def _snoozed(outcome: Outcome) -> dict[str, Any]:
    return {
        "job_delays": outcome.retry_in,
        "job_errors": storable(outcome.error),
        "job_task_max_attempts": outcome.task_max_attempts,
    }


def _params(
    outcomes: Sequence[Outcome], extra: Callable[[Outcome], dict[str, Any]]
) -> dict[str, list[Any]]:
    params: dict[str, list[Any]] = {
        "job_ids": [o.job.id for o in outcomes],
        "job_attempts": [o.job.attempt for o in outcomes],
    }
    for outcome in outcomes:
        for name, value in extra(outcome).items():
            params.setdefault(name, []).append(value)
    return params
