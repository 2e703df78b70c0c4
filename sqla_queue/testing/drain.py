"""Run due jobs in the calling thread, with the worker's own claim and finish statements.

`drain` is for tests: it claims one job at a time (priority order), calls its handler here,
and writes the outcome with the same fenced statements the worker uses. Given a `Session`
or a `Connection` in a transaction, it works inside that transaction, so a test that rolls
back leaves nothing behind. `run_until_empty` runs a real burst-mode `Worker` instead.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.orm import Session

from sqla_queue import queries
from sqla_queue.errors import ConfigurationError, JobTimeoutError, Snooze, TaskNotFoundError
from sqla_queue.middleware import compose
from sqla_queue.models import DEFAULT_MAX_ATTEMPTS, Job
from sqla_queue.registry import JobContext, Registry, Task
from sqla_queue.results import encode_result
from sqla_queue.worker import Worker, WorkerConfig, WorkerStats
from sqla_queue.worker.executor import resources_of
from sqla_queue.worker.jobs import decode_args, error_text

DRAIN_WORKER_ID = "sqla_queue.testing.drain"
"""The `locked_by` of jobs claimed by `drain`."""
_JOBS: Table = Job.__table__  # type: ignore[assignment]


@dataclass
class DrainResult:
    """How many jobs `drain` ran, by outcome. `errors` holds (job id, traceback) per failure.

    Compare with counts only: `assert drain(...) == DrainResult(succeeded=2)`.
    """

    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    snoozed: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list, compare=False)

    @property
    def ran(self) -> int:
        """Jobs claimed and finished, whatever their outcome (a snoozed attempt included)."""
        return self.succeeded + self.retried + self.failed + self.snoozed


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

    A handler that fails is retried by its policy (later: see `include_scheduled`) or
    failed once out of attempts, exactly as the worker would; a job of an unknown task
    fails. A job that raises `Snooze` is queued again after its delay without spending an
    attempt (with `include_scheduled`, a job that always snoozes runs until `max_jobs`). A
    handler's `BaseException` (`pytest.fail`, `KeyboardInterrupt`) is written as a failed
    attempt too, then always raised. Jobs a handler enqueues and commits are run in
    the same call.
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
    try:
        with _connection_for(target) as run:
            while max_jobs is None or result.ran - ran < max_jobs:
                if include_scheduled:
                    run(queries.make_scheduled_due(queue_names))
                row = run(claim, params).first()
                if row is None:
                    break
                error = _run_job(registry, row, run, result)
                if error is not None and reraise:
                    raise error
    finally:
        if isinstance(target, Session):
            target.expire_all()  # the Job objects it holds now show their new status
    return result


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


def _run_job(
    registry: Registry,
    row: Any,
    run: Any,
    result: DrainResult,
) -> BaseException | None:
    """Run one claimed job, write its outcome, count it; return the handler's exception."""
    fence = {"job_ids": [row.id], "job_attempts": [row.attempts]}
    task = registry.get(row.task)
    if task is None:
        message = str(TaskNotFoundError(task=row.task))
        run(queries.fail_jobs(), {**fence, "job_errors": [message]})
        result.failed += 1
        result.errors.append((row.id, message))
        return None
    args, decode_error = decode_args(row.args_json)
    if decode_error is not None:
        run(queries.fail_jobs(), {**fence, "job_errors": [decode_error]})
        result.failed += 1
        result.errors.append((row.id, decode_error))
        return None
    context = JobContext(
        row.id,
        row.task,
        row.queue,
        row.attempts,
        resources=resources_of(registry, {}),
        tags=row.tags,
        meta=row.meta_json,
    )
    try:
        returned = _call_handler(registry, task, context, args)
        if isinstance(returned, Snooze):  # returning it works as raising it does
            raise returned
    except Snooze as snooze:
        params = {"job_delays": [snooze.seconds], "job_errors": [snooze.describe()]}
        run(
            queries.snooze_jobs(), {**fence, **params, "job_task_max_attempts": [task.max_attempts]}
        )
        result.snoozed += 1
        return None
    except BaseException as exc:  # pytest.fail, KeyboardInterrupt: never leave the job running
        text = error_text(exc)
        result.errors.append((row.id, text))
        max_attempts = row.max_attempts or task.max_attempts or DEFAULT_MAX_ATTEMPTS
        if row.attempts >= max_attempts:
            run(queries.fail_jobs(), {**fence, "job_errors": [text]})
            result.failed += 1
        else:
            delay = task.retry.delay(row.attempts)
            run(queries.retry_jobs(), {**fence, "job_delays": [delay], "job_errors": [text]})
            result.retried += 1
        if not isinstance(exc, Exception):
            raise  # its outcome is written; a test failure or an interrupt goes on up
        return exc
    kept = None
    if task.keep_result:
        kept, problem = encode_result(task.name, returned)
        if problem is not None:
            run(queries.fail_jobs(), {**fence, "job_errors": [problem]})
            result.failed += 1
            result.errors.append((row.id, problem))
            return None
    # by the queue's retention, decided in the SQL
    run(queries.complete_jobs(), {**fence, "job_results": [kept]})
    result.succeeded += 1
    return None


def _call_handler(registry: Registry, task: Task, context: JobContext, args: dict[str, Any]) -> Any:
    """Call one job's handler inside the registry's and the task's middleware, as the
    worker's executor does; the one place `drain` runs user code. A sync handler's timeout
    is not enforced here; an async one's is."""

    def call_handler(ctx: JobContext) -> Any:
        call = task.func(ctx, **args) if task.pass_context else task.func(**args)
        if inspect.isawaitable(call):
            return _run_coroutine(call, task, ctx)
        return call

    return compose([*registry.middleware, *task.middleware], call_handler)(context)


def _run_coroutine(call: Awaitable[Any], task: Task, context: JobContext) -> Any:
    async def bounded() -> Any:
        try:
            return await asyncio.wait_for(call, task.timeout)
        except asyncio.TimeoutError:
            raise JobTimeoutError(
                job_id=context.job_id, task=task.name, timeout=task.timeout
            ) from None

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(bounded())
    # Called from async code (through run_sync): this thread's loop is busy, use another.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, bounded()).result()


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
