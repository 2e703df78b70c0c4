"""The completer: writes outcomes in batches, one statement per kind of outcome.

Succeeded jobs are finished by their queue's retention, read inside the statement. When
every pending outcome is a success, the producer folds the finishing into its next claim
(`take_successes`): one statement and one commit per cycle. A batch statement that fails
for its data (a result jsonb refuses, a delay out of range) is retried one job at a time,
so one bad row costs only its own outcome, never the batch's; and that outcome is replaced
by a failure that says why, written at once: no outcome that cannot be written ever makes
the job run again (the reaper would requeue a job left running).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError

from sqla_queue.db import queries
from sqla_queue.job.history import error_entry
from sqla_queue.job.outcome import WRITES_NOTHING, Outcome, OutcomeKind, storable
from sqla_queue.worker.board import JobBoard
from sqla_queue.worker.config import WorkerStats
from sqla_queue.worker.connection import (
    JOB_ARRAYS,
    DatabaseLink,
    DriverStatement,
    describe,
    is_row_error,
    refusal,
)
from sqla_queue.worker.jobs import ClaimedJob

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
        self._park_sleeping = queries.park_sleeping_jobs()
        self._free_cancelled = queries.free_cancelled_jobs()
        self._defer = queries.defer_jobs()
        self._store = queries.store_results()

    def take_successes(self) -> list[ClaimedJob] | None:
        """Take the pending outcomes' jobs if all are successes (for the claim to finish);
        else None. The caller counts them once its statement has run."""
        return self.board.take_successes()

    def write_successes(self, jobs: Sequence[ClaimedJob]) -> None:
        """Finish succeeded jobs on their own (when folding them into a claim failed)."""
        outcomes = [Outcome(OutcomeKind.succeeded, job) for job in jobs]
        self._fail_refused(self._write(self._complete, outcomes, _none))

    def flush(self) -> None:
        """Write every settled outcome. One that PostgreSQL refuses for its data (a result
        jsonb cannot hold, a delay out of range) is replaced by a failure naming why, never
        left for the reaper to run the job again."""
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
            if o.kind in (OutcomeKind.failed, OutcomeKind.timed_out)
            and not o.requeues
            and not o.result_pending
        ]
        pending = [o for o in outcomes if o.result_pending]  # committed by their session
        snoozed = [o for o in outcomes if o.kind is OutcomeKind.snoozed and not o.sleeps]
        sleeping = [o for o in outcomes if o.sleeps]
        refused = self._write(self._complete, succeeded, _result)
        self.stats.succeeded += len(succeeded)
        refused += self._write(
            self._retry,
            retried,
            lambda o: {"job_delays": o.retry_in, **_failed(o)},
        )
        self.stats.retried += len(retried)
        refused += self._write(self._fail, failed, _failed)
        self.stats.failed += len(failed)
        refused += self._write(self._snooze, snoozed, _snoozed)
        refused += self._write(self._park_sleeping, sleeping, _slept)
        self.stats.snoozed += len(snoozed) + len(sleeping)
        # a job cancelled while its handler ran kept its queue's slot until now
        given_up = [o for o in outcomes if o.job.ctx.cancelled]
        self._write(self._free_cancelled, given_up, _none)
        refused += self._write(self._store, pending, _stored)
        self.stats.failed += sum(1 for o in pending if o.kind is OutcomeKind.failed)
        deferred = [o for o in outcomes if o.kind is OutcomeKind.deferred]
        refused += self._write(self._defer, deferred, _with_error)
        self.stats.deferred += len(deferred)
        for outcome in outcomes:
            if outcome.kind is OutcomeKind.timed_out:
                self.stats.timed_out += 1
            elif outcome.kind is OutcomeKind.cancelled:
                self.stats.cancelled += 1
            elif outcome.kind is OutcomeKind.lost:
                self.stats.lost += 1
            elif outcome.kind is OutcomeKind.waiting:  # parked in its own transaction
                self.stats.waiting += 1
        self._fail_refused(refused)
        self.board.forget(o.job for o in outcomes)

    def _write(
        self,
        statement: Any,
        outcomes: Sequence[Outcome],
        extra: Callable[[Outcome], dict[str, Any]],
    ) -> list[tuple[Outcome, str]]:
        """One statement for the batch; on a data error, one per job. Returns the outcomes
        PostgreSQL refused for their own data, each with why."""
        if not outcomes:
            return []
        try:
            self.db.execute(statement, _params(outcomes, extra))
        except DBAPIError as exc:
            if not is_row_error(exc):  # e.g. a missing privilege: no row would go in
                raise
            if len(outcomes) == 1:
                return [(outcomes[0], refusal(exc))]
            log.warning(
                "writing %d outcomes failed (%s); one at a time", len(outcomes), describe(exc)
            )
            refused: list[tuple[Outcome, str]] = []
            for outcome in outcomes:
                refused += self._write(statement, [outcome], extra)
            return refused
        return []

    def _fail_refused(self, refused: Sequence[tuple[Outcome, str]]) -> None:
        """Fail, at once, the jobs whose outcome PostgreSQL refused: a job is never run
        again because its outcome could not be written (the reaper would requeue it)."""
        for outcome, why in refused:
            job = outcome.job
            reason = storable(_refused_reason(outcome, why))
            log.error(
                "job %s (%s): its outcome (%s) could not be stored (%s); failing it instead",
                job.id,
                job.task,
                outcome.kind.value,
                why,
            )
            self._correct_stats(outcome)
            # the reason is storable text; if even it is refused, a plain one surely goes in
            # a job its session committed keeps its row: its pending result becomes the error
            pending = outcome.result_pending
            statement, extra = (self._store, _stored) if pending else (self._fail, _failed)
            for text in (reason, FALLBACK_REASON):
                failure = Outcome(
                    OutcomeKind.failed,
                    job,
                    text,
                    None,
                    None,  # its history entry says why it was refused, not what it raised
                    result_pending=pending,
                    error_class=REFUSED_CLASS,
                )
                if not self._write(statement, [failure], extra):
                    break
            else:
                log.error("job %s (%s): not even its failure could be stored", job.id, job.task)

    def _correct_stats(self, outcome: Outcome) -> None:
        """Count a refused outcome as the failure that replaces it."""
        stats, kind = self.stats, outcome.kind
        if kind is OutcomeKind.succeeded:
            stats.succeeded -= 1
        elif kind is OutcomeKind.snoozed:
            stats.snoozed -= 1
        elif kind is OutcomeKind.deferred:
            stats.deferred -= 1
        elif outcome.requeues:
            stats.retried -= 1
        else:
            stats.failed -= 1
        stats.failed += 1


REFUSED_CLASS = "OutcomeNotStored"
"""The error history's class for a job failed because its outcome could not be stored."""
FALLBACK_REASON = "the job's outcome could not be stored (PostgreSQL refused it); see the log"
"""What a failed job records when PostgreSQL refused even the reason written for it."""


