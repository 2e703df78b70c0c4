"""The executor: the one place a job's handler is called, inside its middleware.

Handler threads (`serve`) take claimed jobs from the board, run each through `execute`,
and settle it with the `Outcome`. Sync and async handlers take the same path: the
middleware chain runs on the handler thread; a handler's awaitable result (an `async def`
handler, or a sync decorator around one) is run on the worker's event loop while the
thread waits for it. Timeouts are watched by the producer (`time_out`), which decides the
job's outcome, tells its context, and cancels an async handler's task; the outcome is
written only once the handler has returned (a sync handler cannot be interrupted): until
then the job stays running and keeps its slot of the worker and of its queue's limit.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import CancelledError as FutureCancelledError
from typing import Any

from sqlalchemy import Engine

from sqla_queue import queries
from sqla_queue.errors import MAX_SNOOZE, JobTimeoutError, Snooze, TaskNotFoundError
from sqla_queue.middleware import compose
from sqla_queue.models import DEFAULT_MAX_ATTEMPTS, JobStatus
from sqla_queue.queries.jobs import UNKNOWN_TASK_MAX_DELAY
from sqla_queue.registry import JobContext, Registry, Task
from sqla_queue.results import encode_result
from sqla_queue.retry import DEFAULT_RETRY

from .board import JobBoard
from .jobs import ClaimedJob, Outcome, OutcomeKind, error_text, storable
from .stormlog import FailureReporter

log = logging.getLogger("sqla_queue.worker")

MAX_RETRY_DELAY = MAX_SNOOZE.total_seconds()
"""Seconds a retry may be put off at most (10 years, as a snooze): a retry policy's longer,
negative or NaN delay is replaced by the default backoff (the retry could not be stored)."""

RECHECK_AFTER = 1.0
"""Seconds a claimed job may wait locally before the executor checks it is still ours."""


class Executor:
    """Runs jobs: builds each task's middleware chain once, calls handlers, makes outcomes."""

    def __init__(
        self,
        registry: Registry,
        board: JobBoard,
        engine: Engine,
        on_finished: Callable[[Outcome], None],
        worker_id: str = "?",
    ) -> None:
        self.registry = registry
        self.worker_id = worker_id
        self._unknown_tasks: set[str] = set()
        """Tasks this worker had no handler for, each logged once."""
        self._unknown_lock = threading.Lock()
        self.board = board
        self.engine = engine
        self._on_finished = on_finished
        self._chains: dict[str, Callable[[JobContext], Any] | None] = {}
        """Each task's middleware chain, built on first use; None when it has none."""
        self._local = threading.local()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self.loop_seen = time.monotonic()
        """When the event loop last ran a probe (the keeper's check for a blocked loop)."""
        self._probe_sent = 0.0
        self.reporter = FailureReporter()

    # -- handler threads ----------------------------------------------------------------------

    def start_thread(self) -> None:
        threading.Thread(target=self.serve, name="sqla-queue-job", daemon=True).start()

    def serve(self) -> None:
        """A handler thread: run ready jobs while there is room, one lock round per job."""
        job: ClaimedJob | None = None
        outcome: Outcome | None = None
        owned = False
        while True:
            job = self.board.next_job(job, outcome, owned)
            if job is None:
                return
            # a handler that overran its timeout ends with the outcome decided then
            outcome = self._past_deadline(job, self.execute(job))
            if job.deadline is None:  # nothing held for it (`hold_overrun` needs a deadline)
                outcome = outcome if job.take() else None
            else:
                outcome = self.board.returned(job, outcome)
            owned = outcome is not None
            if outcome is not None:  # before the outcome is visible: hooks run first
                self._on_finished(outcome)

    def _past_deadline(self, job: ClaimedJob, outcome: Outcome) -> Outcome:
        """A handler that returned after its deadline timed out, even if the producer, busy
        elsewhere, had not yet seen the deadline pass: the clock decides, not the timing."""
        if (
            job.deadline is None
            or job.pending is not None  # decided at the deadline already
            or outcome.kind not in _HANDLER_KINDS
            or outcome.committed  # its own ctx.session() commit finished it in time
            or time.monotonic() < job.deadline
        ):
            return outcome
        task = self.registry[job.task]
        error = JobTimeoutError(job_id=job.id, task=job.task, timeout=task.timeout)
        return self.failure(job, task, error)

    def execute(self, job: ClaimedJob) -> Outcome:
        """Run one job through its middleware and handler; always returns its outcome."""
        try:
            return self._execute(job)
        except BaseException as exc:  # a bug in the worker itself must still settle the job
            log.exception("job %s (%s): the worker failed to run it", job.id, job.task)
            return Outcome(OutcomeKind.failed, job, error_text(exc), None, exc)

    def _execute(self, job: ClaimedJob) -> Outcome:
        ctx = job.ctx
        if ctx.cancelled or time.monotonic() - job.claimed_at >= RECHECK_AFTER:
            skipped = self._skip_reason(job)
            if skipped is not None:
                return Outcome(skipped, job, f"job was {skipped.value} before it started")
        task = self.registry.get(job.task)
        if task is None:  # never spend an attempt on it: a worker that knows it runs it
            return self._unknown_task(job)
        if job.decode_error is not None:
            return Outcome(OutcomeKind.failed, job, job.decode_error)
        try:
            chain = self._chains[task.name]
        except KeyError:
            chain = self._chains[task.name] = self._build_chain(task)
        if task.timeout is not None:
            self.board.watch_deadline(job, time.monotonic() + task.timeout)
        job.started = True
        try:
            if chain is None:  # no middleware: the handler itself, nothing built per job
                func = task.func
                result = func(ctx, **job.args) if task.pass_context else func(**job.args)
                if result is not None and inspect.isawaitable(result):
                    result = self._await(result, job)
            else:
                self._local.job = job  # the innermost call of the chain reads it on this thread
                result = chain(ctx)
        except (FutureCancelledError, asyncio.CancelledError) as exc:
            if ctx.cancelled:  # timed out or given up on: the producer has settled it
                return Outcome(_lost_kind(ctx), job, "", None, exc)
            return self.failure(job, task, exc)
        except Snooze as snooze:
            if ctx.committed:  # its own ctx.session() commit finished it: nothing to undo
                return committed(job, task, None, f"it snoozed ({snooze.describe()})")
            return snoozed(job, task, snooze)
        except BaseException as exc:
            if ctx.committed:
                log.warning("job %s (%s) raised after its session committed it", job.id, job.task)
                return committed(job, task, None, f"it raised:\n{error_text(exc)}")
            return self.failure(job, task, exc)
        if ctx.committed:  # finished by the handler's own commit: written already
            return committed(job, task, result)
        if ctx.cancelled:  # its outcome is fenced off: the job is not ours any more
            return Outcome(_lost_kind(ctx), job)
        if result is not None and isinstance(result, Snooze):  # returning it works as raising
            return snoozed(job, task, result)
        if task.keep_result:
            kept, problem = encode_result(task.name, result)
            if problem is not None:  # retrying would not help: the same value comes back
                return Outcome(OutcomeKind.failed, job, problem)
            return Outcome(OutcomeKind.succeeded, job, result=kept)
        return Outcome(OutcomeKind.succeeded, job)

    def _unknown_task(self, job: ClaimedJob) -> Outcome:
        """The outcome of a job whose task this worker has no handler for: deferred (put
        back, its attempt refunded) for a worker that has one; logged once per task name."""
        with self._unknown_lock:
            first = job.task not in self._unknown_tasks
            self._unknown_tasks.add(job.task)
        if first:
            log.error(
                "%s; its jobs are put back for a worker that has the task, without using "
                "their attempts, each later and later (up to every %g s); deploy a worker "
                "with the task, or delete its jobs (`sqla-queue doctor` counts them)",
                TaskNotFoundError(task=job.task),
                UNKNOWN_TASK_MAX_DELAY,
            )
        return Outcome(
            OutcomeKind.deferred,
            job,
            f"unknown task {job.task!r} on worker {self.worker_id} (no handler in its "
            "registry); left for a worker that knows the task",
        )

    def _skip_reason(self, job: ClaimedJob) -> OutcomeKind | None:
        """Whether a job must not start: cancelled or lost while it waited here (called for a
        job already cancelled, or one that waited `RECHECK_AFTER` seconds)."""
        if not job.ctx.cancelled:
            self._recheck(job)
        return _lost_kind(job.ctx) if job.ctx.cancelled else None

    def _recheck(self, job: ClaimedJob) -> None:
        """A job that waited locally: is it still ours? (A cancel may have come meanwhile.)"""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(queries.job_status(), {"job_id": job.id}).mappings().first()
        except Exception as exc:  # unknown: run it; the finishing statement is fenced
            log.debug("could not re-check job %s before it started: %s", job.id, exc)
            return
        if row is None or row["status"] != JobStatus.running.value:
            job.ctx.mark_lost("cancelled" if row and row["status"] == "cancelled" else "lost")
        elif row["attempts"] != job.attempt:
            job.ctx.mark_lost("lost")

    def _build_chain(self, task: Task) -> Callable[[JobContext], Any] | None:
        middleware = [*self.registry.middleware, *task.middleware]
        if not middleware:
            return None
        func = task.func
        pass_context = task.pass_context

        def call_handler(ctx: JobContext) -> Any:
            job: ClaimedJob = self._local.job
            result = func(ctx, **job.args) if pass_context else func(**job.args)
            if result is not None and inspect.isawaitable(result):
                return self._await(result, job)
            return result

        return compose(middleware, call_handler)

    # -- async handlers -----------------------------------------------------------------------

    def _await(self, awaitable: Awaitable[Any], job: ClaimedJob) -> Any:
        """Run an awaitable on the event loop; this thread waits for it to end. A timeout or
        a cancel cancels its task (`give_up`), and this thread still waits until the task
        has ended: a coroutine that swallows the CancelledError keeps its slots."""
        loop = self.loop()
        future = asyncio.run_coroutine_threadsafe(_as_task(awaitable, job), loop)
        job.future = future
        return future.result()

    def give_up(self, job: ClaimedJob, reason: str) -> None:
        """Tell a job's handler it is timed out or cancelled (`ctx.cancelled`); an async
        handler's task is cancelled at its next await."""
        job.ctx.mark_lost(reason)
        task, loop = job.task_handle, self._loop
        if task is not None and loop is not None:  # else `_as_task` sees the mark itself
            loop.call_soon_threadsafe(task.cancel)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The worker's event loop, started on first use by an async handler."""
        with self._loop_lock:
            if self._loop is None:
                self.loop_seen = time.monotonic()
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(
                    target=self._loop.run_forever, name="sqla-queue-async", daemon=True
                )
                self._loop_thread.start()
            return self._loop

    @property
    def has_loop(self) -> bool:
        return self._loop is not None

    def probe_loop(self) -> float | None:
        """How long the event loop has left a probe unrun (None without a loop, 0 when it
        ran the last one); sends a new probe once the last one has run."""
        loop = self._loop
        if loop is None:
            return None
        lag = self.loop_lag()
        if not lag:
            self._probe_sent = time.monotonic()
            loop.call_soon_threadsafe(self._loop_alive)
        return lag

    def loop_lag(self) -> float:
        """Seconds the last probe has waited for the event loop (0 once it ran)."""
        if self._loop is None or self._probe_sent <= self.loop_seen:
            return 0.0
        return time.monotonic() - self._probe_sent

    def _loop_alive(self) -> None:
        self.loop_seen = time.monotonic()

    def stop_loop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        # Abandoned async handlers get a CancelledError to clean up, not a silent drop.
        cancelled = asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), loop)
        try:
            cancelled.result(2)
        except Exception:
            log.warning("async handlers did not finish cancelling within 2 s")
        loop.call_soon_threadsafe(loop.stop)
        if self._loop_thread is not None:
            self._loop_thread.join(2)

    # -- outcomes -----------------------------------------------------------------------------

    def failure(
        self, job: ClaimedJob, task: Task, exc: BaseException, report: bool = True
    ) -> Outcome:
        """The outcome of an attempt that raised: retried, or failed on its last attempt
        (logged unless not `report`)."""
        kind = OutcomeKind.timed_out if isinstance(exc, JobTimeoutError) else OutcomeKind.retried
        error = error_text(exc)
        max_attempts = _max_attempts(job, task)
        if job.attempt >= max_attempts:
            if kind is OutcomeKind.retried:
                kind = OutcomeKind.failed
            outcome = Outcome(kind, job, error, None, exc)
        else:
            outcome = Outcome(kind, job, error, self._retry_delay(job, task), exc)
        if report:
            self.reporter.report(outcome, max_attempts)
        return outcome

    def _retry_delay(self, job: ClaimedJob, task: Task) -> float:
        try:
            delay = float(task.retry.delay(job.attempt))
        except Exception:  # a broken RetryPolicy must not wedge the job: use the default
            log.exception("the retry policy of %s raised; using the default backoff", task.name)
            return DEFAULT_RETRY.delay(job.attempt)
        if not 0 <= delay <= MAX_RETRY_DELAY:  # NaN too: PostgreSQL could not store it
            log.error(
                "the retry policy of %s gave a delay of %r s (not between 0 and %g); "
                "using the default backoff",
                task.name,
                delay,
                MAX_RETRY_DELAY,
            )
            return DEFAULT_RETRY.delay(job.attempt)
        return delay

    def time_out(self, job: ClaimedJob, deadline: float) -> None:
        """Called by the producer for a job past its deadline: its outcome is decided and
        held until the handler returns (`JobBoard.hold_overrun`), the handler told."""
        if job.ctx.committed:  # its own ctx.session() commit finished it in time
            return
        task = self.registry[job.task]
        error = JobTimeoutError(job_id=job.id, task=job.task, timeout=task.timeout)
        outcome = self.failure(job, task, error, report=False)
        if not self.board.hold_overrun(job, outcome):  # it returned meanwhile
            return
        job.gave_up_at = deadline
        log.warning(
            "job %s (%s) timed out after %ss; it keeps its slot until its handler returns",
            job.id,
            job.task,
            task.timeout,
        )
        self.reporter.report(outcome, _max_attempts(job, task))
        self.give_up(job, "timed out")


