"""The canvas (`sqla_queue.enqueue.workflows`): signatures, chain, group and chord, enqueued in one
`enqueue_many` and one `link_jobs`, run by real workers in the order their edges say, and a
chord's callback reading its group's results with `ctx.parent_results()`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from helpers.support import WorkerThread
from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    JobContext,
    NewJob,
    Registry,
    Signature,
    WorkflowHandle,
    admin,
    chain,
    chord,
    group,
    signature,
    wait_for,
)
from sqla_queue.testing import drain, run_until_empty
from sqla_queue.worker import WorkerConfig


class Ledger:
    """When each handler started and ended, by name (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: dict[str, tuple[float, float]] = {}

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        yield
        with self.lock:
            self.spans[name] = (start, time.monotonic())

    def before(self, first: str, then: str) -> bool:
        """`then` started after `first` ended."""
        return self.spans[first][1] <= self.spans[then][0]


def canvas_registry(ledger: Ledger | None = None, pause: float = 0.0) -> Registry:
    registry = Registry()
    ledger = ledger or Ledger()

    @registry.task(name="step", keep_result=True)
    def step(name: str, value: int = 0) -> int:
        with ledger.span(name):
            time.sleep(pause)
        return value

    @registry.task(name="silent")
    def silent(name: str) -> None:
        with ledger.span(name):
            time.sleep(pause)

    @registry.task(name="collect", keep_result=True, pass_context=True)
    def collect(ctx: JobContext, name: str = "collect") -> list[Any]:
        with ledger.span(name):
            return ctx.parent_results()

    @registry.task(name="boom", max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    return registry


def rows_of(engine: Engine, ids: list[int]) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT id, task, queue, priority, status, workflow_id, tags, last_error "
                    "FROM sqla_queue.all_jobs WHERE id = ANY(:ids) ORDER BY id"
                ),
                {"ids": ids},
            )
        )


def edges_of(engine: Engine, ids: list[int]) -> set[tuple[int, int]]:
    with engine.connect() as conn:
        return {
            (row.parent_id, row.child_id)
            for row in conn.execute(
                text(
                    "SELECT parent_id, child_id FROM sqla_queue.job_deps WHERE child_id = ANY(:i)"
                ),
                {"i": ids},
            )
        }


@pytest.fixture
def kept(engine: Engine) -> Engine:
    """The default queue keeps its finished jobs (their results and rows stay readable)."""
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    return engine


def test_a_chain_runs_each_step_after_the_previous_one_ended(kept: Engine) -> None:
    ledger = Ledger()
    registry = canvas_registry(ledger, pause=0.05)
    step = registry["step"]
    with Session(kept) as session, session.begin():
        handle = chain(step.s(name="a"), step.s(name="b"), step.s(name="c", value=3)).enqueue(
            session
        )
    with WorkerThread(kept, registry, concurrency=4, poll_interval=0.05):
        assert wait_for(kept, handle.last_id, timeout=60) == 3
    assert ledger.before("a", "b")
    assert ledger.before("b", "c")
    assert [row.status for row in rows_of(kept, handle.job_ids)] == ["done"] * 3


def test_a_group_runs_all_its_jobs_and_ends_in_each(kept: Engine) -> None:
    ledger = Ledger()
    registry = canvas_registry(ledger)
    with Session(kept) as session, session.begin():
        handle = group(registry["silent"].s(name=f"g{i}") for i in range(5)).enqueue(session)
        assert handle.last_ids == handle.job_ids
        with pytest.raises(ValueError, match=r"ends in 5 jobs .*handle\.last_ids"):
            _ = handle.last_id
        drain(session, registry)
    assert sorted(ledger.spans) == [f"g{i}" for i in range(5)]
    assert {row.status for row in rows_of(kept, handle.job_ids)} == {"done"}


def test_a_chords_callback_reads_its_groups_results_in_order(kept: Engine) -> None:
    registry = canvas_registry(pause=0.01)
    step, silent = registry["step"], registry["silent"]
    header = [step.s(name=f"h{i}", value=i * 10) for i in range(6)]
    header.insert(3, silent.s(name="keeps-nothing"))
    with Session(kept) as session, session.begin():
        handle = chord(group(header), registry["collect"].s()).enqueue(session)
    with WorkerThread(kept, registry, concurrency=4, poll_interval=0.05):
        results = wait_for(kept, handle.last_id, timeout=60)
    assert results == [0, 10, 20, None, 30, 40, 50]


