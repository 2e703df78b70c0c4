"""OpenTelemetry: spans per enqueue and per execution, seen by the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue
from sqla_queue.contrib import tracing
from sqla_queue.testing import drain, run_until_empty
from sqla_queue.worker import WorkerConfig


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_each_execution_has_a_span_and_a_failure_marks_it(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    registry = Registry()
    inner = provider.get_tracer("app")

    @registry.task(name="work")
    def work(n: int) -> None:
        with inner.start_as_current_span("handler step"):
            pass

    @registry.task(name="broken", max_attempts=1)
    def broken() -> None:
        raise ValueError("nope")

    tracing.instrument(registry, provider)
    with Session(engine) as session, session.begin():
        work.enqueue(session, {"n": 1})
        work.enqueue(session, {"n": 2})
        broken.enqueue(session)

    run_until_empty(engine, registry, WorkerConfig(poll_only=True))

    runs = spans_named(exporter, "run work")
    assert len(runs) == 2
    assert {span.kind for span in runs} == {SpanKind.CONSUMER}
    assert all(span.attributes is not None for span in runs)
    assert {span.attributes["sqla_queue.attempt"] for span in runs if span.attributes} == {1}
    assert {span.attributes["messaging.destination.name"] for span in runs if span.attributes} == {
        "default"
    }
    steps = spans_named(exporter, "handler step")
    assert len(steps) == 2
    run_ids = {span.context.span_id for span in runs if span.context}
    assert {step.parent.span_id for step in steps if step.parent} == run_ids
    (failed,) = spans_named(exporter, "run broken")
    assert failed.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in failed.events)
    assert len(spans_named(exporter, "enqueue work")) == 2
    (enqueued,) = spans_named(exporter, "enqueue broken")
    assert enqueued.kind is SpanKind.PRODUCER


def test_the_enqueue_span_is_a_child_of_the_current_span(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    registry = Registry()
    task = registry.task(name="work")(lambda: None)
    tracing.instrument(registry, provider)
    assert tracing.instrument(registry, provider) is tracing.instrument(registry)
    request = provider.get_tracer("web")
    with (
        request.start_as_current_span("POST /orders") as span,
        Session(engine) as session,
        session.begin(),
    ):
        task.enqueue(session)
    (enqueued,) = spans_named(exporter, "enqueue work")
    assert enqueued.parent is not None
    assert enqueued.parent.span_id == span.get_span_context().span_id
    assert trace.get_current_span() is trace.INVALID_SPAN


@pytest.mark.parametrize("runner", ["worker", "drain"])
def test_one_trace_goes_from_the_enqueuing_request_to_the_handler(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter, runner: str
) -> None:
    registry = Registry()
    app = provider.get_tracer("app")

    @registry.task(name="send")
    def send(to: str) -> None:
        with app.start_as_current_span("smtp"):
            pass

    tracing.instrument(registry, provider)
    with app.start_as_current_span("POST /orders") as request:
        with Session(engine) as session, session.begin():
            send.enqueue(session, {"to": "a@b.c"})
        with Session(engine) as session:
            meta = session.execute(text("SELECT meta FROM sqla_queue.jobs")).scalar_one()
    assert set(meta[tracing.META_KEY]) >= {"traceparent"}

    if runner == "worker":
        run_until_empty(engine, registry, WorkerConfig(poll_only=True))
    else:
        assert drain(engine, registry).ran == 1

    trace_id = request.get_span_context().trace_id
    (enqueued,) = spans_named(exporter, "enqueue send")
    (run,) = spans_named(exporter, "run send")
    (smtp,) = spans_named(exporter, "smtp")
    assert {s.context.trace_id for s in (enqueued, run, smtp) if s.context} == {trace_id}
    assert enqueued.parent is not None
    assert enqueued.parent.span_id == request.get_span_context().span_id
    assert run.parent is not None
    assert enqueued.context is not None
    assert run.parent.span_id == enqueued.context.span_id
    assert smtp.parent is not None
    assert run.context is not None
    assert smtp.parent.span_id == run.context.span_id


def test_a_job_enqueued_outside_any_trace_starts_its_own(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    registry = Registry()
    registry.task(name="plain")(lambda: None)
    tracing.instrument(registry, provider)
    with Session(engine) as session, session.begin():
        enqueue(session, "plain")  # no registry in force: no hook, no context in meta

    run_until_empty(engine, registry, WorkerConfig(poll_only=True))

    (run,) = spans_named(exporter, "run plain")
    assert run.parent is None
    assert spans_named(exporter, "enqueue plain") == []
