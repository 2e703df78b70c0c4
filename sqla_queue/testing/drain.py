"""Run due jobs in the calling thread, with the worker's own claim and finish statements.

`drain` is for tests: it claims one job at a time (priority order), runs it here through
the job core's `JobRunner.run_job` (as the worker does), and writes the outcome with the
same fenced statements the worker uses. Given a `Session` or a `Connection` in a
transaction, it works inside that transaction, so a test that rolls back leaves nothing
behind. `run_until_empty` runs a real burst-mode `Worker` instead.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.orm import Session

from sqla_queue.db import queries
from sqla_queue.db.models import Job
from sqla_queue.db.queries import signals as signal_queries
from sqla_queue.db.queries import steps as step_queries
from sqla_queue.enqueue.results import read_parent_results
from sqla_queue.enqueue.signals import engine_transaction, receive_signal
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.context import JobContext
from sqla_queue.job.history import error_entry
from sqla_queue.job.outcome import WRITES_NOTHING, JobAttempt, Outcome, OutcomeKind, storable
from sqla_queue.job.run import JobRunner, resources_of
from sqla_queue.registry import Registry
from sqla_queue.worker import Worker, WorkerConfig, WorkerStats
from sqla_queue.worker.jobs import decode_args
from sqla_queue.worker.steps import ExecuteJournal
from sqla_queue.worker.transactional import job_session

DRAIN_WORKER_ID = "sqla_queue.testing.drain"
"""The `locked_by` of jobs claimed by `drain`."""
_JOBS: Table = Job.__table__  # type: ignore[assignment]
_RAISED = frozenset({OutcomeKind.retried, OutcomeKind.failed, OutcomeKind.timed_out})
"""The outcomes of a handler that raised (or overran its timeout): `reraise` raises them."""


@dataclass
class DrainResult:
    """How many jobs `drain` ran, by outcome. `errors` holds (job id, traceback) per failure.

    Compare with counts only: `assert drain(...) == DrainResult(succeeded=2)`.
    """

    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    snoozed: int = 0
    deferred: int = 0
    """Jobs of a task `registry` does not know, put back as a worker puts them back."""
    waiting: int = 0
    """Runs that ended parked by `ctx.wait_for_signal` (the job waits for its signal)."""
    errors: list[tuple[int, str]] = field(default_factory=list, compare=False)

    @property
    def ran(self) -> int:
        """Jobs claimed and settled, whatever their outcome (snoozed and deferred included)."""
        return (
            self.succeeded
            + self.retried
            + self.failed
            + self.snoozed
            + self.deferred
            + self.waiting
        )


def drain(
    target: Session | Connection | Engine,
    registry: Registry,
    *,
    queue: str | Sequence[str] | None = None,
    max_jobs: int | None = None,
    include_scheduled: bool = False,
    reraise: bool = False,
    into: DrainResult | None = None,
) -> DrainResult:
    """Run due jobs one at a time in this thread until none is due; return counts per outcome.

    `target`: a `Session` (flushed first; its transaction is used and not committed), a
    `Connection` (its transaction, if one is open; else each statement commits), or an
    `Engine` (an autocommit connection, like the worker's). `queue` limits it to one queue
    or a list; `max_jobs` stops after that many. `include_scheduled` also runs jobs whose
    `run_at` is in the future, retries waiting on their backoff included, by making them
    due first. `reraise` raises a handler's exception once its outcome is written. `into`
    adds the counts to an existing result (which is up to date when an error is raised).

    Each job runs through the job core's `JobRunner.run_job`, as under the worker:
    middleware, the task's timeout (a sync handler returning past it timed out too),
    `Snooze`, `keep_result` and the lifecycle hooks (`on_job_claimed`, `on_job_finished`).
    A handler that fails is retried by its policy (later: see `include_scheduled`) or
    failed once out of attempts; a job of a task `registry` does not know is put back
    for a worker that knows it, its attempt refunded (`deferred`; `include_scheduled`
    does not run it again in the same call). A job that raises `Snooze` is queued again
    after its delay without spending an attempt (with `include_scheduled`, a job that
    always snoozes runs until `max_jobs`). A handler's `BaseException` (`pytest.fail`,
    `KeyboardInterrupt`) is written as a failed attempt too, then always raised. Jobs a
    handler enqueues and commits are run in the same call. Durable steps (`ctx.step`) and
    sleeps are recorded in the same transaction as the claims; a `session=True` step is
    refused (it needs a worker: `run_until_empty`); a sleeping job is parked until its
    end (status `waiting`; `include_scheduled` does not wake it early), and each round
    queues those whose end has come. A handler's
    `ctx.wait_for_signal()` parks its job as under the worker (counted in `waiting`); each
    round first queues the parked jobs whose signal came or whose deadline passed, as a
    worker's keeper does, so a signal sent between two calls is seen by the next. Given an
    Engine, a handler's `ctx.session()` works as under the worker, and so do ORM row
    arguments (loaded in it); given a Session or a Connection (the test's transaction,
    which another session cannot see), a job taking a row fails, saying so in one line.
    """
    if not isinstance(target, Session | Connection | Engine):
        raise ConfigurationError(
            detail=f"drain needs a Session, Connection or Engine, got {type(target).__name__}; "
            "for an AsyncSession call `await session.run_sync(lambda s: drain(s, registry))`"
        )
    if max_jobs is not None and max_jobs < 0:
        raise ConfigurationError(detail=f"max_jobs must not be negative, got {max_jobs}")
    registry.load_included()  # the tasks its `include` modules register, as a worker loads them
    queue_names = [queue] if isinstance(queue, str) else None if queue is None else list(queue)
    result = DrainResult() if into is None else into
    ran = result.ran
    claim = queries.claim_jobs(queue_names)
    params: dict[str, Any] = {"worker_id": DRAIN_WORKER_ID, "limit": 1}
    if queue_names is not None:
        params["queues"] = queue_names
    runner = _DrainRunner(registry, target if isinstance(target, Engine) else None)
    deferred: list[int] = []  # not made due again in this call: no worker here has their task
    try:
        with _connection_for(target) as run:
            while max_jobs is None or result.ran - ran < max_jobs:
                if include_scheduled:
                    run(
                        queries.make_scheduled_due(queue_names, skip_ids=True),
                        {"job_ids": deferred},
                    )
                run(signal_queries.wake_waiting_jobs())  # past their deadline, or signalled
                run(step_queries.wake_sleeping_jobs(), {"ahead": 0.0})  # their sleep is over
                row = run(claim, params).first()
                if row is None:
                    break
                if row.status == "cancelled":  # past its expires_at: the claim cancelled it
                    continue
                outcome = runner.run(row, run, _signal_transaction(target, run))
                _write(run, outcome, result)
                if outcome.kind is OutcomeKind.deferred:
                    deferred.append(outcome.job.id)
                error = outcome.exception
                if error is None or outcome.kind not in _RAISED:
                    continue
                if not isinstance(error, Exception):
                    raise error  # its outcome is written; a test failure or an interrupt goes on up
                if reraise:
                    raise error
    finally:
        runner.close()
        if isinstance(target, Session):
            target.expire_all()  # the Job objects it holds now show their new status
    return result


class _OwnTransactions:
    """`ctx.wait_for_signal()`'s transactions of their own, for a drain given an Engine (its
    autocommit connection would release the key's lock before the park)."""

    def __init__(self, engine: Engine) -> None:
        self._transaction = engine_transaction(engine)

    def __call__(self) -> AbstractContextManager[Any]:
        return self._transaction()