def test_a_nested_canvas_keeps_every_edge(kept: Engine) -> None:
    ledger = Ledger()
    registry = canvas_registry(ledger, pause=0.02)
    s = registry["silent"]
    canvas = chain(
        group(s.s(name="a"), s.s(name="b")), s.s(name="c"), group(s.s(name="d"), s.s(name="e"))
    )
    with Session(kept) as session, session.begin():
        handle = canvas.enqueue(session)
    a, b, c, d, e = handle.job_ids
    assert handle.last_ids == [d, e]
    assert edges_of(kept, handle.job_ids) == {(a, c), (b, c), (c, d), (c, e)}
    with WorkerThread(kept, registry, concurrency=4, poll_interval=0.05) as worker:
        deadline = time.monotonic() + 10
        while len(ledger.spans) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        worker.stop()
    for first, then in [("a", "c"), ("b", "c"), ("c", "d"), ("c", "e")]:
        assert ledger.before(first, then), (first, then, ledger.spans)


def test_the_handle_names_the_jobs_and_every_row_carries_the_workflow_id(engine: Engine) -> None:
    registry = canvas_registry()
    step, silent = registry["step"], registry["silent"]
    canvas = chain(step.s(name="one"), group(silent.s(name="two"), step.s(name="three")))
    with Session(engine) as session, session.begin():
        handle = canvas.enqueue(session)
        other = canvas.enqueue(session)
    assert isinstance(handle, WorkflowHandle)
    assert len(handle.workflow_id) == 32
    assert int(handle.workflow_id, 16) >= 0
    assert other.workflow_id != handle.workflow_id
    rows = rows_of(engine, handle.job_ids)
    assert [row.id for row in rows] == handle.job_ids  # in the canvas's order
    assert [row.task for row in rows] == ["step", "silent", "step"]
    assert {row.workflow_id for row in rows} == {handle.workflow_id}
    assert [row.status for row in rows] == ["queued", "waiting", "waiting"]
    assert handle.last_ids == handle.job_ids[1:]


def test_a_wide_group_and_chord_is_a_few_statements_and_runs(kept: Engine) -> None:
    registry = canvas_registry()
    step = registry["step"]
    width = 2000
    canvas = chord(
        group(step.s(name=str(i), value=i) for i in range(width)), registry["collect"].s()
    )
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(kept, "before_cursor_execute", count)
    try:
        with Session(kept) as session, session.begin():
            handle = canvas.enqueue(session)
    finally:
        event.remove(kept, "before_cursor_execute", count)
    assert len(handle.job_ids) == width + 1
    assert len(statements) < 20, statements
    config = WorkerConfig(concurrency=4, batch=200, poll_only=True)
    run_until_empty(kept, registry, config)
    assert wait_for(kept, handle.last_id, timeout=10) == list(range(width))


def test_bad_canvas_input_is_refused_with_what_to_write() -> None:
    registry = canvas_registry()
    step = registry["step"]
    with pytest.raises(ValueError, match=r"group\(\) needs at least one"):
        group()
    with pytest.raises(ValueError, match=r"chain\(\) needs at least one"):
        chain([])
    with pytest.raises(TypeError, match=r"group\(\) takes signatures .*got 'step'"):
        group(step.s(name="x"), "step")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a Task: write task.s\(\*\*args\)"):
        chain(step)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="header is a group"):
        chord(step.s(name="x"), step.s(name="y"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="body"):
        chord(group(step.s(name="x")), "collect")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"depends_on come.* from the canvas"):
        step.s(name="x").set(depends_on=[1])
    with pytest.raises(TypeError, match=r"unknown option.* colour"):
        step.s(name="x").set(colour="red")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="on_failure must be 'cancel' or 'run'"):
        signature("step", {"name": "x"}, on_failure="ignore")
    with pytest.raises(TypeError, match="task name or a registered Task"):
        signature(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="args must be a dict"):
        signature("step", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="unexpected argument nmae"):
        step.s(nmae="x")


