"""`JobRunner.run_job`: the one place a job's handler is called, whichever runner asks.

The table worker (claimed rows) and the broker worker (NATS or RabbitMQ messages) both hand
a `JobAttempt` to `run_job` on one of their handler threads and get an `Outcome` back; how
that outcome is written (one statement, an ack, a retry, a dead letter) is theirs. Here:
the task's lookup (an unknown task is `deferred`, never failed: a worker that knows it runs
it), the middleware chain (built once per task), sync and async handlers (an awaitable
runs on the runner's event loop while the thread waits), the timeout (the runner's watch
is told the deadline, and a handler that returns past it timed out), `Snooze`,
`keep_result` and its encoding, a `ctx.session()` commit, the retry delay, the failure
log, and the lifecycle hooks (`claimed`, `finished`).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import CancelledError as FutureCancelledError
from typing import TYPE_CHECKING, Any

from sqla_queue.errors import (
    MAX_SNOOZE,
    JobTimeoutError,
    Sleeping,
    Snooze,
    UnknownTaskError,
    WaitingForSignal,
)
from sqla_queue.job.context import JobContext
from sqla_queue.job.counts import JobCounts
from sqla_queue.job.encoding import encode_result
from sqla_queue.job.failures import FailureReporter
from sqla_queue.job.journal import JOURNAL_JOB
from sqla_queue.job.middleware import compose
from sqla_queue.job.options import DEFAULT_MAX_ATTEMPTS
from sqla_queue.job.outcome import JobAttempt, Outcome, OutcomeKind, error_text, storable
from sqla_queue.job.retry import DEFAULT_RETRY

if TYPE_CHECKING:
    from sqla_queue.job.arguments import RowsRefused
    from sqla_queue.job.tasks import TaskLookup, TaskSpec

__all__ = ["MAX_RETRY_DELAY", "JobRunner", "resources_of", "unknown_task_hint"]

log = logging.getLogger("sqla_queue.worker")

MAX_RETRY_DELAY = MAX_SNOOZE.total_seconds()
"""Seconds a retry may be put off at most (10 years, as a snooze): a retry policy's longer,
negative or NaN delay is replaced by the default backoff (the retry could not be stored)."""

ARGS_CLASS = "ArgsNotDecoded"
"""The error history's class for a job whose args could not be decoded (it never ran)."""
MISFIT_CLASS = "ArgsDoNotFit"
"""The error history's class for a job whose args its handler cannot take (it never ran)."""
ROWS_CLASS = "RowsNotLoaded"
"""The error history's class for a job whose row arguments could not be loaded (it never ran)."""
RESULT_CLASS = "ResultNotKept"
"""The error history's class for a job whose handler's result could not be kept."""

_HANDLER_KINDS = frozenset(
    {OutcomeKind.succeeded, OutcomeKind.retried, OutcomeKind.failed, OutcomeKind.snoozed}
)
"""The outcomes a handler's own return or raise decides (a deadline overrides them)."""


