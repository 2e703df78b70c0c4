"""Exceptions. Each class's docstring is its default message; arguments fill it in."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any


class SqlaQueueError(Exception):
    """Something went wrong in sqla-queue."""

    def __init__(self, message: str | None = None, **context: Any) -> None:
        self.context = context
        text = message if message is not None else (self.__doc__ or "").strip()
        super().__init__(text.format(**context) if context else text)


class ConfigurationError(SqlaQueueError):
    """The configuration is not valid: {detail}"""


class SchemaMissingError(SqlaQueueError):
    """The database has no sqla-queue schema, or an older revision of it ({found}); this version needs {expected}. Run `sqla-queue migrate` (or `alembic upgrade heads`) first."""  # noqa: E501


class SchemaUnknownError(SqlaQueueError):
    """The database's sqla-queue schema records revision {found}, which this version of sqla-queue does not know (its newest is {known}): a newer sqla-queue migrated it, and this one would ignore what that added. Run the version that migrated it (upgrade sqla-queue here), or downgrade the schema with that version first."""  # noqa: E501


class SchemaElsewhereError(SqlaQueueError):
    """The sqla_queue schema is already there (revision {found}) but sqla-queue migrate did not record it: {fix}."""  # noqa: E501


class MigrationBlockedError(SqlaQueueError):
    """The revision after {after} did not get its lock in {tries} tries of {timeout:g} s each (lock_timeout): {holder}. End that transaction (or wait for a quieter moment) and run `sqla-queue migrate` again; it resumes there."""  # noqa: E501


class OlderWorkersError(SqlaQueueError):
    """Refusing contract revision(s) {revisions}: they remove what code built for an earlier revision uses, and these live workers are older: {workers}. Upgrade or stop them first (deploy the new code, then migrate), or pass --force."""  # noqa: E501


class UnknownQueueError(SqlaQueueError):
    """Queue {queue!r} does not exist. Create it with `sqla-queue queues create {queue}` or `sqla_queue.admin.jobs.create_queue(session, {queue!r})`."""  # noqa: E501


class OrphanJobsError(SqlaQueueError):
    """Cannot restore the queue foreign key: jobs reference queues that do not exist ({orphans}). Create each queue (`sqla-queue queues create NAME`) or delete its jobs, then run `sqla-queue migrate --restore-queue-fk` again."""  # noqa: E501


class InvalidJobError(SqlaQueueError, ValueError):
    """Job for task {task!r} is not valid: {detail}"""


class DependencyError(InvalidJobError):
    """Job for task {task!r} cannot depend on what it names: {detail}"""


class UnknownTaskError(InvalidJobError):
    """unknown task {task!r}: no handler is registered under that name in {registry}{hint}"""

    def __init__(
        self,
        message: str | None = None,
        *,
        task: object,
        hint: str | None = None,
        registry: str | None = None,
        **context: Any,
    ) -> None:
        # One error for both sides: enqueue refuses a name its registry lacks (with a hint),
        # a worker defers a job whose task it has no handler for.
        if registry is None:
            registry = (
                "the registry in force (the task's own, or the default set with "
                "sqla_queue.set_default_registry)"
                if hint
                else "this worker's registry"
            )
        super().__init__(
            message, task=task, registry=registry, hint=f"; {hint}" if hint else "", **context
        )


class AppLoadError(SqlaQueueError):
    """Cannot load the task registry {path!r}: {detail}"""

    raised: BaseException | None = None
    """The exception the application's module raised while it was imported (None: it was
    not found, or is not a registry): the CLI prints its traceback, file and line."""


class JobTimeoutError(SqlaQueueError):
    """Job {job_id} of task {task!r} ran longer than its timeout of {timeout} s"""


class JobCancelledError(SqlaQueueError):
    """Job {job_id} was cancelled while it ran"""


class JobLostError(SqlaQueueError):
    """Job {job_id} is no longer held by this worker (its lease expired or it was cancelled)"""


class JobFailedError(SqlaQueueError):
    """Job {job_id} ({task!r}) ended {status}: {error}"""

    def __init__(self, job_id: int, task: str, status: str, error: str | None) -> None:
        super().__init__(job_id=job_id, task=task, status=status, error=error or "no error")
        self.job_id, self.task, self.status, self.error = job_id, task, status, error


class ResultTimeoutError(SqlaQueueError, TimeoutError):
    """Job {job_id} did not finish within {timeout:g} s (it is {status}); wait again, or raise the timeout"""  # noqa: E501


class ResultMissingError(SqlaQueueError, LookupError):
    """No job {job_id} in sqla_queue.jobs or the archive: a job that succeeded in a queue that deletes its jobs leaves no row unless its task has keep_result=True (then for the queue's result_ttl), and `sqla-queue prune` removes old ones"""  # noqa: E501


