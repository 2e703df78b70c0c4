"""The worker: claim a batch, run handlers outside any transaction, finish in batches.

Threads, each with one job:
- the dispatcher (the caller's thread): claims batches, times out handlers, writes outcomes;
- `concurrency` handler threads that pull claimed jobs and run them (async handlers are
  handed on to one event loop thread);
- the keeper: heartbeats held jobs, reaps stale ones, refreshes queue settings;
- the listener (unless poll-only): LISTEN, wakes the dispatcher on NOTIFY.

Every statement runs on a plain Core connection in autocommit mode: each is its own short
transaction (no ORM Session, no savepoint, nothing held open while a handler runs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from . import queries
from .database import create_queue_engine
from .errors import ConfigurationError, JobTimeoutError, TaskNotFoundError
from .migrate import check_schema
from .models import DEFAULT_MAX_ATTEMPTS, Retention
from .notify import Listener
from .registry import JobContext, Registry, Task

log = logging.getLogger("sqla_queue.worker")

MAX_ERROR_CHARS = 20_000
FLUSH_DELAY = 0.05
"""Seconds an outcome may wait for others before it is written."""
# Errors that retrying cannot fix; anything else (refused, starting up, "too many
# connections for role") is waited out with backoff.
FATAL_CONNECT_ERRORS = (
    "password authentication failed",
    "authentication failed",
    "does not exist",  # the role or the database
    "no pg_hba.conf entry",
    "permission denied",  # e.g. no CONNECT privilege on the database
    "invalid dsn",
    "invalid connection option",
)


@dataclass
class WorkerConfig:
    """How a worker runs. Every field is a `sqla-queue worker` option of the same name."""

    queues: Sequence[str] | None = None
    """Queues to claim from; None claims from every queue that is not paused."""
    concurrency: int = 4
    """Handlers running at once."""
    batch: int = 10
    """Jobs claimed per statement at most; the worker holds at most concurrency + batch - 1."""
    lease: float = 60.0
    """Seconds without a heartbeat after which any worker's reaper requeues a running job."""
    poll_interval: float = 2.0
    """Longest sleep between polls when idle (polls back off exponentially up to it)."""
    poll_only: bool = False
    """Never LISTEN (for PgBouncer in transaction pooling mode): poll with backoff only."""
    burst: bool = False
    """Exit once no job is due and none is running."""
    shutdown_timeout: float = 30.0
    """Seconds in-flight handlers get to finish after SIGTERM before their jobs are requeued."""
    worker_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    )

    def __post_init__(self) -> None:
        checks = (
            (self.concurrency >= 1, f"concurrency must be at least 1, got {self.concurrency}"),
            (self.batch >= 1, f"batch must be at least 1, got {self.batch}"),
            (self.lease > 0, f"lease must be positive, got {self.lease}"),
            (self.poll_interval > 0, f"poll interval must be positive, got {self.poll_interval}"),
            (self.shutdown_timeout >= 0, "shutdown timeout must not be negative"),
        )
        for ok, message in checks:
            if not ok:
                raise ConfigurationError(detail=message)
        if isinstance(self.queues, str):  # one name, not a sequence of one-letter queues
            self.queues = [self.queues]
        if self.queues is not None:
            self.queues = [q for q in self.queues if q]
            if not self.queues:
                raise ConfigurationError(detail="the queue list is empty; omit -q for all queues")


