"""sqla-queue: a PostgreSQL job queue for applications that already use SQLAlchemy.

with Session(engine) as session, session.begin():
    session.add(order)
    enqueue(session, "emails.send_receipt", {"order_id": order.id})
# both rows commit, or neither; workers are woken by NOTIFY on commit
"""

from __future__ import annotations

from typing import Any

from .database import normalize_url
from .deprecation import renamed_name
from .enqueue import EnqueuedIds, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from .errors import (
    AppLoadError,
    ConfigurationError,
    DatabaseUnavailableError,
    DependencyError,
    InvalidJobError,
    JobCancelledError,
    JobFailedError,
    JobLostError,
    JobTimeoutError,
    OrphanJobsError,
    ResultMissingError,
    ResultTimeoutError,
    SchemaElsewhereError,
    SchemaMissingError,
    SchemaUnknownError,
    Snooze,
    SqlaQueueError,
    UnknownQueueError,
    UnknownTaskError,
)
from .errors import TaskNotFoundError as TaskNotFoundError  # UnknownTaskError's old name
from .hooks import InsertHook, NewJob, default_registry, set_default_registry
from .inserts.links import Dependency
from .job.options import JobOptions
from .job.states import JobStatus
from .middleware import Middleware
from .models import RENAMED as _RENAMED
from .models import ArchivedJob, Job, Queue, QueueBase, Retention
from .registry import JobContext, Registry, Task, load_registry
from .results import wait_for, wait_for_async
from .retry import RetryPolicy
from .unique import Unique
from .validation import limits
from .worker import Outcome, OutcomeKind, Worker, WorkerConfig, WorkerStats
from .workflows import Signature, WorkflowHandle, chain, chord, group, signature

__version__ = "0.1.0"

__all__ = [
    "AppLoadError",
    "ArchivedJob",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "Dependency",
    "DependencyError",
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
    "Middleware",
    "NewJob",
    "OrphanJobsError",
    "Outcome",
    "OutcomeKind",
    "Queue",
    "QueueBase",
    "Registry",
    "ResultMissingError",
    "ResultTimeoutError",
    "Retention",
    "RetryPolicy",
    "SchemaElsewhereError",
    "SchemaMissingError",
    "SchemaUnknownError",
    "Signature",
    "Snooze",
    "SqlaQueueError",
    "Task",
    "Unique",
    "UnknownQueueError",
    "UnknownTaskError",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "WorkflowHandle",
    "chain",
    "chord",
    "default_registry",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "group",
    "limits",
    "load_registry",
    "normalize_url",
    "set_default_registry",
    "signature",
    "wait_for",
    "wait_for_async",
]


def __getattr__(name: str) -> Any:
    return renamed_name(__name__, name, _RENAMED)