def test_signature_options_task_defaults_and_insert_hooks_apply(engine: Engine) -> None:
    registry = canvas_registry()
    with engine.begin() as conn:
        admin.create_queue(conn, "emails")
        admin.create_queue(conn, "slow")

    @registry.task(name="mail", queue="emails", priority=7)
    def mail(to: str) -> None: ...

    @registry.on_insert
    def tag(job: NewJob) -> None:
        job.tags.append("hooked")

    step = registry["step"]
    base = step.s(name="x")
    moved = base.set(queue="slow", priority=3)
    assert base.options == {}
    assert moved.options == {"queue": "slow", "priority": 3}
    canvas = chain(moved, mail.s(to="a@b.c"), signature("mail", {"to": "d@e.f"}, priority=1))
    with Session(engine) as session, session.begin():
        handle = canvas.enqueue(session)
    rows = rows_of(engine, handle.job_ids)
    assert [(row.queue, row.priority) for row in rows] == [
        ("slow", 3),
        ("emails", 7),
        ("emails", 1),
    ]
    assert [row.tags for row in rows] == [["hooked"]] * 3


def test_a_failure_cancels_the_rest_of_a_chain_unless_a_step_runs_on_failure(kept: Engine) -> None:
    registry = canvas_registry()
    silent = registry["silent"]
    canvas = chain(
        registry["boom"].s(),
        silent.s(name="skipped"),
        silent.s(name="cleanup").set(on_failure="run"),
    )
    with Session(kept) as session, session.begin():
        handle = canvas.enqueue(session)
        drain(session, registry)
    boom, skipped, cleanup = rows_of(kept, handle.job_ids)
    assert (boom.status, skipped.status, cleanup.status) == ("failed", "cancelled", "done")
    assert f"job {boom.id}" in skipped.last_error


def test_a_canvas_enqueues_on_a_core_connection_and_an_async_session(
    database_url: str, kept: Engine
) -> None:
    registry = canvas_registry()
    step = registry["step"]
    with kept.begin() as conn:
        on_connection = (step.s(name="a", value=1) | step.s(name="b", value=2)).enqueue(conn)
    async_engine = create_async_engine(
        database_url.replace("postgresql://", "postgresql+psycopg://")
    )

    async def main() -> WorkflowHandle:
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                return await chord(
                    [step.s(name="c", value=3)], step.s(name="d", value=4)
                ).enqueue_async(session)
        finally:
            await async_engine.dispose()

    on_async = asyncio.run(main())
    assert edges_of(kept, on_connection.job_ids) == {tuple(on_connection.job_ids)}
    assert edges_of(kept, on_async.job_ids) == {tuple(on_async.job_ids)}
    drain(kept, registry)
    assert wait_for(kept, on_connection.last_id, timeout=5) == 2
    assert wait_for(kept, on_async.last_id, timeout=5) == 4


def test_a_single_signature_is_a_workflow_of_one(engine: Engine) -> None:
    registry = canvas_registry()
    with Session(engine) as session, session.begin():
        handle = registry["step"].s(name="alone").enqueue(session)
    assert handle.job_ids == handle.last_ids == [handle.last_id]
    assert isinstance(registry["step"].s(name="x"), Signature)
    assert repr(registry["step"].s(name="x").set(priority=2)) == "step.s({'name': 'x'}, priority=2)"


def test_parent_results_outside_a_worker_and_on_a_broker_say_why_not() -> None:
    from sqla_queue.brokers.worker import _no_parents

    with pytest.raises(ConfigurationError, match="needs a job run by a worker"):
        JobContext(1, "t", "default", 1).parent_results()
    ctx = JobContext(1, "t", "default", 1, parent_results=_no_parents)
    with pytest.raises(ConfigurationError, match="came from a broker"):
        ctx.parent_results()


def test_a_job_without_dependencies_has_no_parent_results(kept: Engine) -> None:
    registry = canvas_registry()
    with Session(kept) as session, session.begin():
        handle = registry["collect"].s().enqueue(session)
    drain(kept, registry)
    assert wait_for(kept, handle.last_id, timeout=5) == []


@pytest.mark.parametrize("task", ["silent", "step"])
def test_a_burst_worker_runs_a_chain_to_its_end(kept: Engine, task: str) -> None:
    # Each step's finish makes the next due, in the statement that writes it: a burst worker
    # must look again after writing outcomes before it takes the queue for empty (a success
    # folded into the claim, "silent"; a kept result written apart, "step").
    registry = canvas_registry()
    with Session(kept) as session, session.begin():
        handle = chain(registry[task].s(name=str(i)) for i in range(6)).enqueue(session)
    stats = run_until_empty(kept, registry, WorkerConfig(concurrency=2, poll_only=True))
    assert stats.succeeded == 6
    assert {row.status for row in rows_of(kept, handle.job_ids)} == {"done"}