class JobRunner:
    """Runs attempts of `registry`'s tasks: `run_job` on the calling (handler) thread.

    `loop` gives the event loop async handlers run on (the caller's thread waits for
    them); `watch_deadline(job, deadline)` is told each timed job's deadline, so the
    runner can give up on the handler at it (None: only the return past it times a job
    out); `worker_id` names the worker in a deferred job's reason."""

    def __init__(
        self,
        registry: TaskLookup,
        loop: Callable[[], asyncio.AbstractEventLoop],
        watch_deadline: Callable[[JobAttempt, float], None] | None = None,
        worker_id: str = "?",
    ) -> None:
        self.registry = registry
        self._loop = loop
        self._watch_deadline = watch_deadline
        self.worker_id = worker_id
        self._chains: dict[str, Callable[[JobContext], Any] | None] = {}
        """Each task's middleware chain, built on first use; None when it has none."""
        self._local = threading.local()
        self._unknown_tasks: set[str] = set()
        """Tasks this runner had no handler for, each logged once."""
        self._unknown_lock = threading.Lock()
        self.reporter = FailureReporter()
        self.counts = JobCounts()
        """The attempts this runner ended, per minute, queue and task, until written."""

    # -- lifecycle hooks ------------------------------------------------------------------

    def claimed(self, ctx: JobContext) -> None:
        """The `on_job_claimed` hooks, for a job this runner is about to run."""
        hooks = self.registry.hooks
        if hooks.job_claimed:
            hooks.emit(hooks.job_claimed, ctx)

    def finished(self, outcome: Outcome) -> None:
        """The `on_job_finished` hooks, once per attempt, before its outcome is visible;
        and the attempt counted in the rollup (`counts`, written by the worker)."""
        began = outcome.job.started_at
        self.counts.record(outcome, None if began is None else time.monotonic() - began)
        hooks = self.registry.hooks
        if hooks.job_finished:
            hooks.emit(hooks.job_finished, outcome.job.ctx, outcome)

    # -- one attempt ----------------------------------------------------------------------

    def run_job(self, job: JobAttempt) -> Outcome:
        """Run one attempt through its middleware and handler; always returns its outcome
        (a handler that returned past its deadline timed out: the clock decides)."""
        try:
            outcome = self._run(job)
            if job.deadline is None:  # no timeout: nothing for the clock to decide
                return outcome
            return self._past_deadline(job, outcome)
        except BaseException as exc:  # a bug in the runner itself must still settle the job
            log.exception("job %s (%s): the worker failed to run it", job.id, job.task)
            return Outcome(OutcomeKind.failed, job, error_text(exc), None, exc)
        finally:
            ctx = job.ctx
            ctx.close_handed()  # its rows' session, if the handler left it open
            journal = ctx.journal
            if journal is not None:
                journal.close()  # the latest progress and the lines, before the outcome

    def _run(self, job: JobAttempt) -> Outcome:
        ctx = job.ctx
        task = self.registry.get(job.task)
        if task is None:  # never spend an attempt on it: a worker that knows it runs it
            return self._unknown_task(job)
        if job.decode_error is not None:
            return Outcome(OutcomeKind.failed, job, job.decode_error, error_class=ARGS_CLASS)
        misfit = task.args_misfit(job.args)
        if misfit is not None:  # enqueued by name or by the CLI: no retry can make it fit
            log.error("job %s (%s) failed without running: %s", job.id, job.task, misfit)
            return Outcome(OutcomeKind.failed, job, misfit, error_class=MISFIT_CLASS)
        args, misfit = task.decode_args(job.args)
        if misfit is not None:  # stored before a deploy changed the handler's types
            log.error("job %s (%s) failed without running: %s", job.id, job.task, misfit)
            return Outcome(OutcomeKind.failed, job, misfit, error_class=MISFIT_CLASS)
        try:
            args, refused = task.load_rows(ctx, args)
        except Exception as exc:  # the database failed the load: retried, as the handler's
            return self.failure(job, task, exc)
        if refused is not None:
            return self._rows_refused(job, task, refused)
        try:
            chain = self._chains[task.name]
        except KeyError:
            chain = self._chains[task.name] = self._build_chain(task)
        if task.timeout is not None:
            deadline = time.monotonic() + task.timeout
            if self._watch_deadline is None:
                job.deadline = deadline
            else:
                self._watch_deadline(job, deadline)
        job.started = True
        job.started_at = time.monotonic()
        try:
            # the log records of this thread are the job's until the handler returns
            sink = ctx.journal_sink
            token = JOURNAL_JOB.set(ctx) if sink is not None and sink.keeps_logs else None
            try:
                if chain is None:  # no middleware: the handler itself, nothing built per job
                    func = task.func
                    result = func(ctx, **args) if task.pass_context else func(**args)
                    if result is not None and inspect.isawaitable(result):
                        result = self._await(result, job)
                else:
                    self._local.job = job  # the chain's innermost call reads it on this thread
                    self._local.args = args
                    result = chain(ctx)
            finally:
                if token is not None:
                    JOURNAL_JOB.reset(token)
        except (FutureCancelledError, asyncio.CancelledError) as exc:
            if ctx.cancelled:  # timed out or given up on
                return self._given_up(job, task, exc)
            return self.failure(job, task, exc)
        except WaitingForSignal as wait:
            return waiting(job, task, wait)
        except Sleeping as sleeping:
            if ctx.committed:  # its own ctx.session() commit finished it: nothing to undo
                return committed(job, task, None, f"it slept ({sleeping.describe()})")
            return snoozed(job, task, sleeping)
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
        if ctx.parked:  # it swallowed WaitingForSignal: the job is parked all the same
            return Outcome(OutcomeKind.waiting, job, "waiting for a signal")
        if ctx.sleeping is not None:  # it swallowed Sleeping: the job sleeps all the same
            return snoozed(job, task, ctx.sleeping)
        if ctx.cancelled:  # its outcome is fenced off: the job is not ours any more
            return self._given_up(job, task, None)
        if result is not None and isinstance(result, Snooze):  # returning it works as raising
            return snoozed(job, task, result)
        if task.keep_result:
            kept, problem = encode_result(task.name, result)
            if problem is not None:  # retrying would not help: the same value comes back
                return Outcome(OutcomeKind.failed, job, problem, error_class=RESULT_CLASS)
            return Outcome(OutcomeKind.succeeded, job, result=kept)
        return Outcome(OutcomeKind.succeeded, job)

    def _rows_refused(self, job: JobAttempt, task: TaskSpec, refused: RowsRefused) -> Outcome:
        """The outcome of a job whose rows were not handed to its handler (its task's row
        policy: `sqla_queue.orm.row_args`); a cancel is written already."""
        if refused.kind == "snoozed":
            return snoozed(job, task, Snooze(refused.seconds, refused.reason))
        if refused.kind == "cancelled":
            log.info("job %s (%s) cancelled without running: %s", job.id, job.task, refused.reason)
            return Outcome(OutcomeKind.cancelled, job, refused.reason)
        log.error("job %s (%s) failed without running: %s", job.id, job.task, refused.reason)
        return Outcome(OutcomeKind.failed, job, refused.reason, error_class=ROWS_CLASS)

    def _past_deadline(self, job: JobAttempt, outcome: Outcome) -> Outcome:
        """A handler that returned after its deadline timed out, even if the runner's watch,
        busy elsewhere, had not yet seen the deadline pass: the clock decides, not the timing."""
        if (
            job.deadline is None
            or job.pending is not None  # decided at the deadline already
            or outcome.kind not in _HANDLER_KINDS
            or outcome.committed  # its own ctx.session() commit finished it in time
            or time.monotonic() < job.deadline
        ):
            return outcome
        return self.failure(job, self.registry[job.task], self._timeout_error(job))

    def _given_up(self, job: JobAttempt, task: TaskSpec, exc: BaseException | None) -> Outcome:
        """The outcome of a handler the runner gave up on: a timeout not decided at the
        deadline (no watch held one) is decided now, by the retry rules; else cancelled or
        lost, which write nothing."""
        if job.ctx.lost_reason == "timed out" and job.pending is None:
            return self.failure(job, task, self._timeout_error(job))
        return Outcome(lost_kind(job.ctx), job, "", None, exc)

    def _unknown_task(self, job: JobAttempt) -> Outcome:
        """The outcome of a job whose task this runner has no handler for: deferred (put
        back, its attempt refunded) for a worker that has one; logged once per task name."""
        with self._unknown_lock:
            first = job.task not in self._unknown_tasks
            self._unknown_tasks.add(job.task)
        if first:
            log.error(
                "%s; its jobs are put back for a worker that has the task, without using "
                "their attempts, each later and later; deploy a worker with the task, or "
                "delete its jobs (`sqla-queue doctor` counts them)",
                UnknownTaskError(
                    task=job.task,
                    registry="this worker's registry",
                    hint=unknown_task_hint(job.task, self.registry),
                ),
            )
        return Outcome(
            OutcomeKind.deferred,
            job,
            f"unknown task {job.task!r} on worker {self.worker_id} (no handler in its "
            "registry); left for a worker that knows the task",
        )

    def _build_chain(self, task: TaskSpec) -> Callable[[JobContext], Any] | None:
        middleware = [*self.registry.middleware, *task.middleware]
        if not middleware:
            return None
        func = task.func
        pass_context = task.pass_context

        def call_handler(ctx: JobContext) -> Any:
            job: JobAttempt = self._local.job
            args = self._local.args
            result = func(ctx, **args) if pass_context else func(**args)
            if result is not None and inspect.isawaitable(result):
                return self._await(result, job)
            return result

        return compose(middleware, call_handler)

    # -- async handlers, timeouts and cancels ---------------------------------------------

    def _await(self, awaitable: Awaitable[Any], job: JobAttempt) -> Any:
        """Run an awaitable on the event loop; this thread waits for it. A timeout or a
        cancel cancels its task (`give_up`), and this thread still waits until the task has
        ended: a coroutine that swallows the CancelledError keeps its slots."""
        future = asyncio.run_coroutine_threadsafe(_as_task(awaitable, job), self._loop())
        job.future = future
        return future.result()

    def give_up(self, job: JobAttempt, reason: str, loop: asyncio.AbstractEventLoop | None) -> None:
        """Tell a job's handler it is timed out or cancelled (`ctx.cancelled`); an async
        handler's task on `loop` is cancelled at its next await."""
        job.ctx.mark_lost(reason)
        task = job.task_handle
        if task is not None and loop is not None:  # else `_as_task` sees the mark itself
            loop.call_soon_threadsafe(task.cancel)

    def timed_out(self, job: JobAttempt) -> Outcome:
        """The outcome of a job past its deadline, decided then (not logged: the runner
        reports it once it holds it, `reporter.report`)."""
        return self.failure(job, self.registry[job.task], self._timeout_error(job), report=False)

    def _timeout_error(self, job: JobAttempt) -> JobTimeoutError:
        task = self.registry[job.task]
        return JobTimeoutError(job_id=job.id, task=job.task, timeout=task.timeout)

    # -- outcomes -------------------------------------------------------------------------

    def failure(
        self, job: JobAttempt, task: TaskSpec, exc: BaseException, report: bool = True
    ) -> Outcome:
        """The outcome of an attempt that raised: retried, or failed on its last attempt
        (logged unless not `report`)."""
        kind = OutcomeKind.timed_out if isinstance(exc, JobTimeoutError) else OutcomeKind.retried
        error = error_text(exc)
        max_attempts = max_attempts_of(job.max_attempts, task)
        if job.attempt >= max_attempts:
            if kind is OutcomeKind.retried:
                kind = OutcomeKind.failed
            outcome = Outcome(kind, job, error, None, exc)
        else:
            outcome = Outcome(kind, job, error, retry_delay(job, task), exc)
        if report:
            self.reporter.report(outcome, max_attempts)
        return outcome