def _refused_reason(outcome: Outcome, why: str) -> str:
    """The failure that replaces an outcome PostgreSQL refused, saying what was refused."""
    kind = outcome.kind
    if kind is OutcomeKind.succeeded:
        what = "the handler's result" if outcome.result is not None else "the job's success"
        return f"{what} could not be stored: {why}; failed instead of running again"
    text = f"its outcome ({kind.value}) could not be stored: {why}; failed instead of running again"
    return f"{text}; the attempt's error was:\n{outcome.error}" if outcome.error else text


def _none(outcome: Outcome) -> dict[str, Any]:
    return {}


def _result(outcome: Outcome) -> dict[str, Any]:
    return {"job_results": outcome.result}


def _with_error(outcome: Outcome) -> dict[str, Any]:
    return {"job_errors": storable(outcome.error)}


def _failed(outcome: Outcome) -> dict[str, Any]:
    """A failed attempt's error for last_error, and its history entry (`job.history`)."""
    error_class, message, traceback = error_entry(outcome)
    return {
        "job_errors": storable(outcome.error),
        "job_error_classes": error_class,
        "job_error_messages": message,
        "job_error_tracebacks": traceback,
    }


def _stored(outcome: Outcome) -> dict[str, Any]:
    if outcome.kind is OutcomeKind.succeeded:
        return {
            "job_results": outcome.result,
            "job_errors": None,
            "job_error_classes": None,
            "job_error_messages": None,
            "job_error_tracebacks": None,
        }
    return {"job_results": None, **_failed(outcome)}


def _snoozed(outcome: Outcome) -> dict[str, Any]:
    return {
        "job_delays": outcome.retry_in,
        "job_errors": storable(outcome.error),
        "job_task_max_attempts": outcome.task_max_attempts,
    }


def _slept(outcome: Outcome) -> dict[str, Any]:
    return {"job_delays": outcome.retry_in, "job_task_max_attempts": outcome.task_max_attempts}


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