@dataclass
class WorkerStats:
    """Counts of what a worker did; `run()` returns them."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0
    reaped: int = 0


class _Held:
    """A job this worker has claimed and not yet finished."""

    __slots__ = (
        "args",
        "attempt",
        "ctx",
        "deadline",
        "done",
        "id",
        "max_attempts",
        "queue",
        "task",
    )

    def __init__(self, row: Sequence[Any]) -> None:
        self.id: int = row[0]
        self.task: str = row[1]
        self.args: dict[str, Any] = row[2]
        self.attempt: int = row[3]
        self.max_attempts: int | None = row[4]
        self.queue: str = row[5]
        self.ctx: JobContext | None = None
        self.deadline: float | None = None
        self.done = False


_SUCCESS = 0
_ERROR = 1
_FAIL = 2


class Worker:
    """Runs jobs from the queue with the handlers of `registry`.

    worker = Worker(engine, registry, WorkerConfig(queues=["emails"], concurrency=8))
    worker.run()          # until SIGTERM/SIGINT, or `worker.stop()` from another thread
    """

    def __init__(
        self,
        engine: Engine | str,
        registry: Registry,
        config: WorkerConfig | None = None,
    ) -> None:
        self.config = config or WorkerConfig()
        self.registry = registry
        self.engine = (
            create_queue_engine(engine, pool_size=3, max_overflow=2)
            if isinstance(engine, str)
            else engine
        )
        self.stats = WorkerStats()
        cfg = self.config
        self._claim = queries.claim_jobs(cfg.queues)
        self._claim_params: dict[str, Any] = {"worker_id": cfg.worker_id}
        if cfg.queues is not None:
            self._claim_params["queues"] = list(cfg.queues)
        self._finish_by_retention = {
            Retention.delete.value: queries.complete_delete(),
            Retention.keep.value: queries.complete_keep(),
            Retention.archive.value: queries.complete_archive(),
        }
        self._delete_and_claim = queries.complete_delete_and_claim(cfg.queues)
        self._retry = queries.retry_jobs()
        self._fail = queries.fail_jobs()
        self._release = queries.release_jobs()
        self._heartbeat = queries.heartbeat_jobs()

        self._held: dict[int, _Held] = {}
        self._held_lock = threading.Lock()
        self._ready: deque[_Held] = deque()
        self._outcomes: deque[tuple[_Held, int, float, str]] = deque()
        self._running = 0
        self._running_lock = threading.Lock()
        # Handler threads wait on it for ready jobs and room to run them.
        self._handlers = threading.Condition(self._running_lock)
        self._closed = False
        self._claimable = False
        self._flush_size = self.config.batch
        self._timed: set[_Held] = set()
        self._retention: dict[str, str] = {}
        self._wake = threading.Event()
        self._notified = False
        self._stopping = threading.Event()
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._listener: Listener | None = None
        self._keeper: threading.Thread | None = None
        self._signals = 0

    # -- public -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming, let in-flight jobs finish (up to the shutdown timeout), then return."""
        self._stopping.set()
        self._wake.set()

    def run(self, install_signal_handlers: bool | None = None) -> WorkerStats:
        """Work until stopped (or, in burst mode, until nothing is due). Returns counts."""
        if install_signal_handlers is None:
            install_signal_handlers = threading.current_thread() is threading.main_thread()
        previous = self._install_signals() if install_signal_handlers else {}
        try:
            self._connect_with_retry(first=True)
            if self._stopping.is_set():
                return self.stats
            self._start_threads()
            log.info(
                "worker %s started: queues=%s concurrency=%d batch=%d lease=%ss%s",
                self.config.worker_id,
                ",".join(self.config.queues) if self.config.queues else "*",
                self.config.concurrency,
                self.config.batch,
                self.config.lease,
                " poll-only" if self.config.poll_only else "",
            )
            missing = sorted(set(self.config.queues or ()) - set(self._retention))
            if missing:  # a typo in -q would otherwise wait silently forever
                log.warning(
                    "no queue named %s (a typo? `sqla-queue queues create NAME` creates one)",
                    ", ".join(repr(name) for name in missing),
                )
            self._dispatch_loop()
            self._shutdown()
        finally:
            self._stop_threads()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if self._conn is not None:
                self._conn.close()
        log.info("worker %s stopped: %s", self.config.worker_id, self.stats)
        return self.stats

    # -- connection -------------------------------------------------------------------------

    def _connect_with_retry(self, first: bool = False) -> None:
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                if first:
                    check_schema(conn)
                    self._load_queue_settings(conn)
                self._conn = conn
                return
            except OperationalError as exc:
                message = str(exc.orig) if exc.orig is not None else str(exc)
                if any(fatal in message for fatal in FATAL_CONNECT_ERRORS):
                    raise
                log.warning(
                    "database unavailable (%s); retrying in %.1fs",
                    message.strip().splitlines()[0] if message.strip() else exc,
                    backoff,
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _execute(self, statement: Any, params: Any = None) -> Any:
        """Run one autocommit statement on the dispatcher's connection, reconnecting on loss."""
        while True:
            if self._conn is None:
                self._connect_with_retry()
                if self._conn is None:  # stopping while the database is away
                    raise _Stopped
            try:
                return self._conn.execute(statement, params)
            except DBAPIError as exc:
                if not exc.connection_invalidated and not isinstance(exc, OperationalError):
                    raise
                log.warning("database connection lost (%s); reconnecting", exc.orig)
                try:
                    self._conn.close()
                finally:
                    self._conn = None

    def _load_queue_settings(self, conn: Connection) -> None:
        self._retention = {
            name: retention for name, _, retention in conn.execute(queries.queue_settings())
        }

    # -- threads ----------------------------------------------------------------------------

    def _start_threads(self) -> None:
        cfg = self.config
        for _ in range(cfg.concurrency):
            self._start_handler()
        if any(self.registry[name].is_async for name in self.registry):
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, name="sqla-queue-async", daemon=True
            )
            self._loop_thread.start()
        if not cfg.poll_only:
            self._listener = Listener(self.engine, cfg.queues, self._on_notify)
            self._listener.start()
        self._keeper = threading.Thread(target=self._keep, name="sqla-queue-keeper", daemon=True)
        self._keeper.start()

    def _stop_threads(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.stop()
        if self._keeper is not None:
            self._keeper.join(5)
        with self._handlers:  # idle handler threads exit; busy ones once their job returns
            self._closed = True
            self._handlers.notify_all()
        if self._loop is not None:
            # Abandoned async handlers get a CancelledError to clean up, not a silent drop.
            cancelled = asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), self._loop)
            try:
                cancelled.result(2)
            except Exception:
                log.warning("async handlers did not finish cancelling within 2 s")
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(2)

    def _start_handler(self) -> None:
        threading.Thread(target=self._handle, name="sqla-queue-job", daemon=True).start()

    def _on_notify(self) -> None:
        self._notified = True
        self._wake.set()

    # -- dispatcher -------------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        cfg = self.config
        idle_backoff = 0.05
        queue_empty = False
        next_poll = 0.0
        flush_after = 0.0
        # At most a batch of unwritten outcomes, so a crash re-runs <= batch + concurrency jobs.
        flush_size = self._flush_size
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                if self._notified or now >= next_poll:
                    self._notified = False
                    queue_empty = False
                # Handlers wake us for room to claim only while a claim may find jobs.
                self._claimable = not queue_empty
                held = len(self._ready) + self._running
                want = min(cfg.batch, cfg.concurrency + cfg.batch - 1 - held)
                if self._outcomes and not flush_after:
                    flush_after = now + FLUSH_DELAY
                if (
                    not queue_empty
                    and not self._ready
                    and want > 0
                    and (want == cfg.batch or self._running == 0)
                ):
                    claimed = self._claim_batch(want)  # writes pending outcomes first
                    flush_after = 0.0
                    if claimed < want:
                        queue_empty = True
                        next_poll = time.monotonic() + idle_backoff
                        idle_backoff = min(idle_backoff * 2, cfg.poll_interval)
                    else:
                        idle_backoff = 0.05
                    continue
                if self._outcomes and (
                    len(self._outcomes) >= flush_size or self._running == 0 or now >= flush_after
                ):
                    self._flush()
                    flush_after = 0.0
                    continue
                if (
                    cfg.burst
                    and queue_empty
                    and self._running == 0
                    and not self._ready
                    and not self._outcomes
                ):
                    return
                timeouts = [next_poll - now] if queue_empty else []
                if flush_after:
                    timeouts.append(flush_after - now)
                deadline = self._check_deadlines(now) if self._timed else None
                if deadline is not None:
                    timeouts.append(deadline - now)
                self._wake.wait(max(0.0, min(timeouts)) if timeouts else None)
                self._wake.clear()
        except _Stopped:
            return

    def _claim_batch(self, want: int) -> int:
        """Write pending outcomes, then claim up to `want` jobs.

        When every pending outcome is a success to delete (the default retention), the
        deletion and the claim are one statement: one commit per cycle instead of two.
        """
        self._claim_params["limit"] = want
        deletions = self._take_deletions()
        if deletions is None:
            self._flush()
            rows = self._execute(self._claim, self._claim_params).all()
        else:
            params = {**self._claim_params, "job_ids": deletions[0], "job_attempts": deletions[1]}
            rows = self._execute(self._delete_and_claim, params).all()
            self.stats.succeeded += len(deletions[0])
        if not rows:
            return 0
        held = [_Held(row) for row in rows]
        with self._held_lock:
            for job in held:
                self._held[job.id] = job
        with self._handlers:  # the whole batch at once; handler threads pull from it
            self._ready.extend(held)
            self._handlers.notify(len(held))
        self.stats.claimed += len(held)
        return len(held)

    def _handle(self) -> None:
        """A handler thread: run ready jobs while there is room, one lock round per job.

        It exits when the worker closes, or when its job was given up on (timed out, or
        abandoned at the shutdown timeout): a replacement thread has taken its place.
        """
        limit = self.config.concurrency
        job: _Held | None = None
        outcome: tuple[_Held, int, float, str] | None = None
        while True:
            with self._handlers:
                if job is not None:
                    if job.done:
                        return
                    job.done = True
                    self._settle(outcome)
                # Once stopping, held jobs that have not started are released, not run.
                while not self._ready or self._running >= limit or self._stopping.is_set():
                    if self._closed:
                        return
                    self._handlers.wait()
                self._running += 1  # first: an unlocked reader may count it twice, never zero times
                job = self._ready.popleft()
                if not self._ready and self._claimable and self._running < limit:
                    self._wake.set()  # room to claim the next batch while this one runs
            task = self._prepare(job)
            if task is None:
                job = None
                continue
            try:
                if task.pass_context:
                    task.func(job.ctx, **job.args)
                else:
                    task.func(**job.args)
            except BaseException as exc:
                outcome = self._error_outcome(job, task, exc)
            else:
                outcome = (job, _SUCCESS, 0.0, "")

    def _prepare(self, job: _Held) -> Task | None:
        """Called on a handler thread for a job it took: the sync task to run, or None when the
        job was skipped or recorded here, or handed on to the event loop."""
        if job.ctx is not None and job.ctx.cancelled:  # lost before it started
            self._forget(job)
            with self._handlers:
                self.stats.lost += 1
                self._settle(None)
            return None
        task = self.registry.get(job.task)
        if task is None:
            self._record(job, _FAIL, 0.0, str(TaskNotFoundError(task=job.task)))
            return None
        max_attempts = job.max_attempts or task.max_attempts or DEFAULT_MAX_ATTEMPTS
        if job.attempt > max_attempts:
            message = (
                f"attempt {job.attempt} exceeds max_attempts {max_attempts} "
                "(the previous attempt's worker stopped heartbeating)"
            )
            self._record(job, _FAIL, 0.0, message)
            return None
        if task.pass_context:  # only a handler that asks for it gets one (an Event per job)
            job.ctx = JobContext(job.id, job.task, job.queue, job.attempt, self._beat_one)
        if task.is_async:
            assert self._loop is not None
            asyncio.run_coroutine_threadsafe(self._run_async(task, job), self._loop)
            return None
        if task.timeout is not None:
            with self._handlers:
                job.deadline = time.monotonic() + task.timeout
                self._timed.add(job)
            self._wake.set()  # the dispatcher times it out
        return task

    async def _run_async(self, task: Task, job: _Held) -> None:
        try:
            call = task.func(job.ctx, **job.args) if task.pass_context else task.func(**job.args)
            if task.timeout is not None:
                await asyncio.wait_for(call, task.timeout)
            else:
                await call
        except asyncio.TimeoutError:
            self._finished(
                job, task, JobTimeoutError(job_id=job.id, task=job.task, timeout=task.timeout)
            )
        except BaseException as exc:
            self._finished(job, task, exc)
        else:
            self._finished(job, task, None)

    def _finished(self, job: _Held, task: Task, exc: BaseException | None) -> None:
        """Called on the event loop thread: record an async handler's outcome."""
        outcome = (job, _SUCCESS, 0.0, "") if exc is None else self._error_outcome(job, task, exc)
        with self._handlers:
            if job.done:  # abandoned at the shutdown timeout and already released
                return
            job.done = True
            self._settle(outcome)
            self._handlers.notify()  # its slot is free for a handler thread

    def _settle(self, outcome: tuple[_Held, int, float, str] | None) -> None:
        """Under the handlers' lock: record a started job's outcome (if any), free its slot."""
        # Outcome first: a dispatcher that sees nothing running must also see it to flush.
        if outcome is not None:
            self._outcomes.append(outcome)
        self._running -= 1
        pending = len(self._outcomes)
        # Wake the dispatcher only when it has something to do, not once per job: to start
        # the flush delay, to flush a full batch, to claim, or to exit in burst mode.
        if (
            pending == 1
            or pending >= self._flush_size
            or (not self._ready and (self._running == 0 or self._claimable))
        ):
            self._wake.set()

    def _error_outcome(
        self, job: _Held, task: Task, exc: BaseException
    ) -> tuple[_Held, int, float, str]:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        text = text[-MAX_ERROR_CHARS:]
        max_attempts = job.max_attempts or task.max_attempts or DEFAULT_MAX_ATTEMPTS
        if job.attempt >= max_attempts:
            return (job, _FAIL, 0.0, text)
        return (job, _ERROR, task.retry.delay(job.attempt), text)

    def _record(self, job: _Held, kind: int, delay: float, error: str) -> None:
        """A handler thread's outcome for a job it took but did not run."""
        with self._handlers:
            job.done = True
            self._settle((job, kind, delay, error))

    def _check_deadlines(self, now: float) -> float | None:
        """Time out overrunning sync handlers; return the nearest deadline still ahead.

        A sync handler cannot be interrupted: its job is recorded as timed out (retried or
        failed by the usual rules), its context reports `cancelled`, and whatever it returns
        later is discarded.
        """
        nearest: float | None = None
        expired: list[_Held] = []
        with self._handlers:  # handler threads add to the set
            for job in list(self._timed):
                assert job.deadline is not None
                if job.done:
                    self._timed.discard(job)
                elif job.deadline <= now:
                    job.done = True  # its thread, once the handler returns, discards the result
                    self._timed.discard(job)
                    expired.append(job)
                elif nearest is None or job.deadline < nearest:
                    nearest = job.deadline
        for job in expired:
            task = self.registry[job.task]
            log.warning("job %s (%s) timed out after %ss", job.id, job.task, task.timeout)
            error = JobTimeoutError(job_id=job.id, task=job.task, timeout=task.timeout)
            outcome = self._error_outcome(job, task, error)
            with self._handlers:
                self._settle(outcome)
            if job.ctx is not None:
                job.ctx.mark_lost()
            # Its thread stays stuck in the handler: a new one keeps `concurrency` free threads.
            self._start_handler()
        return nearest

    # -- finishing --------------------------------------------------------------------------

    def _flush(self) -> None:
        """Write every recorded outcome: one statement per kind of outcome."""
        if not self._outcomes:
            return
        batch: list[tuple[_Held, int, float, str]] = []
        while self._outcomes:
            batch.append(self._outcomes.popleft())
        by_retention: dict[str, tuple[list[int], list[int]]] = {}
        retries: tuple[list[int], list[int], list[float], list[str]] = ([], [], [], [])
        failures: tuple[list[int], list[int], list[str]] = ([], [], [])
        for job, kind, delay, error in batch:
            if kind == _SUCCESS:
                retention = self._retention.get(job.queue, Retention.delete.value)
                ids, attempts = by_retention.setdefault(retention, ([], []))
                ids.append(job.id)
                attempts.append(job.attempt)
            elif kind == _ERROR:
                retries[0].append(job.id)
                retries[1].append(job.attempt)
                retries[2].append(delay)
                retries[3].append(error)
            else:
                failures[0].append(job.id)
                failures[1].append(job.attempt)
                failures[2].append(error)
        for retention, (ids, attempts) in by_retention.items():
            self._execute(
                self._finish_by_retention[retention],
                {"job_ids": ids, "job_attempts": attempts},
            )
            self.stats.succeeded += len(ids)
        if retries[0]:
            self._execute(
                self._retry,
                {
                    "job_ids": retries[0],
                    "job_attempts": retries[1],
                    "job_delays": retries[2],
                    "job_errors": retries[3],
                },
            )
            self.stats.retried += len(retries[0])
        if failures[0]:
            self._execute(
                self._fail,
                {"job_ids": failures[0], "job_attempts": failures[1], "job_errors": failures[2]},
            )
            self.stats.failed += len(failures[0])
        with self._held_lock:  # one lock round for the whole batch
            for job, *_ in batch:
                self._held.pop(job.id, None)

    def _take_deletions(self) -> tuple[list[int], list[int]] | None:
        """Pop the pending outcomes if all are successes to delete: (ids, attempts); else None."""
        if not self._outcomes:
            return None
        with self._running_lock:  # handler threads append under it: a stable snapshot
            pending = list(self._outcomes)
        delete = Retention.delete.value
        retention = self._retention
        if not all(
            kind == _SUCCESS and retention.get(job.queue, delete) == delete
            for job, kind, _, _ in pending
        ):
            return None
        ids: list[int] = []
        attempts: list[int] = []
        with self._held_lock:
            for job, *_ in pending:
                self._outcomes.popleft()  # the oldest, in the snapshot's order
                ids.append(job.id)
                attempts.append(job.attempt)
                self._held.pop(job.id, None)
        return ids, attempts

    def _forget(self, job: _Held) -> None:
        with self._held_lock:
            self._held.pop(job.id, None)

    # -- keeper: heartbeat, reaper, settings ------------------------------------------------

    def _beat_one(self, ctx: JobContext) -> bool:
        """A handler's own `ctx.heartbeat()`: extend its lease now."""
        if ctx.cancelled:
            return False
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            owned = conn.execute(
                self._heartbeat, {"job_ids": [ctx.job_id], "job_attempts": [ctx.attempt]}
            ).all()
        if not owned:
            ctx.mark_lost()
        return bool(owned)

    def _keep(self) -> None:
        cfg = self.config
        beat_every = max(0.1, cfg.lease / 4)
        reap_every = max(0.2, cfg.lease / 2)
        settings_every = 5.0
        next_reap = time.monotonic() + random.uniform(0, reap_every)
        next_settings = time.monotonic() + settings_every
        reap = queries.reap_stale_jobs()
        notify = queries.notify_queues()
        settings = queries.queue_settings()
        while not self._stopping.wait(beat_every):
            try:
                with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    self._beat_all(conn)
                    now = time.monotonic()
                    if now >= next_reap:
                        next_reap = now + reap_every
                        reaped = conn.execute(reap, {"lease": cfg.lease}).all()
                        if reaped:
                            self.stats.reaped += len(reaped)
                            log.warning(
                                "requeued %d job(s) whose worker stopped heartbeating: %s",
                                len(reaped),
                                [job_id for job_id, _ in reaped][:20],
                            )
                            conn.execute(notify, {"queues": sorted({q for _, q in reaped})})
                    if now >= next_settings:
                        next_settings = now + settings_every
                        self._retention = {
                            name: retention for name, _, retention in conn.execute(settings)
                        }
            except Exception as exc:
                log.warning("heartbeat/reaper round failed (%s); will retry", exc)

    def _beat_all(self, conn: Connection) -> None:
        with self._held_lock:
            jobs = [job for job in self._held.values() if not job.done]
        if not jobs:
            return
        owned = {
            row[0]
            for row in conn.execute(
                self._heartbeat,
                {"job_ids": [j.id for j in jobs], "job_attempts": [j.attempt for j in jobs]},
            )
        }
        for job in jobs:
            if job.id not in owned and not job.done:
                log.warning("job %s is no longer ours (reaped or cancelled)", job.id)
                if job.ctx is None:
                    job.ctx = JobContext(job.id, job.task, job.queue, job.attempt)
                job.ctx.mark_lost()

    # -- shutdown ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Release unstarted jobs now; give running ones the shutdown timeout, then release."""
        try:
            with self._handlers:  # no handler thread takes one of them after this
                unstarted = list(self._ready)
                self._ready.clear()
            self._release_jobs(unstarted, refund=1)
            deadline = time.monotonic() + self.config.shutdown_timeout
            while True:
                self._flush()
                if self._running == 0 or time.monotonic() >= deadline:
                    break
                self._wake.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                self._wake.clear()
            with self._running_lock, self._held_lock:
                left = [job for job in self._held.values() if not job.done]
                for job in left:
                    job.done = True
                    if job.ctx is not None:
                        job.ctx.mark_lost()
            if left:
                log.warning(
                    "%d job(s) still running after the %ss shutdown timeout; requeueing them",
                    len(left),
                    self.config.shutdown_timeout,
                )
            self._release_jobs(left, refund=0)
            self._flush()
        except _Stopped:
            log.warning("database unavailable during shutdown; the reaper will requeue held jobs")

    def _release_jobs(self, jobs: list[_Held], refund: int) -> None:
        if not jobs:
            return
        self._execute(self._release, _release_params(jobs, refund))
        self.stats.released += len(jobs)
        with self._held_lock:
            for job in jobs:
                self._held.pop(job.id, None)

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "received %s: finishing in-flight jobs (up to %ss); send again to exit now",
                signal.Signals(signum).name,
                self.config.shutdown_timeout,
            )
            self.stop()
            return
        log.warning("received %s again: exiting now", signal.Signals(signum).name)
        self._exit_now()

    def _exit_now(self) -> None:
        try:
            with self._held_lock:
                held = list(self._held.values())
            if held and self._conn is not None:
                self._conn.execute(self._release, _release_params(held, refund=0))
        finally:
            os._exit(1)


def _release_params(jobs: list[_Held], refund: int) -> dict[str, list[int]]:
    """Parameters of `queries.release_jobs` for `jobs`, each refunded `refund` attempts."""
    return {
        "job_ids": [j.id for j in jobs],
        "job_attempts": [j.attempt for j in jobs],
        "job_refunds": [refund] * len(jobs),
    }


async def _cancel_other_tasks() -> None:
    """Cancel every task on the running loop but this one, and wait for them to end."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _Stopped(Exception):
    """Internal: the worker is stopping and the database is unreachable."""
