"""How one attempt of a job ended (`Outcome`, `OutcomeKind`) and the attempt itself (`JobAttempt`).

`run_job` makes an `Outcome`; each runner turns it into what its source needs: the table
worker's completer into one statement per kind, the broker worker into an ack, a retry, a
snooze or a dead letter. Lifecycle hooks (`on_job_finished`) receive it under both.
"""

from __future__ import annotations

import asyncio
import enum
import traceback
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqla_queue.errors import Sleeping
from sqla_queue.job.context import JobContext

__all__ = ["WRITES_NOTHING", "JobAttempt", "Outcome", "OutcomeKind", "error_text", "storable"]

MAX_ERROR_CHARS = 20_000


class OutcomeKind(str, enum.Enum):
    """How one attempt of a job ended for the worker that ran it."""

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
    attempt refunded; or the handler sleeps (`ctx.sleep`, `Outcome.sleeps`): parked until
    the sleep's end, the attempt refunded."""
    deferred = "deferred"
    """The worker has no handler for the job's task (a newer release's task during a rolling
    deploy): queued again for a worker that has one, its attempt refunded, after a delay."""
    waiting = "waiting"
    """The handler waits for a signal (`ctx.wait_for_signal`): the job was parked in its
    own transaction already (status waiting, no slot, its attempt refunded); nothing is
    written."""


WRITES_NOTHING = frozenset(
    {OutcomeKind.cancelled, OutcomeKind.lost, OutcomeKind.released, OutcomeKind.waiting}
)


class JobAttempt:
    """One attempt of a job, as `run_job` runs it: what it needs, wherever the job came
    from (a claimed row, a broker message). Keyed by (id, attempt)."""

    __slots__ = (
        "args",
        "attempt",
        "ctx",
        "deadline",
        "decode_error",
        "future",
        "gave_up_at",
        "id",
        "key",
        "max_attempts",
        "pending",
        "queue",
        "started",
        "started_at",
        "task",
        "task_handle",
    )

    def __init__(
        self,
        ctx: JobContext,
        args: dict[str, Any],
        max_attempts: int | None = None,
        decode_error: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.id: int = (job_id := ctx.job_id)
        self.task: str = ctx.task
        self.queue: str = ctx.queue
        self.attempt: int = (attempt := ctx.attempt)
        self.args = args
        self.max_attempts = max_attempts
        """The job's own max_attempts (None: its task's, else the default)."""
        self.decode_error = decode_error
        """Why the job's args could not be decoded (it fails without running), or None."""
        self.key = (job_id, attempt)
        self.deadline: float | None = None
        """When the handler times out (`time.monotonic()`), once it started; None: never."""
        self.started = False
        self.started_at: float | None = None
        """When the handler started (`time.monotonic()`): the rollup's run seconds."""
        self.pending: Outcome | None = None
        """The outcome decided when the handler overran its timeout, settled once the
        handler returns: until then the job keeps its slot."""
        self.gave_up_at: float | None = None
        """When the worker gave up on the handler (its deadline, or its cancel seen)."""
        self.future: Future[Any] | None = None
        self.task_handle: asyncio.Task[Any] | None = None
        """An async handler's task on the runner's event loop, once it runs (to cancel it)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id}, task={self.task!r}, attempt={self.attempt})"


@dataclass(slots=True)
class Outcome:
    """One attempt's outcome, from `run_job` (or the timeout watch) to the runner.

    Read-only by convention (not frozen: one is made per job, and frozen ones cost more;
    slotted: made in half the time of one with a `__dict__`)."""

    kind: OutcomeKind
    job: JobAttempt
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
    error_class: str | None = None
    """The class its error history entry names, when not its exception's (or it has none):
    see `sqla_queue.job.history`."""

    @property
    def committed(self) -> bool:
        """Whether the handler's own `ctx.session()` commit finished the job already: the
        completer writes nothing for it."""
        return self.job.ctx.committed

    @property
    def sleeps(self) -> bool:
        """Whether the job is parked by a durable sleep (a snooze raised by `ctx.sleep`):
        written as `waiting` until the sleep's end, not as queued."""
        return self.kind is OutcomeKind.snoozed and isinstance(self.exception, Sleeping)

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