def committed(job: ClaimedJob, task: Task, result: Any, problem: str | None = None) -> Outcome:
    """The outcome of a job its handler's `ctx.session()` committed: nothing to write, or,
    when its task keeps results, the result to store in place of the pending one (or why
    there is none: `problem`, else what `encode_result` found)."""
    if not task.keep_result:
        return Outcome(OutcomeKind.succeeded, job)
    if problem is None:
        kept, problem = encode_result(task.name, result)
        if problem is None:
            return Outcome(OutcomeKind.succeeded, job, result=kept, result_pending=True)
    error = f"its session committed the job, but no result can be kept: {problem}"
    return Outcome(OutcomeKind.failed, job, storable(error), result_pending=True)


_HANDLER_KINDS = frozenset(
    {OutcomeKind.succeeded, OutcomeKind.retried, OutcomeKind.failed, OutcomeKind.snoozed}
)
"""The outcomes a handler's own return or raise decides (a deadline overrides them)."""


def snoozed(job: ClaimedJob, task: Task, snooze: Snooze) -> Outcome:
    """The outcome of a snoozed attempt: queued again after its delay, attempt refunded."""
    log.info("job %s (%s) %s", job.id, job.task, snooze.describe())
    return Outcome(
        OutcomeKind.snoozed,
        job,
        snooze.describe(),
        snooze.seconds,
        snooze,
        task_max_attempts=task.max_attempts,
    )


def _lost_kind(ctx: JobContext) -> OutcomeKind:
    if ctx.lost_reason == "cancelled":
        return OutcomeKind.cancelled
    if ctx.lost_reason == "timed out":
        return OutcomeKind.timed_out
    return OutcomeKind.lost


def _max_attempts(job: ClaimedJob, task: Task) -> int:
    return job.max_attempts or task.max_attempts or DEFAULT_MAX_ATTEMPTS


async def _as_task(awaitable: Awaitable[Any], job: ClaimedJob) -> Any:
    """An async handler as a task `give_up` can cancel (the handle is set before the
    check, `give_up` marks before it reads the handle: one of the two sees the other)."""
    job.task_handle = asyncio.current_task()
    if job.ctx.cancelled:  # timed out or cancelled while it was being scheduled
        raise asyncio.CancelledError
    return await awaitable


async def _cancel_other_tasks() -> None:
    """Cancel every task on the running loop but this one, and wait for them to end."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def resources_of(registry: Registry, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The resources handed to jobs: the registry's, overridden by the worker config's."""
    return {**registry.resources, **extra}
