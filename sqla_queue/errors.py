"""Exceptions. Each class's docstring is its default message; arguments fill it in."""

from __future__ import annotations

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


class SchemaElsewhereError(SqlaQueueError):
    """The sqla_queue schema is already there (revision {found}) but sqla-queue migrate did not record it: {fix}."""  # noqa: E501


class UnknownQueueError(SqlaQueueError):
    """Queue {queue!r} does not exist. Create it with `sqla-queue queues create {queue}` or `sqla_queue.admin.create_queue(session, {queue!r})`."""  # noqa: E501


class OrphanJobsError(SqlaQueueError):
    """Cannot restore the queue foreign key: jobs reference queues that do not exist ({orphans}). Create each queue (`sqla-queue queues create NAME`) or delete its jobs, then run `sqla-queue migrate --restore-queue-fk` again."""  # noqa: E501


class InvalidJobError(SqlaQueueError, ValueError):
    """Job for task {task!r} is not valid: {detail}"""


class UnknownTaskError(InvalidJobError):
    """No task {task!r} is registered in the registry in force (the task's own, or the default set with sqla_queue.set_default_registry): {hint}"""  # noqa: E501


class TaskNotFoundError(SqlaQueueError):
    """unknown task {task!r}: no handler is registered under that name in this worker's registry"""


class AppLoadError(SqlaQueueError):
    """Cannot load the task registry {path!r}: {detail}"""


class JobTimeoutError(SqlaQueueError):
    """Job {job_id} of task {task!r} ran longer than its timeout of {timeout} s"""


class JobCancelledError(SqlaQueueError):
    """Job {job_id} was cancelled while it ran"""


class JobLostError(SqlaQueueError):
    """Job {job_id} is no longer held by this worker (its lease expired or it was cancelled)"""


class DatabaseUnavailableError(SqlaQueueError):
    """The database did not answer for {seconds:g} s ({reason}); check the URL and that the server runs, or wait longer with --give-up-after"""  # noqa: E501


__all__ = [
    "AppLoadError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "InvalidJobError",
    "JobCancelledError",
    "JobLostError",
    "JobTimeoutError",
    "OrphanJobsError",
    "SchemaElsewhereError",
    "SchemaMissingError",
    "SqlaQueueError",
    "TaskNotFoundError",
    "UnknownQueueError",
    "UnknownTaskError",
]
