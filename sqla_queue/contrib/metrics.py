"""Prometheus metrics for workers (`pip install 'sqla-queue[metrics]'`).

    from sqla_queue.contrib.metrics import instrument, serve
    instrument(registry)     # before the Worker is built: adds middleware and hooks
    serve(9100)              # or: sqla-queue worker --metrics-port 9100

Everything is measured on the worker's public seams, never inside it:
- middleware: handler duration;
- lifecycle hooks: jobs claimed, finished by outcome, held (claimed and not yet settled),
  durable steps run and replayed (`ctx.steps_run`, `ctx.steps_replayed`);
- SQLAlchemy events on the worker's engine: the latency of the claim and finishing
  statements (recognised by their cache key), disconnects and reconnects;
- a timer thread per worker, started by `on_worker_started`: queue depth and the oldest due
  job's age (one query on queued and running rows every `depth_interval` seconds), the
  deepest partitions of fair and partition-limited queues, the sequences held by a failed
  job and the aged jobs of aging queues (`sqla_queue.admin.partitions`), and the worker's
  heartbeat lag and its overrunning handlers (past their timeout or cancel, not yet
  returned) read back from `sqla_queue.workers`.

Labels are bounded: queue, task (a name the registry does not know is "unknown"), outcome,
statement, and partition for the `partition_top` deepest partitions of each fair or
partition-limited queue only (a partition that leaves the top is removed, not kept at 0);
never a job id. Every worker process exports the same queue gauges: aggregate
them with `max by (queue)`, not `sum`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, event

from sqla_queue.db.queries import (
    claim_jobs,
    complete_and_claim,
    complete_jobs,
    fail_jobs,
    heartbeat_jobs,
    release_jobs,
    retry_jobs,
)
from sqla_queue.db.queries import partitions as partition_queries
from sqla_queue.db.queries.dashboard import NO_JIT
from sqla_queue.db.queries.metrics import heartbeat_lag, queue_depth, worker_overruns
from sqla_queue.db.queries.signals import waiting_for_signals
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.states import CLAIMED, COUNTED, UNFINISHED
from sqla_queue.job.validation import check_count
from sqla_queue.worker.connection import STATEMENT_KIND

_DEPTH_STATUSES = tuple(name for name in COUNTED if name in UNFINISHED or name == CLAIMED)
"""The statuses `sqla_queue_queue_jobs` counts per queue (`queries.metrics.queue_depth`):
the unfinished ones of the states table, with `claimed` (held, not started) apart from
`running`."""

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from sqla_queue.job.context import JobContext
    from sqla_queue.job.outcome import Outcome
    from sqla_queue.registry import Registry
    from sqla_queue.worker import Worker

log = logging.getLogger("sqla_queue.metrics")

INSTALL_HINT = "pip install 'sqla-queue[metrics]'"
DEPTH_INTERVAL = 15.0
"""Seconds between two queue depth queries of one worker process."""
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
STATEMENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
UNKNOWN_TASK = "unknown"
PARTITION_TOP = 10
"""Partitions per fair or partition-limited queue exported (the deepest)."""
HELD_CAP = 10_000
"""Held sequences one refresh reads at most (the counts stop there)."""
NO_PARTITION = ""
"""The `partition` label of the jobs without a partition."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            detail=f"metrics need the prometheus_client package: {INSTALL_HINT}"
        ) from None
    return prometheus_client


