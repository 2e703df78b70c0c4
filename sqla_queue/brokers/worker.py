"""The broker worker: the same `Registry` and handlers, run from a routed queue's broker.

`sqla-queue worker --app mod:registry -q QUEUE --from nats://...|amqp://...` reads QUEUE's
route from PostgreSQL, then consumes it. Each message runs through the job core's
`JobRunner.run_job`, as the table worker's jobs do (middleware, timeouts, `Snooze`, the
lifecycle hooks, so `log_jobs` and `metrics.instrument` see broker jobs too); this module
answers the broker with the outcome: ack a success; deliver a retry again after the task's
retry delay; deliver a snoozed job, or one whose task this worker does not know, again
after its delay without counting the attempt; past the job's max attempts (its own, else
the task's, else 5), move it to the route's dead-letter place and record it in
PostgreSQL's jobs table as `failed`. A message that arrives more times than max attempts
allows (its workers kept dying) is dead-lettered without running. A handler that overruns
its task's timeout is told (`ctx.cancelled`, an async one cancelled) and keeps its slot
until it returns; the job then times out by the retry rules.

A broker job has no row in PostgreSQL while it runs, so no result is kept for it
(`keep_result` is ignored, with a warning once per task: `wait_for` raises
`ResultMissingError` for it) and `ctx.session()` raises `ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from sqla_queue.brokers.kinds import BROKER_KINDS, broker_kind, parse_route
from sqla_queue.brokers.loop import BrokerLoop
from sqla_queue.brokers.messages import JobMessage
from sqla_queue.brokers.routes import Route, redact
from sqla_queue.brokers.transport import Delivery, Source
from sqla_queue.db.migrate import check_schema
from sqla_queue.db.queries import brokers as queries
from sqla_queue.db.rollup import RollupWriter
from sqla_queue.errors import ConfigurationError, UnknownQueueError
from sqla_queue.job.context import JobContext
from sqla_queue.job.outcome import JobAttempt, Outcome, OutcomeKind
from sqla_queue.job.run import JobRunner, max_attempts_of, resources_of

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from sqla_queue.registry import Registry

log = logging.getLogger("sqla_queue.brokers.worker")

_ALREADY_DONE = queries.already_done()
_MARK_DONE = queries.mark_done()
DEDUP_PRUNE_EVERY = 600.0
"""Seconds between deletions of de-duplication records older than `dedup_retention`."""
DEFER_UNKNOWN_TASK = 60.0
"""Seconds until a job whose task this worker has no handler for is delivered again (its
attempt not counted): a worker that has the task may take it meanwhile."""


@dataclass
class BrokerWorkerConfig:
    """How a broker worker runs; the CLI fills it from `sqla-queue worker --from ...`."""

    broker_url: str
    queue: str
    concurrency: int = 4
    ack_wait: float = 60.0
    """NATS ack wait: seconds without an ack or in-progress signal before redelivery."""
    poll_interval: float = 1.0
    burst: bool = False
    """Exit once the route has nothing pending and no handler runs."""
    shutdown_timeout: float = 30.0
    dedup: bool | None = None
    """Skip job ids already run (table broker_done); None: on for RabbitMQ, off for NATS,
    whose publish-side de-duplication already keeps one copy per job."""
    record_failed: bool = True
    """Also write dead-lettered jobs into PostgreSQL's jobs table as `failed`."""
    dedup_retention: float = 7 * 86400.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError(
                detail=f"concurrency must be at least 1, got {self.concurrency}"
            )
        if self.ack_wait <= 0:
            raise ConfigurationError(detail=f"ack_wait must be positive, got {self.ack_wait}")


@dataclass
class BrokerWorkerStats:
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    duplicates: int = 0
    snoozed: int = 0
    """Snoozed jobs, and jobs of a task this worker has no handler for (deferred)."""


def _no_session(ctx: JobContext) -> Session:
    raise ConfigurationError(
        detail=f"job {ctx.job_id} ({ctx.task}) came from a broker: it has no row in "
        "PostgreSQL for ctx.session() to finish; open a Session of your own, or run the "
        "queue without a route (the table worker) to commit work and job together"
    )


