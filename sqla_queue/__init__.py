"""sqla-queue: a PostgreSQL job queue for applications that already use SQLAlchemy.

with Session(engine) as session, session.begin():
    session.add(order)
    enqueue(session, "emails.send_receipt", {"order_id": order.id})
# both rows commit, or neither; workers are woken by NOTIFY on commit
"""

from __future__ import annotations

from .database import normalize_url
from .enqueue import EnqueuedIds, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from .errors import (
    AppLoadError,
    ConfigurationError,
    DatabaseUnavailableError,
    InvalidJobError,
    JobCancelledError,
    JobFailedError,
    JobLostError,
    JobTimeoutError,
    OrphanJobsError,
    ResultMissingError,
    ResultTimeoutError,
    SchemaMissingError,
    Snooze,
    SqlaQueueError,
    TaskNotFoundError,
    UnknownQueueError,
    UnknownTaskError,
)
from .hooks import InsertHook, NewJob, default_registry, set_default_registry
from .job.options import JobOptions
from .models import ArchivedJob, Base, Job, JobStatus, Queue, Retention, limits
from .registry import JobContext, Registry, Task, load_registry
from .results import wait_for, wait_for_async
from .retry import RetryPolicy
from .unique import Unique
from .worker import Outcome, OutcomeKind, Worker, WorkerConfig, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "AppLoadError",
    "ArchivedJob",
    "Base",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "EnqueuedIds",
    "InsertHook",
    "InvalidJobError",
    "Job",
    "JobCancelledError",
    "JobContext",
    "JobFailedError",
    "JobLostError",
    "JobOptions",
    "JobStatus",
    "JobTimeoutError",
    "NewJob",
    "OrphanJobsError",
    "Outcome",
    "OutcomeKind",
    "Queue",
    "Registry",
    "ResultMissingError",
    "ResultTimeoutError",
    "Retention",
    "RetryPolicy",
    "SchemaMissingError",
    "Snooze",
    "SqlaQueueError",
    "Task",
    "TaskNotFoundError",
    "Unique",
    "UnknownQueueError",
    "UnknownTaskError",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "default_registry",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "limits",
    "load_registry",
    "normalize_url",
    "set_default_registry",
    "wait_for",
    "wait_for_async",
]