class DatabaseUnavailableError(SqlaQueueError):
    """The database did not answer for {seconds:g} s ({reason}); check the URL and that the server runs, or wait longer with --give-up-after"""  # noqa: E501


MAX_SNOOZE = timedelta(days=3650)
"""The longest delay `Snooze` takes (further would leave PostgreSQL's timestamp range)."""


class Snooze(Exception):
    """Raised by a handler or a middleware: put the job back to queued, due after `seconds`
    (a number or a timedelta), without spending an attempt; `reason` is recorded."""

    def __init__(self, seconds: float | timedelta, reason: str = "") -> None:
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(
                f"Snooze needs a number of seconds or a timedelta, got {type(seconds).__name__}"
            )
        if not math.isfinite(value) or not 0 <= value <= MAX_SNOOZE.total_seconds():
            raise ValueError(
                f"Snooze delay must be between 0 and {MAX_SNOOZE.total_seconds():.0f} seconds "
                f"(10 years), got {seconds!r}; pass a finite, non-negative delay"
            )
        self.seconds = float(value)
        self.reason = str(reason)
        super().__init__(self.describe())

    def describe(self) -> str:
        """What the job's last_error records: the delay and the reason."""
        text = f"snoozed for {self.seconds:g} s"
        return f"{text}: {self.reason}" if self.reason else text


class StepResultError(SqlaQueueError, ValueError):
    """Step {step!r} of job {job_id} ran, but its result cannot be recorded: {detail}"""


class Suspended(BaseException):
    """A durable job's run ends here and the job is parked, holding no worker, queue or
    partition slot and spending no attempt: raised by `ctx.sleep` (`Sleeping`) and by
    `ctx.wait_for_signal` (`WaitingForSignal`). A `BaseException`, as
    `asyncio.CancelledError` is, so a handler's own `except Exception` cannot swallow it;
    a handler that catches it all the same (`except BaseException`) still ends parked: the
    run's outcome is the park, whatever the handler does after."""


class Sleeping(Suspended):
    """Raised by `ctx.sleep` and `ctx.sleep_until`: ends this run of the job, which is
    parked (status `waiting`, no slot held) until the sleep's end and then runs again, its
    finished steps replayed, not run, without spending an attempt."""

    def __init__(self, seconds: float, until: str, name: str) -> None:
        self.seconds = min(max(float(seconds), 0.0), MAX_SNOOZE.total_seconds())
        """Seconds to the sleep's end (by the database clock), when it was read."""
        self.until = until
        self.name = name
        super().__init__(self.describe())

    def describe(self) -> str:
        """The run's outcome: which sleep, and until when."""
        return f"sleeping until {self.until} (sleep {self.name!r})"


class SignalTimeout(SqlaQueueError, TimeoutError):
    """No signal {key!r} came before the wait's deadline ({deadline}): catch it in the handler to do what the timeout means (a reminder, a cancel of the order)."""  # noqa: E501

    def __init__(self, message: str | None = None, *, key: str, deadline: object) -> None:
        self.key = key
        self.deadline = deadline
        super().__init__(message, key=key, deadline=deadline)


class WaitingForSignal(Suspended):
    """Raised by `ctx.wait_for_signal` once it has parked the job (status `waiting`, no slot
    held, no attempt spent): ends this run; the job runs again when the signal comes or the
    wait times out. A `Suspended`: a handler's own `except Exception` does not swallow it,
    and a handler that swallows it all the same still ends parked (the worker writes
    nothing for it)."""

    def __init__(self, key: str, deadline: object, retry_in: float | None = None) -> None:
        self.key = key
        self.deadline = deadline
        self.retry_in = retry_in
        """Seconds until the job runs again when it could not park (a sender's transaction
        on the key was open), its attempt refunded; None once parked."""
        super().__init__(self.describe())

    def describe(self) -> str:
        """The outcome's reason: the key and until when."""
        if self.retry_in is not None:
            return (
                f"signal {self.key!r} is being sent in an open transaction: "
                f"runs again in {self.retry_in:g} s"
            )
        return f"waiting for signal {self.key!r} until {self.deadline}"


__all__ = [
    "AppLoadError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DependencyError",
    "InvalidJobError",
    "JobCancelledError",
    "JobFailedError",
    "JobLostError",
    "JobTimeoutError",
    "OrphanJobsError",
    "ResultMissingError",
    "ResultTimeoutError",
    "SchemaElsewhereError",
    "SchemaMissingError",
    "SchemaUnknownError",
    "SignalTimeout",
    "Sleeping",
    "Snooze",
    "SqlaQueueError",
    "StepResultError",
    "Suspended",
    "UnknownQueueError",
    "UnknownTaskError",
    "WaitingForSignal",
]
