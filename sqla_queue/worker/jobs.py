"""The typed values the worker's parts hand each other: a `ClaimedJob` and its `Outcome`."""

from __future__ import annotations

import asyncio
import enum
import json
import time
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqla_queue.registry import JobContext

MAX_ERROR_CHARS = 20_000


class OutcomeKind(str, enum.Enum):
    """How one claimed job ended for this worker."""

    succeeded = "succeeded"
    """The handler returned: the job is finished by its queue's retention."""
    retried = "retried"
    """The handler raised: the job is queued again after its retry delay."""
    failed = "failed"
    """The handler raised on its last attempt (or could not run at all): failed for good."""
    timed_out = "timed out"
    """The handler overran its task's timeout: retried or failed by the same rules."""
    cancelled = "cancelled"
    """The job was cancelled while this worker held it; nothing is written."""
    lost = "lost"
    """The job was no longer this worker's (reaped elsewhere); nothing is written."""
    released = "released"
    """The worker stopped: the job went back to the queue."""
    snoozed = "snoozed"
    """The handler or a middleware raised `Snooze`: queued again after its delay, the
    attempt refunded."""
    deferred = "deferred"
    """The worker has no handler for the job's task (a newer release's task during a rolling
    deploy): queued again for a worker that has one, its attempt refunded, after a delay
    that doubles with each deferral."""


WRITES_NOTHING = frozenset({OutcomeKind.cancelled, OutcomeKind.lost, OutcomeKind.released})


@dataclass
class Outcome:
    """One job's outcome, from the executor (or the timeout watch) to the completer.

    Read-only by convention (not frozen: one is made per job, and frozen ones cost more)."""

    kind: OutcomeKind
    job: ClaimedJob
    error: str = ""
    """The traceback (or reason) written to the job's last_error."""
    retry_in: float | None = None
    """Seconds until the next attempt, or None when this attempt is the last."""
    exception: BaseException | None = None
    task_max_attempts: int | None = None
    """A snoozed job's task's own max_attempts (its budget when the job has none)."""
    result: str | None = None
    """A succeeded job's return value as JSON text, when its task keeps results."""
    result_pending: bool = False
    """The handler's `ctx.session()` commit finished the job with its result pending (its
    task keeps results): the completer stores `result`, or fails the job with `error`."""

    @property
    def committed(self) -> bool:
        """Whether the handler's own `ctx.session()` commit finished the job already: the
        completer writes nothing for it."""
        return self.job.ctx.committed

    @property
    def requeues(self) -> bool:
        """Whether the job is queued again (a retry, after an error or a timeout)."""
        return self.retry_in is not None and self.kind in (
            OutcomeKind.retried,
            OutcomeKind.timed_out,
        )


def error_text(exc: BaseException) -> str:
    """The traceback of `exc`, shortened, and storable: PostgreSQL text holds neither NUL
    nor a lone surrogate, so they are escaped."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return storable(text[-MAX_ERROR_CHARS:])


def storable(text: str) -> str:
    """`text` with NUL characters and lone surrogates escaped, so PostgreSQL accepts it."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def decode_args(args_json: str) -> tuple[dict[str, Any], str | None]:
    """A claimed row's args, decoded from its JSON text: (args, None), or ({}, why not)."""
    try:
        args = json.loads(args_json)
    except (RecursionError, ValueError) as exc:
        return {}, f"args cannot be decoded ({type(exc).__name__}: {exc})"[:500]
    if not isinstance(args, dict):
        return {}, f"args must be a JSON object, got {type(args).__name__}"
    return args, None


class ClaimColumns:
    """Where each column is in the claim's rows (plain tuples), found once per claim."""

    __slots__ = (
        "args_json",
        "attempts",
        "id",
        "key",
        "max_attempts",
        "meta_json",
        "queue",
        "status",
        "tags",
        "task",
    )

    def __init__(self, keys: list[str]) -> None:
        self.args_json: int = keys.index("args_json")
        self.attempts: int = keys.index("attempts")
        self.id: int = keys.index("id")
        self.max_attempts: int = keys.index("max_attempts")
        self.meta_json: int = keys.index("meta_json")
        self.queue: int = keys.index("queue")
        self.status: int = keys.index("status")
        self.tags: int = keys.index("tags")
        self.task: int = keys.index("task")


class ClaimedJob:
    """A job this worker has claimed and not yet finished. Keyed by (id, attempt): a job
    re-claimed by the same worker after a reap is a different `ClaimedJob`."""

    __slots__ = (
        "_token",
        "args",
        "attempt",
        "claimed_at",
        "ctx",
        "deadline",
        "decode_error",
        "future",
        "gave_up_at",
        "id",
        "key",
        "max_attempts",
        "next_report",
        "pending",
        "queue",
        "reported_started",
        "started",
        "task",
        "task_handle",
    )

    def __init__(
        self,
        row: Sequence[Any],
        columns: ClaimColumns,
        resources: Mapping[str, Any],
        heartbeat: Any = None,
        session_factory: Any = None,
    ) -> None:
        self.id: int = row[columns.id]
        self.task: str = row[columns.task]
        self.attempt: int = row[columns.attempts]
        self.max_attempts: int | None = row[columns.max_attempts]
        self.queue: str = row[columns.queue]
        # Decoded here, one job at a time: a row that cannot be decoded fails alone.
        self.args, self.decode_error = decode_args(row[columns.args_json])
        self.ctx = JobContext(
            self.id,
            self.task,
            self.queue,
            self.attempt,
            heartbeat,
            resources,
            tags=row[columns.tags],
            meta=row[columns.meta_json],
            session_factory=session_factory,
        )
        self.key = (self.id, self.attempt)
        """(id, attempt): how the board holds it."""
        self.claimed_at = time.monotonic()
        self.deadline: float | None = None
        self.started = False
        self.reported_started = False
        self._token = [True]
        self.future: Future[Any] | None = None
        self.task_handle: asyncio.Task[Any] | None = None
        """An async handler's task on the worker's loop, once it runs (to cancel it)."""
        self.pending: Outcome | None = None
        """The outcome decided when the handler overran its timeout, written once the
        handler returns: until then the job stays running and keeps its slots."""
        self.gave_up_at: float | None = None
        """When the worker gave up on the handler (its deadline, or its cancel seen)."""
        self.next_report = 0.0
        """When the keeper reports the overrunning handler next (0: not reported yet)."""

    def take(self) -> bool:
        """Become the one who settles this job: True once, for the first caller only (the
        handler thread, the timeout watch, or shutdown)."""
        try:
            self._token.pop()  # atomic: only one caller can take the one element
        except IndexError:
            return False
        return True

    @property
    def settled(self) -> bool:
        """Whether someone has taken the job to settle it."""
        return not self._token

    def __repr__(self) -> str:
        return f"ClaimedJob(id={self.id}, task={self.task!r}, attempt={self.attempt})"
