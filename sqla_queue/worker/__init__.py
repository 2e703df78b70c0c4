"""The worker: claim a batch, run handlers outside any transaction, finish in batches.

Its parts, one module each, hand each other typed values (`ClaimedJob`, `Outcome`):
- `producer`: the claim loop, on the caller's thread (the dispatcher);
- `executor`: the one call site of every handler, inside its middleware, on handler threads
  (async handlers run on one event loop thread while their handler thread waits);
- `completer`: writes outcomes in batches, one statement per kind;
- `keeper`: the worker's registration, job leases, the reaper, the event loop watch, and
  the rollup's writes (`sqla_queue.job.counts`: jobs ended per minute, queue and task);
- `shutdown`: releasing held jobs on stop, and the second signal's exit;
- `board`: the held jobs and the lock the threads meet at; `connection`: the dispatcher's
  reconnecting connection.
The listener (`sqla_queue.runtime.listener`) wakes the producer on NOTIFY and relays cancellations.

Every statement runs on a plain Core connection in autocommit mode: each is its own short
transaction (no ORM Session, no savepoint, nothing held open while a handler runs).

    worker = Worker(engine, registry, WorkerConfig(queues=["emails"], concurrency=8))
    worker.run()   # until SIGTERM/SIGINT, or `worker.stop()` from another thread
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from types import FrameType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from sqla_queue.db import queries
from sqla_queue.db.database import autocommit_read_committed, create_queue_engine
from sqla_queue.db.migrate import SCHEMA_REVISION, check_schema, newer_expand_revisions
from sqla_queue.enqueue.results import parent_results_on
from sqla_queue.enqueue.signals import receive_on
from sqla_queue.job.context import JobContext
from sqla_queue.job.journal import capture_job_logs
from sqla_queue.job.outcome import Outcome, OutcomeKind
from sqla_queue.job.run import resources_of
from sqla_queue.registry import Registry
from sqla_queue.runtime.health_server import HealthServer, Pulse
from sqla_queue.runtime.listener import Listener
from sqla_queue.worker.board import JobBoard, wake_once
from sqla_queue.worker.completer import Completer
from sqla_queue.worker.config import WorkerConfig, WorkerStats
from sqla_queue.worker.connection import (
    DatabaseLink,
    FailureLog,
    backoff_delays,
    describe,
    waitable,
)
from sqla_queue.worker.executor import Executor
from sqla_queue.worker.health import DatabaseCheck, ThreadOf, WorkerHealth
from sqla_queue.worker.jobs import ClaimColumns, ClaimedJob, ContextParts
from sqla_queue.worker.journal import DatabaseJournal
from sqla_queue.worker.keeper import Keeper
from sqla_queue.worker.periodic import Scheduler
from sqla_queue.worker.producer import Producer, ProducerSettings
from sqla_queue.worker.shutdown import Shutdown, exit_now
from sqla_queue.worker.steps import EngineJournal
from sqla_queue.worker.transactional import job_session

log = logging.getLogger("sqla_queue.worker")

__all__ = ["Outcome", "OutcomeKind", "Worker", "WorkerConfig", "WorkerStats"]


class Worker:
    """Runs jobs from the queue with the handlers of `registry`.

    In your own process: `run()` blocks (call it in a thread of its own if you need);
    `stop()` from any thread makes it finish in-flight jobs and return. With
    `WorkerConfig(burst=True)` it returns once nothing is due.
    """

    def __init__(
        self,
        engine: Engine | str,
        registry: Registry,
        config: WorkerConfig | None = None,
    ) -> None:
        self.config = cfg = config or WorkerConfig()
        registry.load_included()  # the tasks and schedules its `include` modules register
        self.registry = registry
        self.engine = (
            create_queue_engine(engine, pool_size=3, max_overflow=2)
            if isinstance(engine, str)
            else engine
        )
        # ctx.session(): a Session on this engine whose commit finishes the job (fenced)
        self._job_session = functools.partial(job_session, self.engine, registry=registry)
        # ctx.parent_results(): the kept results of the jobs it depends on, on this engine
        self._parent_results = functools.partial(parent_results_on, self.engine)
        # ctx.step() and ctx.sleep(): each job's durable steps, recorded on this engine
        self._step_journal = EngineJournal(self.engine)
        # ctx.wait_for_signal(): the mailbox and the park, on this engine
        self._receive_signal = functools.partial(receive_on, self.engine, registry)
        # ctx.progress() and the handler's log lines, kept with the attempt
        self._journal = DatabaseJournal(self.engine, keeps_logs=cfg.job_logs)
        self.stats = WorkerStats()
        self._stopping = threading.Event()
        self._said_newer_schema = False  # the newer expand-only revisions, said once
        self._wake = threading.Event()
        self._signals = 0
        self._listener: Listener | None = None
        self._listener_pulse = Pulse()
        self._running = False
        self._run_thread: threading.Thread | None = None
        self.health: HealthServer | None = None
        """The health server while `run()` serves one (`WorkerConfig.health_port`)."""
        self.resources = resources_of(registry, cfg.resources)
        self._context_parts = ContextParts(
            self.resources,
            self._beat_one,
            self._job_session,
            self._parent_results,
            self._step_journal,
            self._receive_signal,
            self._journal,
        )
        hooks = registry.hooks
        self.board = JobBoard(cfg.concurrency, cfg.batch, wake_once(self._wake))
        self.db = DatabaseLink(
            self.engine, self._stopping, cfg.give_up_after, FailureLog(), cfg.synchronous_commit
        )
        self.executor = Executor(
            registry, self.board, self.engine, self._finished, worker_id=cfg.worker_id
        )
        self.completer = Completer(self.board, self.db, self.stats)
        self.keeper = Keeper(
            self.engine, cfg, registry, self.board, self.executor, self.stats, self._on_notify
        )
        self.producer = Producer(
            ProducerSettings(
                config=cfg,
                db=self.db,
                board=self.board,
                executor=self.executor,
                completer=self.completer,
                keeper=self.keeper,
                stats=self.stats,
                wake=self._wake,
                stopping=self._stopping,
                make_job=self._make_job,
                on_claimed=(lambda job: hooks.emit(hooks.job_claimed, job.ctx))
                if hooks.job_claimed
                else None,
                on_finished=self._finished,
            )
        )
        self.shutdown = Shutdown(
            cfg, self.db, self.board, self.completer, self.stats, self._wake, self._finished
        )

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
        started = False
        database_check: DatabaseCheck | None = None
        try:
            self._run_thread = threading.current_thread()
            if self.config.job_logs:
                capture_job_logs()
            if self.config.health_port is not None:
                database_check = DatabaseCheck(self.engine)
                self.health = self._health_server(database_check)
                self.health.start()
            known = self._prepare()
            if known is None:  # stopped while waiting for the database
                return self.stats
            started = True
            self._start_threads()
            self._running = True
            cfg = self.config
            log.info(
                "worker %s started: queues=%s concurrency=%d batch=%d max_batch=%s lease=%ss%s",
                cfg.worker_id,
                ",".join(cfg.queues) if cfg.queues else "*",
                cfg.concurrency,
                cfg.batch,
                cfg.max_batch or "auto",
                cfg.lease,
                " poll-only" if cfg.poll_only else "",
            )
            missing = sorted(set(cfg.queues or ()) - known)
            if missing:  # a typo in -q would otherwise wait silently forever
                log.warning(
                    "no queue named %s (a typo? `sqla-queue queues create NAME` creates one)",
                    ", ".join(repr(name) for name in missing),
                )
            hooks = self.registry.hooks
            scheduler = None
            if self.registry.schedules:  # the periodic tasks' slots, enqueued as they fall due
                scheduler = Scheduler(self.registry, self.engine, self.config.worker_id)
                scheduler.start()
            try:
                hooks.emit(hooks.worker_started, self)
                self.producer.run()
            finally:
                if scheduler is not None:
                    scheduler.stop()
            hooks.emit(hooks.worker_stopping, self)
            self.shutdown.drain()
        finally:
            self._running = False
            if self.health is not None:
                self.health.stop()
                self.health = None
            if database_check is not None:
                database_check.dispose()
            self._stop_threads()
            if started:
                self.keeper.rollup.tick(self.engine, force=True)  # the last minute's
                self._deregister()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.db.close()
        log.info("worker %s stopped: %s", self.config.worker_id, self.stats)
        return self.stats

    # -- parts ------------------------------------------------------------------------------

    def _prepare(self) -> set[str] | None:
        """Connect, check the schema, register; retried while the connection is lost (a
        database restarting, a terminated session). Returns the names of the queues."""
        delays = backoff_delays()
        while True:
            conn = self.db.connect()
            if conn is None or self._stopping.is_set():
                return None
            try:
                check_schema(conn)
                newer = newer_expand_revisions(conn)
                if newer and not self._said_newer_schema:  # an older, compatible build
                    self._said_newer_schema = True
                    log.warning(
                        "worker %s was built for schema %s; the database is at newer, "
                        "expand-only revision(s) %s, which this code works with: running "
                        "(upgrade this worker's sqla-queue when you can)",
                        self.config.worker_id,
                        SCHEMA_REVISION,
                        ", ".join(newer),
                    )
                known = {row["name"] for row in conn.execute(queries.queue_settings()).mappings()}
                self.keeper.register(conn)
                self.db.failures.recovered()
                return known
            except DBAPIError as exc:
                if not waitable(exc):
                    raise
                self.db.close()
                self.db.failures.failed(
                    "start",
                    "could not start on the database (%s); retrying",
                    describe(exc),
                )
                self.db.pulse.idle()
                self._stopping.wait(next(delays))
                self.db.pulse.busy()

    def _make_job(self, row: Any, columns: ClaimColumns) -> ClaimedJob:
        return ClaimedJob(row, columns, self._context_parts)

    def _beat_one(self, ctx: JobContext) -> bool:
        for job in self.board.find(ctx.job_id):
            if job.ctx is ctx:
                return self.keeper.beat_one(job)
        return False

    def _finished(self, outcome: Outcome) -> None:
        self.executor.runner.finished(outcome)

    def _on_notify(self) -> None:
        self.producer.on_notify()

    def _on_cancel(self, job_ids: list[int]) -> None:
        """A NOTIFY from `admin.cancel_jobs`: tell the handlers of the jobs we hold."""
        for job_id in job_ids:
            for job in self.board.find(job_id):
                self.executor.give_up(job, "cancelled")

    def _start_threads(self) -> None:
        cfg = self.config
        for _ in range(cfg.concurrency):
            self.executor.start_thread()
        if any(self.registry[name].is_async for name in self.registry):
            self.executor.loop()
        if not cfg.poll_only:
            self._listener = Listener(
                self.engine,
                cfg.queues,
                self._on_notify,
                self._on_cancel,
                pulse=self._listener_pulse,
            )
            self._listener.start()
            listener = self._listener
            self.keeper.session_pid = lambda: listener.backend_pid
        self.keeper.start()

    def _stop_threads(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.stop()
        self.keeper.stop()
        self.board.close()  # idle handler threads exit; busy ones once their job returns
        self.executor.stop_loop()

    def _deregister(self) -> None:
        try:
            with autocommit_read_committed(self.engine) as conn:
                self.keeper.deregister(conn)
        except Exception as exc:  # it expires by itself within dead_after seconds
            log.warning("could not remove this worker's registration: %s", describe(exc))

    # -- health ---------------------------------------------------------------------------

    def _health_server(self, database: DatabaseCheck) -> HealthServer:
        cfg = self.config
        assert cfg.health_port is not None
        loops: dict[str, tuple[Pulse, ThreadOf]] = {
            "producer": (self.db.pulse, lambda: self._run_thread),
            "keeper": (self.keeper.pulse, lambda: self.keeper.thread),
        }
        if not cfg.poll_only:
            loops["listener"] = (
                self._listener_pulse,
                lambda: self._listener.thread if self._listener is not None else None,
            )
        checks = WorkerHealth(
            loops,
            cfg.health_stuck_after,
            database,
            lambda: self.executor.loop_lag() if self.executor.has_loop else None,
            self._state,
            lambda: self.keeper.schema_refusal,
        )
        return HealthServer(
            cfg.health_host,
            cfg.health_port,
            checks.livez,
            checks.readyz,
            extra={"/scaling": database.scaling},
        )

    def _state(self) -> str:
        if self._stopping.is_set():
            return "stopping"
        return "running" if self._running else "starting"

    # -- signals ----------------------------------------------------------------------------

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
        exit_now(self.engine, self.board)