def _no_parents(ctx: JobContext) -> list[Any]:
    raise ConfigurationError(
        detail=f"job {ctx.job_id} ({ctx.task}) came from a broker: it depends on no job "
        "(a job of a broker-routed queue cannot be part of a workflow), so it has no "
        "ctx.parent_results(); run the workflow in queues without a route (the table worker)"
    )


class BrokerWorker(BrokerLoop):
    """Runs a routed queue's jobs from NATS JetStream or RabbitMQ."""

    def __init__(self, engine: Engine, registry: Registry, config: BrokerWorkerConfig) -> None:
        super().__init__()
        self.engine = engine
        self.registry = registry
        self.config = config
        self.kind = broker_kind(config.broker_url)
        self.route = self._read_route()
        self.dedup = config.dedup if config.dedup is not None else BROKER_KINDS[self.kind].dedup
        self.stats = BrokerWorkerStats()
        self._executor = ThreadPoolExecutor(config.concurrency, thread_name_prefix="sqla-queue-job")
        self._running_ids: set[int] = set()
        """Jobs whose handler runs in this worker: a copy that arrives meanwhile is a duplicate."""
        self.resources = resources_of(registry, {})
        self.runner = JobRunner(registry, self._event_loop, self._watch_deadline)
        self.rollup = RollupWriter(self.runner.counts)
        self._timers: dict[tuple[int, int], asyncio.TimerHandle] = {}
        """The timeout of each running job that has one, by (id, attempt)."""
        self._results_warned: set[str] = set()

    def _read_route(self) -> Route:
        with self.engine.connect() as conn:
            check_schema(conn)
            row = conn.execute(queries.queue_route(), {"queue_name": self.config.queue}).first()
        if row is None:
            raise UnknownQueueError(queue=self.config.queue)
        if row[0] is None:
            raise ConfigurationError(
                detail=f"queue {self.config.queue!r} has no route, so its jobs stay in "
                f"PostgreSQL: drop --from, or route it with `sqla-queue queues set "
                f"{self.config.queue} --route nats:SUBJECT`"
            )
        route = parse_route(str(row[0]))
        if route.kind != self.kind:
            raise ConfigurationError(
                detail=f"queue {self.config.queue!r} routes to {route}, but --from is a "
                f"{self.kind} URL; pass a {route.kind}:// URL"
            )
        return route

    def _source(self) -> Source:
        config = self.config
        source = BROKER_KINDS[self.kind].source
        return source(config.broker_url, self.route, config.ack_wait, config.concurrency)

    def run(self, install_signal_handlers: bool | None = None) -> BrokerWorkerStats:
        """Consume until SIGTERM/SIGINT (or, with burst, until nothing is pending)."""
        try:
            self._run_loop(install_signal_handlers)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)
        return self.stats

    async def _main(self) -> None:
        source = self._source()
        await source.connect()
        log.info(
            "broker worker %s started: queue %r from %s at %s (concurrency %d)",
            os.getpid(),
            self.config.queue,
            self.route,
            redact(self.config.broker_url),
            self.config.concurrency,
        )
        prune = asyncio.ensure_future(self._prune_dedup()) if self.dedup else None
        counts = asyncio.ensure_future(self._write_counts())
        running: set[asyncio.Task[None]] = set()
        try:
            await self._consume(source, running)
            if running:
                log.info(
                    "waiting up to %ss for %d job(s)", self.config.shutdown_timeout, len(running)
                )
                _, late = await asyncio.wait(running, timeout=self.config.shutdown_timeout)
                for job in late:  # unacked: the broker delivers it again
                    job.cancel()
        finally:
            if prune is not None:
                prune.cancel()
            counts.cancel()
            await asyncio.to_thread(self.rollup.tick, self.engine, True)
            await source.close()

    async def _consume(self, source: Source, running: set[asyncio.Task[None]]) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            free = self.config.concurrency - len(running)
            if free <= 0:
                stop = asyncio.ensure_future(self._stopping.wait())
                await asyncio.wait({*running, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                continue
            deliveries = await source.fetch(free, timeout=self.config.poll_interval)
            for delivery in deliveries:
                job = asyncio.ensure_future(self._process(delivery))
                running.add(job)
                job.add_done_callback(running.discard)
            idle = not deliveries and not running
            if idle and self.config.burst and await source.pending() == 0:
                return

    # -- one message -----------------------------------------------------------------------

    async def _process(self, delivery: Delivery) -> None:
        try:
            await self._settle(delivery)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the broker or the database failed: it is delivered again
            log.warning("could not settle a message (%r); the broker will deliver it again", exc)

    async def _settle(self, delivery: Delivery) -> None:
        try:
            job = JobMessage.decode(delivery.body)
        except ValueError as exc:
            log.error("%s: moved to the dead-letter place", exc)
            await delivery.dead(str(exc))
            self.stats.failed += 1
            return
        if delivery.due_in is not None:  # a snoozed copy, early: back until it is due
            await delivery.hold()
            return
        attempt = job.attempts + delivery.deliveries
        limit = max_attempts_of(job.max_attempts, self.registry.get(job.task))
        if attempt > limit:
            error = (
                f"delivered {delivery.deliveries} times, more than its {limit} attempts: its "
                "workers died or lost the broker before acking"
            )
            await self._give_up(delivery, job, attempt, limit, error)
            return
        if self.dedup and job.id in self._running_ids:
            await self._skip_duplicate(delivery, job)
            return
        self._running_ids.add(job.id)  # before any await: a copy arriving now sees it
        try:
            if self.dedup and await asyncio.to_thread(self._seen, job.id):
                await self._skip_duplicate(delivery, job)
                return
            ctx = JobContext(
                job.id,
                job.task,
                job.queue,
                attempt,
                resources=self.resources,
                session_factory=_no_session,
                parent_results=_no_parents,
            )
            run = JobAttempt(ctx, job.args, job.max_attempts)
            self.runner.claimed(ctx)
            outcome = await self._run_keeping_alive(delivery, run)
            if outcome.kind is OutcomeKind.succeeded and self.dedup:
                await asyncio.to_thread(self._mark_done, job.id)
        finally:
            self._running_ids.discard(job.id)
        self.runner.finished(outcome)  # before the outcome is visible: hooks run first
        await self._answer(delivery, job, outcome, limit)

    async def _answer(
        self, delivery: Delivery, job: JobMessage, outcome: Outcome, limit: int
    ) -> None:
        """Tell the broker how the attempt ended."""
        kind = outcome.kind
        if kind is OutcomeKind.succeeded:
            if outcome.result is not None:
                self._warn_no_result(job.task)
            await delivery.ack()
            self.stats.succeeded += 1
        elif kind in (OutcomeKind.snoozed, OutcomeKind.deferred):
            delay = outcome.retry_in if kind is OutcomeKind.snoozed else DEFER_UNKNOWN_TASK
            await delivery.snooze(delay or 0.0)
            self.stats.snoozed += 1
        elif kind in (OutcomeKind.retried, OutcomeKind.timed_out) and outcome.retry_in is not None:
            await delivery.retry(outcome.retry_in)
            self.stats.retried += 1
        elif kind in (OutcomeKind.failed, OutcomeKind.timed_out):
            await self._give_up(delivery, job, outcome.job.attempt, limit, outcome.error)
        else:  # given up on at shutdown: unanswered, the broker delivers it again
            log.info("job %s (%s) %s: left to the broker", job.id, job.task, kind.value)

    def _warn_no_result(self, task: str) -> None:
        if task in self._results_warned:
            return
        self._results_warned.add(task)
        log.warning(
            "task %s keeps its result, but a job run from a broker has no row in PostgreSQL "
            "to keep it in: its result is dropped (wait_for raises ResultMissingError); run "
            "its queue without a route to keep results",
            task,
        )

    async def _skip_duplicate(self, delivery: Delivery, job: JobMessage) -> None:
        log.info("job %s already ran or runs here: a duplicate, acked without running", job.id)
        await delivery.ack()
        self.stats.duplicates += 1

    async def _run_keeping_alive(self, delivery: Delivery, run: JobAttempt) -> Outcome:
        """Run the attempt on a handler thread, telling the broker meanwhile that the job is
        being worked on; a handler past its timeout keeps its thread until it returns."""
        loop = asyncio.get_running_loop()
        handler = loop.run_in_executor(self._executor, self.runner.run_job, run)
        try:
            while True:
                done, _ = await asyncio.wait({handler}, timeout=self.config.ack_wait / 3)
                if done:
                    return handler.result()
                await delivery.keep_alive()
        except asyncio.CancelledError:  # shutdown gave up on it: tell the handler
            self.runner.give_up(run, "lost", loop)
            raise
        finally:
            timer = self._timers.pop(run.key, None)
            if timer is not None:
                timer.cancel()

    # -- the job core's callbacks ------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """Where async handlers run: this worker's own loop (handler threads wait)."""
        if self._loop is None:
            raise RuntimeError("the broker worker's event loop is not running")
        return self._loop

    def _watch_deadline(self, run: JobAttempt, deadline: float) -> None:
        """Called on the handler thread as a timed handler starts: time it out at `deadline`."""
        run.deadline = deadline
        self._event_loop().call_soon_threadsafe(self._arm_timeout, run, deadline)

    def _arm_timeout(self, run: JobAttempt, deadline: float) -> None:
        if run.id not in self._running_ids:  # it returned already
            return
        delay = max(deadline - time.monotonic(), 0.0)
        self._timers[run.key] = self._event_loop().call_later(delay, self._time_out, run)

    def _time_out(self, run: JobAttempt) -> None:
        self._timers.pop(run.key, None)
        log.warning(
            "job %s (%s) timed out; it keeps its slot until its handler returns", run.id, run.task
        )
        self.runner.give_up(run, "timed out", self._loop)

    async def _give_up(
        self, delivery: Delivery, job: JobMessage, attempt: int, limit: int, error: str
    ) -> None:
        log.error(
            "job %s (%s) failed for good after attempt %d: dead-lettered", job.id, job.task, attempt
        )
        if self.config.record_failed:
            await asyncio.to_thread(self._record_failed, job, attempt, limit, error)
        await delivery.dead(error)
        self.stats.failed += 1

    # -- PostgreSQL ------------------------------------------------------------------------

    def _seen(self, job_id: int) -> bool:
        with self.engine.connect() as conn:
            return bool(conn.execute(_ALREADY_DONE, {"job_id": job_id}).scalar())

    def _mark_done(self, job_id: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(_MARK_DONE, {"job_id": job_id})

    def _record_failed(self, job: JobMessage, attempt: int, limit: int, error: str) -> None:
        params = {
            "job_id": job.id,
            "job_queue": job.queue,
            "job_task": job.task,
            "job_args": job.args,
            "job_attempts": attempt,
            "job_max_attempts": limit,
            "job_error": error,
        }
        with self.engine.begin() as conn:
            conn.execute(queries.record_failed(), params)

    async def _prune_dedup(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._prune_once)
            except Exception as exc:
                log.warning("could not prune de-duplication records: %r", exc)
            await asyncio.sleep(DEDUP_PRUNE_EVERY)

    async def _write_counts(self) -> None:
        """The rollup of the attempts ended here (`sqla_queue.job.counts`), written about
        once a minute (it never raises: a failed write waits for the next)."""
        while True:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(self.rollup.tick, self.engine)

    def _prune_once(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(queries.prune_done(), {"older_than": self.config.dedup_retention})

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            log.info(
                "received %s: finishing in-flight jobs (up to %ss); send again to exit now",
                name,
                self.config.shutdown_timeout,
            )
            self.stop()
            return
        log.warning("received %s again: exiting now (unacked jobs are delivered again)", name)
        os._exit(1)