def unknown_task_hint(task: str, registry: TaskLookup) -> str:
    """What a worker that has no handler for `task` suggests: the closest task it knows,
    and the module to import with `Registry(include=[...])` (a task's default name is
    `module.function`)."""
    close = difflib.get_close_matches(task, list(registry), n=1, cutoff=0.6)
    known = f"did you mean {close[0]!r}? " if close else ""
    module = task.rpartition(".")[0] or "module.that.registers.it"
    return (
        f"{known}if the task is registered in a module the worker does not import, "
        f"import it there: Registry(include=[{module!r}])"
    )


def retry_delay(job: JobAttempt, task: TaskSpec) -> float:
    """Seconds until the next attempt by the task's retry policy (the default backoff when
    the policy raises or gives a delay PostgreSQL or a broker could not hold)."""
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


def committed(job: JobAttempt, task: TaskSpec, result: Any, problem: str | None = None) -> Outcome:
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
    return Outcome(
        OutcomeKind.failed, job, storable(error), result_pending=True, error_class=RESULT_CLASS
    )


def snoozed(job: JobAttempt, task: TaskSpec, snooze: Snooze | Sleeping) -> Outcome:
    """The outcome of a snoozed attempt: queued again after its delay, attempt refunded.
    A `Sleeping` (`ctx.sleep`) is written as a park instead (`Outcome.sleeps`: status
    `waiting` until the sleep's end, its attempt refunded)."""
    log.info("job %s (%s) %s", job.id, job.task, snooze.describe())
    return Outcome(
        OutcomeKind.snoozed,
        job,
        snooze.describe(),
        snooze.seconds,
        snooze,
        task_max_attempts=task.max_attempts,
    )