def _signal_transaction(target: Session | Connection | Engine, run: Any) -> Any:
    """What `ctx.wait_for_signal()` runs its statements in: the drain's own transaction
    (a Session's or a Connection's, a test's: no key lock is taken in it), or, given an
    Engine, transactions of their own (with the key's lock, as under the worker)."""
    if isinstance(target, Engine):
        return _OwnTransactions(target)

    @contextmanager
    def same() -> Iterator[Any]:
        yield run

    return same


@contextmanager
def _connection_for(target: Session | Connection | Engine) -> Iterator[Any]:
    """Yield `run(statement, params)` executing on the target's connection, as `drain` says."""
    if isinstance(target, Session):
        target.flush()
        conn = target.connection(bind_arguments={"mapper": Job})
        yield conn.execute
    elif isinstance(target, Engine):
        with target.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn.execute
    elif target.in_transaction():
        yield target.execute
    else:

        def commit_each(statement: Any, params: Any = None) -> Any:
            with target.begin():
                result = target.execute(statement, params)
                return _BufferedResult(list(result.all()) if result.returns_rows else [])

        yield commit_each


class _BufferedResult:
    """Rows fetched before the statement's transaction ended."""

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def first(self) -> Any:
        return self._rows[0] if self._rows else None


class _DrainRunner:
    """The job core's `JobRunner` for `drain`: async handlers run on an event loop in a
    thread of its own (started on first use, stopped when `drain` returns), so the calling
    thread may itself be inside a loop; a timed handler is given up on at its deadline."""

    def __init__(self, registry: Registry, engine: Engine | None = None) -> None:
        self.engine = engine
        self.registry = registry
        """A drain given an Engine: its jobs' `ctx.session()` (and row arguments) work."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._timers: dict[tuple[int, int], asyncio.TimerHandle] = {}
        self.runner = JobRunner(registry, self.loop, self._watch_deadline, DRAIN_WORKER_ID)
        self.resources = resources_of(registry, {})

    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="sqla-queue-drain", daemon=True
            )
            self._thread.start()
        return self._loop

    def _watch_deadline(self, job: JobAttempt, deadline: float) -> None:
        job.deadline = deadline  # a sync handler returning past it timed out too
        self.loop().call_soon_threadsafe(self._arm, job, deadline)

    def _arm(self, job: JobAttempt, deadline: float) -> None:
        delay = max(deadline - time.monotonic(), 0.0)
        self._timers[job.key] = self.loop().call_later(
            delay, self.runner.give_up, job, "timed out", self._loop
        )

    def _disarm(self, key: tuple[int, int]) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def run(self, row: Any, execute: Any, signal_transaction: Any = None) -> Outcome:
        """One claimed row's attempt, through `run_job` and the lifecycle hooks; `execute`
        runs its `ctx.parent_results()` query (in the drain's transaction), and
        `signal_transaction` gives its `ctx.wait_for_signal()` its transactions."""
        registry = self.runner.registry
        task = registry.get(row.task)
        task_max = task.max_attempts if task is not None else None
        own = isinstance(signal_transaction, _OwnTransactions)
        args, decode_error = decode_args(row.args_json)
        ctx = JobContext(
            row.id,
            row.task,
            row.queue,
            row.attempts,
            resources=self.resources,
            tags=row.tags,
            meta=row.meta_json,
            about=row.about,
            parent_results=lambda ctx: read_parent_results(execute, ctx.job_id),
            steps=ExecuteJournal(execute),
            session_factory=None if self.engine is None else self._job_session,
            signals=None
            if signal_transaction is None
            else lambda ctx, key, seq, timeout: receive_signal(
                signal_transaction, ctx, key, seq, timeout, task_max, own_transactions=own
            ),
        )
        job = JobAttempt(ctx, args, row.max_attempts, decode_error)
        self.runner.claimed(ctx)
        outcome = self.runner.run_job(job)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._disarm, job.key)
        self.runner.finished(outcome)
        return outcome

    def _job_session(self, ctx: JobContext) -> Session:
        assert self.engine is not None
        return job_session(self.engine, ctx, self.registry)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(2)
            if not self._loop.is_running():
                self._loop.close()


def _write(run: Any, outcome: Outcome, result: DrainResult) -> None:
    """Write one outcome with the worker's fenced statement for its kind, and count it."""
    job, kind = outcome.job, outcome.kind
    fence = {"job_ids": [job.id], "job_attempts": [job.attempt]}
    errors = {"job_errors": [storable(outcome.error)]}
    if kind is OutcomeKind.succeeded:
        if not outcome.committed:
            run(queries.complete_jobs(), {**fence, "job_results": [outcome.result]})
        result.succeeded += 1
        return
    if outcome.error:
        result.errors.append((job.id, outcome.error))
    if kind is OutcomeKind.snoozed:
        params = {
            "job_delays": [outcome.retry_in],
            "job_task_max_attempts": [outcome.task_max_attempts],
        }
        if outcome.sleeps:  # parked until its end, as under the worker
            run(queries.park_sleeping_jobs(), {**fence, **params})
        else:
            run(queries.snooze_jobs(), {**fence, **errors, **params})
        result.snoozed += 1
    elif kind is OutcomeKind.deferred:
        run(queries.defer_jobs(), {**fence, **errors})
        result.deferred += 1
    elif kind is OutcomeKind.waiting:
        result.waiting += 1
    elif kind in WRITES_NOTHING:
        if job.ctx.cancelled:  # its slot of a limited queue is free again
            run(queries.free_cancelled_jobs(), fence)
    elif outcome.requeues:
        params = {**fence, **errors, **_entry(outcome), "job_delays": [outcome.retry_in]}
        run(queries.retry_jobs(), params)
        result.retried += 1
    else:
        run(queries.fail_jobs(), {**fence, **errors, **_entry(outcome)})
        result.failed += 1


def _entry(outcome: Outcome) -> dict[str, list[str | None]]:
    """The failed attempt's error history entry, as the worker's completer sends it."""
    error_class, message, traceback = error_entry(outcome)
    return {
        "job_error_classes": [error_class],
        "job_error_messages": [message],
        "job_error_tracebacks": [traceback],
    }


def run_until_empty(
    engine: Engine, registry: Registry, config: WorkerConfig | None = None
) -> WorkerStats:
    """Run a real worker in burst mode in this thread until no job is due; return its counts.

    Unlike `drain`, this is the worker itself (its threads, batches and commits): the jobs
    must be committed, and `engine` must not be a connection inside a test transaction.
    """
    config = config or WorkerConfig(concurrency=1, batch=50, poll_only=True)
    config.burst = True
    return Worker(engine, registry, config).run(install_signal_handlers=False)