class QueueMetrics:
    """The worker metrics, registered in one Prometheus `CollectorRegistry`."""

    def __init__(
        self,
        prometheus_registry: CollectorRegistry | None = None,
        *,
        depth_interval: float = DEPTH_INTERVAL,
        partition_top: int = PARTITION_TOP,
    ) -> None:
        if not depth_interval > 0:
            raise ConfigurationError(
                detail=f"depth_interval must be positive, got {depth_interval}"
            )
        prom = _prometheus()
        self.prometheus_registry = reg = prometheus_registry or prom.REGISTRY
        self.depth_interval = depth_interval
        check_count("partition_top", partition_top)
        self.partition_top = partition_top
        job = ["queue", "task"]
        counter = functools.partial(prom.Counter, registry=reg)
        gauge = functools.partial(prom.Gauge, registry=reg)
        histogram = functools.partial(prom.Histogram, registry=reg)
        self.claimed = counter("sqla_queue_jobs_claimed", "Jobs claimed by this worker.", job)
        self.finished = counter(
            "sqla_queue_jobs_finished",
            "Claimed jobs settled by this worker, by outcome (succeeded, retried, failed, "
            "timed_out, cancelled, lost, released, snoozed, deferred: put back for a worker "
            "that has a handler for the task).",
            [*job, "outcome"],
        )
        self.held = gauge(
            "sqla_queue_jobs_held", "Jobs claimed by this worker and not yet settled."
        )
        self.steps = counter(
            "sqla_queue_steps",
            "Durable steps (ctx.step) of the jobs this worker settled: run (ran and "
            "recorded) or replayed (their recorded result returned without running).",
            [*job, "how"],
        )
        self.handler_duration = histogram(
            "sqla_queue_handler_duration_seconds",
            "Time in the handler and its middleware, per execution.",
            job,
            buckets=HANDLER_BUCKETS,
        )
        self.statement_duration = histogram(
            "sqla_queue_statement_duration_seconds",
            "Latency of the worker's claim and finishing statements.",
            ["statement"],
            buckets=STATEMENT_BUCKETS,
        )
        self.disconnects = counter(
            "sqla_queue_db_disconnects",
            "Database connections of the worker's engine found broken.",
        )
        self.reconnects = counter(
            "sqla_queue_db_reconnects",
            "Connections opened to replace one found broken.",
        )
        self.heartbeat_lag = gauge(
            "sqla_queue_worker_heartbeat_lag_seconds",
            "Seconds since this worker's registration was last beaten, as the database sees it.",
        )
        self.queue_jobs = gauge(
            "sqla_queue_queue_jobs",
            "Unfinished jobs per queue: status queued (due or not), running (handler started), "
            "claimed (held by a worker, not started), or waiting (for the jobs it depends on).",
            ["queue", "status"],
        )
        self.queue_due = gauge(
            "sqla_queue_queue_due_jobs",
            "Queued jobs whose run_at has come.",
            ["queue"],
        )
        self.oldest_due = gauge(
            "sqla_queue_queue_oldest_due_job_age_seconds",
            "How long the oldest due queued job has been due (0: none is).",
            ["queue"],
        )
        self.overrunning = gauge(
            "sqla_queue_worker_overrunning_handlers",
            "Handlers of this worker past their timeout or cancel that have not returned "
            "(each keeps its slot), as of its last heartbeat.",
            ["queue", "task"],
        )
        self.longest_overrun = gauge(
            "sqla_queue_worker_longest_overrun_seconds",
            "How long the longest-overrunning handler of this worker has been past its "
            "timeout or cancel (0: none is).",
        )
        self.partition_jobs = gauge(
            "sqla_queue_partition_jobs",
            "Queued and running jobs of the deepest partitions (by queued jobs) of each fair "
            'or partition-limited queue; partition "" is the jobs without one.',
            ["queue", "partition", "status"],
        )
        self.held_sequences = gauge(
            "sqla_queue_queue_held_sequences",
            "Sequences held by a failed job (nothing after it in the sequence runs until it "
            "is retried or deleted), per queue of the failed job.",
            ["queue"],
        )
        self.held_behind = gauge(
            "sqla_queue_queue_held_sequence_waiting_jobs",
            "Queued jobs waiting behind a sequence held by a failed job, per queue of the "
            "failed job.",
            ["queue"],
        )
        self.longest_held = gauge(
            "sqla_queue_queue_longest_held_sequence_seconds",
            "How long the longest-held sequence of the queue has been held by a failed job "
            "(0: none is).",
            ["queue"],
        )
        self.aged = gauge(
            "sqla_queue_queue_aged_jobs",
            "Due jobs of an aging queue whose priority aging has improved (waited at least "
            "one interval).",
            ["queue"],
        )
        self.signal_waiting = gauge(
            "sqla_queue_queue_signal_waiting_jobs",
            "Jobs parked by ctx.wait_for_signal (status waiting, holding no slot) per queue: "
            "each runs again when its signal is sent or its timeout passes.",
            ["queue"],
        )
        self.refresh_errors = counter(
            "sqla_queue_metrics_refresh_errors",
            "Queue depth or heartbeat lag queries that failed.",
        )
        self._lock = threading.Lock()
        self._broken = 0
        self._queues: set[str] = set()
        self._overrun_labels: set[tuple[str, str]] = set()
        self._partition_labels: set[tuple[str, str]] = set()
        self._held_queues: set[str] = set()
        self._aged_queues: set[str] = set()
        self._signal_queues: set[str] = set()
        self._engines: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._timers: dict[int, threading.Event] = {}
        self._statements: dict[Any, str] = {}
        self._registries: list[Registry] = []

    # -- installation -----------------------------------------------------------------------

    def install(self, registry: Registry) -> QueueMetrics:
        """Add this object's middleware and lifecycle hooks to `registry` (once)."""
        if self._time_handler in registry.middleware:
            return self
        self._registries.append(registry)
        registry.middleware.insert(0, self._time_handler)
        registry.on_job_claimed(self._claimed)
        registry.on_job_finished(self._finished)
        registry.on_worker_started(self._worker_started)
        registry.on_worker_stopping(self._worker_stopping)
        return self

    def watch_engine(self, engine: Engine, queues: Any = None) -> None:
        """Time the claim and finishing statements on `engine`; count its reconnects."""
        for kind, statement in (
            ("claim", claim_jobs(queues)),
            ("complete_and_claim", complete_and_claim(queues)),
            ("complete", complete_jobs()),
            ("retry", retry_jobs()),
            ("fail", fail_jobs()),
            ("release", release_jobs()),
            ("heartbeat", heartbeat_jobs()),
        ):
            # The worker names its claim and completion (compiled text) by an execution
            # option; these keys find the same statements run through SQLAlchemy.
            key = statement._generate_cache_key()
            if key is not None:
                self._statements[key.key] = kind
        if engine in self._engines:
            return
        self._engines.add(engine)
        event.listen(engine, "before_cursor_execute", self._before_execute)
        event.listen(engine, "after_cursor_execute", self._after_execute)
        event.listen(engine, "handle_error", self._on_error)
        event.listen(engine, "connect", self._on_connect)

    # -- middleware and hooks ---------------------------------------------------------------

    def _task(self, ctx: JobContext) -> str:
        return self._task_name(ctx.task)

    def _task_name(self, task: str) -> str:
        known = any(task in registry for registry in self._registries)
        return task if known else UNKNOWN_TASK

    def _time_handler(self, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return call_next()
        finally:
            self.handler_duration.labels(ctx.queue, self._task(ctx)).observe(
                time.perf_counter() - started
            )

    def _claimed(self, ctx: JobContext) -> None:
        self.claimed.labels(ctx.queue, self._task(ctx)).inc()
        self.held.inc()

    def _finished(self, ctx: JobContext, outcome: Outcome) -> None:
        kind = outcome.kind.value.replace(" ", "_")
        self.finished.labels(ctx.queue, self._task(ctx), kind).inc()
        self.held.dec()
        if ctx.steps_run:
            self.steps.labels(ctx.queue, self._task(ctx), "run").inc(ctx.steps_run)
        if ctx.steps_replayed:
            self.steps.labels(ctx.queue, self._task(ctx), "replayed").inc(ctx.steps_replayed)

    def _worker_started(self, worker: Worker) -> None:
        self.watch_engine(worker.engine, worker.config.queues)
        stop = threading.Event()
        self._timers[id(worker)] = stop
        threading.Thread(
            target=self._refresh_loop,
            args=(worker.engine, worker.config.worker_id, stop),
            name="sqla-queue-metrics",
            daemon=True,
        ).start()

    def _worker_stopping(self, worker: Worker) -> None:
        stop = self._timers.pop(id(worker), None)
        if stop is not None:
            stop.set()

    # -- the timer --------------------------------------------------------------------------

    def _refresh_loop(self, engine: Engine, worker_id: str, stop: threading.Event) -> None:
        while True:
            self.refresh(engine, worker_id)
            if stop.wait(self.depth_interval):
                return

    def refresh(self, engine: Engine, worker_id: str | None = None) -> None:
        """Read queue depth (and `worker_id`'s heartbeat lag) now; log a failure, never raise."""
        try:
            with engine.connect() as conn:
                rows = conn.execute(queue_depth()).mappings().all()
                turns = self._read_turns(conn)
                parked: dict[str, int] = {q: int(n) for q, n in conn.execute(waiting_for_signals())}
                lag = overruns = None
                if worker_id is not None:
                    lag = conn.execute(heartbeat_lag(), {"worker_id": worker_id}).scalar()
                    overruns = conn.execute(worker_overruns(), {"worker_id": worker_id}).scalar()
        except Exception as exc:
            self.refresh_errors.inc()
            log.warning("metrics: reading queue depth failed: %s", str(exc).splitlines()[0])
            return
        with self._lock:
            seen = set()
            for row in rows:
                queue = row["queue"]
                seen.add(queue)
                for status in _DEPTH_STATUSES:
                    self.queue_jobs.labels(queue, status).set(row[status])
                self.queue_due.labels(queue).set(row["due"])
                self.oldest_due.labels(queue).set(float(row["oldest_due_seconds"] or 0))
            for queue in self._queues - seen:  # emptied since the last read: zero, not stale
                for status in _DEPTH_STATUSES:
                    self.queue_jobs.labels(queue, status).set(0)
                self.queue_due.labels(queue).set(0)
                self.oldest_due.labels(queue).set(0)
            self._queues |= seen
            self._set_turns(*turns)
            for queue in self._signal_queues - parked.keys():  # none parked there any more
                self.signal_waiting.labels(queue).set(0)
            for queue, count in parked.items():
                self.signal_waiting.labels(queue).set(int(count))
            self._signal_queues |= parked.keys()
        if lag is not None:
            self.heartbeat_lag.set(max(0.0, float(lag)))
        if worker_id is not None:
            self._set_overruns(list(overruns or []))

    def _read_turns(self, conn: Connection) -> tuple[Sequence[Any], Sequence[Any], Sequence[Any]]:
        """The deepest partitions, the held sequences per queue and the aged jobs per queue:
        each read bounded (`partition_top` per queue, `HELD_CAP` held sequences)."""
        top = {"queue_names": None, "top": self.partition_top}
        # A subquery per held sequence looks costly to the planner: JIT would compile
        # for some 300 ms what runs in 30 (this transaction's only).
        conn.execute(NO_JIT)
        return (
            conn.execute(partition_queries.top_partitions(), top).all(),
            conn.execute(partition_queries.held_sequence_counts(), {"cap": HELD_CAP}).all(),
            conn.execute(partition_queries.aged_jobs()).all(),
        )

    def _set_turns(self, depths: Sequence[Any], held: Sequence[Any], aged: Sequence[Any]) -> None:
        """Set the partition, held sequence and aged job gauges (under `_lock`): a partition
        that left the top is removed, a queue whose figure went is set to 0."""
        labels = set()
        for queue, partition, queued, running in depths:
            key = (str(queue), NO_PARTITION if partition is None else str(partition))
            labels.add(key)
            self.partition_jobs.labels(*key, "queued").set(int(queued))
            self.partition_jobs.labels(*key, "running").set(int(running))
        for key in self._partition_labels - labels:
            for status in ("queued", "running"):
                self.partition_jobs.remove(*key, status)
        self._partition_labels = labels
        seen = set()
        for queue, count, longest, behind in held:
            seen.add(queue)
            self.held_sequences.labels(queue).set(int(count))
            self.longest_held.labels(queue).set(max(0.0, float(longest or 0)))
            self.held_behind.labels(queue).set(int(behind))
        for queue in self._held_queues - seen:
            for gauge in (self.held_sequences, self.longest_held, self.held_behind):
                gauge.labels(queue).set(0)
        self._held_queues |= seen
        counts = {str(queue): int(count) for queue, _, count in aged}
        for queue in self._aged_queues - counts.keys():
            self.aged.labels(queue).set(0)
        for queue, count in counts.items():
            self.aged.labels(queue).set(count)
        self._aged_queues |= counts.keys()

    def _set_overruns(self, overruns: list[dict[str, Any]]) -> None:
        counts: dict[tuple[str, str], int] = {}
        for overrun in overruns:
            key = (str(overrun.get("queue")), self._task_name(str(overrun.get("task"))))
            counts[key] = counts.get(key, 0) + 1
        with self._lock:
            for key in self._overrun_labels - counts.keys():  # returned since: zero
                self.overrunning.labels(*key).set(0)
            for key, count in counts.items():
                self.overrunning.labels(*key).set(count)
            self._overrun_labels |= counts.keys()
        self.longest_overrun.set(max((float(o.get("seconds") or 0) for o in overruns), default=0))

    # -- engine events ----------------------------------------------------------------------

    def _statement_kind(self, context: Any) -> str | None:
        named: str | None = context.execution_options.get(STATEMENT_KIND)
        if named is not None:  # the worker's compiled text (DriverStatement)
            return named
        compiled = getattr(context, "compiled", None)
        if compiled is None:
            return None
        key = compiled.cache_key
        if key is None:  # the engine's statement cache is off
            key = compiled.statement._generate_cache_key()
        return None if key is None else self._statements.get(key.key)

    def _before_execute(self, conn: Any, cursor: Any, statement: Any, *rest: Any) -> None:
        context = rest[1]
        kind = self._statement_kind(context)
        if kind is not None:
            conn.info.setdefault("sqla_queue_timings", []).append((kind, time.perf_counter()))

    def _after_execute(self, conn: Any, cursor: Any, statement: Any, *rest: Any) -> None:
        timings = conn.info.get("sqla_queue_timings")
        if timings and self._statement_kind(rest[1]) is not None:
            kind, started = timings.pop()
            self.statement_duration.labels(kind).observe(time.perf_counter() - started)

    def _on_error(self, context: Any) -> None:
        if context.connection is not None:
            context.connection.info.pop("sqla_queue_timings", None)
        if context.is_disconnect:
            self.disconnects.inc()
            with self._lock:
                self._broken += 1

    def _on_connect(self, dbapi_connection: Any, record: Any) -> None:
        with self._lock:
            if self._broken <= 0:
                return
            self._broken -= 1
        self.reconnects.inc()


_installed: dict[Any, QueueMetrics] = {}
"""The `QueueMetrics` of each Prometheus registry (held, so an id is never reused)."""


def instrument(
    registry: Registry,
    *,
    prometheus_registry: CollectorRegistry | None = None,
    depth_interval: float = DEPTH_INTERVAL,
) -> QueueMetrics:
    """Measure every worker that runs `registry` (call it before the `Worker` is built).

    The metrics go to `prometheus_registry` (default: prometheus_client's global one, so
    they are served beside your own). Calling it again with the same Prometheus registry
    returns the same `QueueMetrics`.
    """
    prom_registry = prometheus_registry or _prometheus().REGISTRY
    metrics = _installed.get(prom_registry)
    if metrics is None:
        metrics = QueueMetrics(prom_registry, depth_interval=depth_interval)
        _installed[prom_registry] = metrics
    return metrics.install(registry)


def serve(
    port: int, addr: str = "0.0.0.0", prometheus_registry: CollectorRegistry | None = None
) -> None:
    """Serve `/metrics` over HTTP on `addr:port` from a daemon thread."""
    prom = _prometheus()
    try:
        prom.start_http_server(port, addr=addr, registry=prometheus_registry or prom.REGISTRY)
    except OSError as exc:
        raise ConfigurationError(
            detail=f"cannot serve metrics on {addr}:{port} ({exc.strerror or exc}); "
            "pick a free port with --metrics-port"
        ) from None