def waiting(job: JobAttempt, task: TaskSpec, wait: WaitingForSignal) -> Outcome:
    """The outcome of a run that waits for a signal: parked already (writes nothing), or,
    when a sender's open transaction kept it from parking, put back to run again soon, as
    a snooze is (its attempt refunded)."""
    if wait.retry_in is None:
        return Outcome(OutcomeKind.waiting, job, wait.describe())
    return Outcome(
        OutcomeKind.snoozed,
        job,
        wait.describe(),
        wait.retry_in,
        wait,
        task_max_attempts=task.max_attempts,
    )


def lost_kind(ctx: JobContext) -> OutcomeKind:
    """The outcome kind of a job given up on, by why (`ctx.lost_reason`)."""
    if ctx.lost_reason == "cancelled":
        return OutcomeKind.cancelled
    if ctx.lost_reason == "timed out":
        return OutcomeKind.timed_out
    return OutcomeKind.lost


def max_attempts_of(own: int | None, task: TaskSpec | None) -> int:
    """A job's attempt budget: its `own`, else its task's, else the default."""
    return own or (task.max_attempts if task else None) or DEFAULT_MAX_ATTEMPTS


async def _as_task(awaitable: Awaitable[Any], job: JobAttempt) -> Any:
    """An async handler as a task `give_up` can cancel (the handle is set before the
    check, `give_up` marks before it reads the handle: one of the two sees the other)."""
    job.task_handle = asyncio.current_task()
    sink = job.ctx.journal_sink
    if sink is not None and sink.keeps_logs:
        JOURNAL_JOB.set(job.ctx)  # the task's own context: its log lines are the job's
    if job.ctx.cancelled:  # timed out or cancelled while it was being scheduled
        raise asyncio.CancelledError
    return await awaitable


def resources_of(registry: TaskLookup, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The resources handed to jobs: the registry's, overridden by the worker config's."""
    return {**registry.resources, **extra}
