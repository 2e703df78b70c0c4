"""OpenTelemetry spans for enqueues and job executions (`pip install 'sqla-queue[otel]'`).

    from sqla_queue.contrib import tracing
    tracing.instrument(registry)    # before enqueueing and before the Worker is built

- an insert hook opens a span per enqueued job (`enqueue TASK`, kind PRODUCER), a child of
  whatever span is current where the job is enqueued (a web request), and writes the
  span's context into the job's `meta` (W3C `traceparent`, under the key `otel`);
- a middleware wraps every execution in a span (`run TASK`, kind CONSUMER) whose parent is
  the context read back from the job's `ctx.meta`, so one trace goes from the request to
  the handler.
  Spans the handler opens on its thread are children of it; an exception marks it failed.

The insert hook runs wherever the registry is in force: its tasks' `.enqueue`, or every
enqueue path once it is the default registry (`set_default_registry`). Spans go to the
tracer provider given, else the global one the application configured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from sqla_queue.errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

    from sqla_queue.job.context import JobContext
    from sqla_queue.job.new_job import NewJob
    from sqla_queue.registry import Registry

META_KEY = "otel"
"""The key in a job's `meta` that holds its enqueuer's trace context."""
SYSTEM = "sqla_queue"


def _sqla_queue_version() -> str:
    try:
        return version("sqla-queue")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0"


class Tracing:
    """The insert hook and the middleware of one tracer."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def on_insert(self, job: NewJob) -> None:
        """Open and close the enqueue span; carry its context in the job's meta."""
        from opentelemetry import propagate, trace

        with self.tracer.start_as_current_span(
            f"enqueue {job.task}",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.destination.name": str(job.queue),
                "sqla_queue.task": str(job.task),
            },
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if carrier and isinstance(job.meta, dict):
                job.meta[META_KEY] = carrier

    def middleware(self, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        """Run the job inside its span, a child of the enqueuer's context when it has one."""
        from opentelemetry import propagate, trace

        carrier = ctx.meta.get(META_KEY)
        parent = propagate.extract(carrier) if isinstance(carrier, Mapping) else None
        with self.tracer.start_as_current_span(
            f"run {ctx.task}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": ctx.queue,
                "messaging.message.id": str(ctx.job_id),
                "sqla_queue.task": ctx.task,
                "sqla_queue.attempt": ctx.attempt,
            },
        ):
            return call_next()


def instrument(registry: Registry, tracer_provider: TracerProvider | None = None) -> Tracing:
    """Trace `registry`'s enqueues and executions (once per registry)."""
    try:
        from opentelemetry import trace
    except ImportError:
        raise ConfigurationError(
            detail="tracing needs the opentelemetry-api package: pip install 'sqla-queue[otel]'"
        ) from None
    for mw in registry.middleware:
        existing = getattr(mw, "__self__", None)
        if isinstance(existing, Tracing):
            return existing
    tracing = Tracing(
        trace.get_tracer("sqla_queue", _sqla_queue_version(), tracer_provider=tracer_provider)
    )
    registry.on_insert(tracing.on_insert)
    registry.middleware.insert(0, tracing.middleware)
    return tracing
