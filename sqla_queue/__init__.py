"""sqla-queue: a PostgreSQL job queue for applications that already use SQLAlchemy.

with Session(engine) as session, session.begin():
    session.add(order)
    enqueue(session, "emails.send_receipt", {"order_id": order.id})
# both rows commit, or neither; workers are woken by NOTIFY on commit
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sqla_queue.db.database import normalize_url
from sqla_queue.db.models import ArchivedJob, HistoryJob, Job, Queue, QueueBase, Retention
from sqla_queue.enqueue import EnqueuedIds, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from sqla_queue.enqueue.hooks import default_registry, set_default_registry
from sqla_queue.enqueue.inserts.links import Dependency
from sqla_queue.enqueue.results import wait_for, wait_for_async
from sqla_queue.enqueue.signals import signal, signal_async
from sqla_queue.enqueue.workflows import Signature, WorkflowHandle, chain, chord, group, signature
from sqla_queue.errors import (
    AppLoadError,
    ConfigurationError,
    DatabaseUnavailableError,
    DependencyError,
    InvalidJobError,
    JobCancelledError,
    JobFailedError,
    JobLostError,
    JobTimeoutError,
    MigrationBlockedError,
    OlderWorkersError,
    OrphanJobsError,
    ResultMissingError,
    ResultTimeoutError,
    SchemaElsewhereError,
    SchemaMissingError,
    SchemaUnknownError,
    SignalTimeout,
    Sleeping,
    Snooze,
    SqlaQueueError,
    StepResultError,
    Suspended,
    UnknownQueueError,
    UnknownTaskError,
    WaitingForSignal,
)
from sqla_queue.job.context import JobContext
from sqla_queue.job.middleware import Middleware
from sqla_queue.job.new_job import InsertHook, NewJob
from sqla_queue.job.options import JobOptions
from sqla_queue.job.outcome import Outcome, OutcomeKind
from sqla_queue.job.retry import RetryPolicy
from sqla_queue.job.states import JobStatus
from sqla_queue.job.unique import Unique
from sqla_queue.job.validation import limits
from sqla_queue.registry import Registry, Task, load_registry

if TYPE_CHECKING:  # imported on first use (`__getattr__`): an enqueue-only process skips them
    from sqla_queue.worker import Worker, WorkerConfig, WorkerStats

_LAZY = {
    "Worker": "sqla_queue.worker",
    "WorkerConfig": "sqla_queue.worker",
    "WorkerStats": "sqla_queue.worker",
}
"""Exported names whose modules are imported when first asked for: the worker's, which an
enqueue-only process never needs (PEP 562)."""

__version__ = "0.1.0"

__all__ = [
    "AppLoadError",
    "ArchivedJob",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "Dependency",
    "DependencyError",
    "EnqueuedIds",
    "HistoryJob",
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
    "MigrationBlockedError",
    "NewJob",
    "OlderWorkersError",
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
    "SignalTimeout",
    "Signature",
    "Sleeping",
    "Snooze",
    "SqlaQueueError",
    "StepResultError",
    "Suspended",
    "Task",
    "Unique",
    "UnknownQueueError",
    "UnknownTaskError",
    "WaitingForSignal",
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
    "signal",
    "signal_async",
    "signature",
    "wait_for",
    "wait_for_async",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # asked once: later lookups find it as a plain global
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
