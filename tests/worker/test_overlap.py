"""Issue 39, item 2: a grown claim is sent ahead, so it is in flight while the handlers run
the batch before it and the server's work overlaps the worker's Python. Proven by counts
taken as each claim statement is sent (a statement listener reads the board), never by
time; limited queues and shutdown keep their guarantees."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from helpers.fault_kit import wait_until
from helpers.support import AtOnce, WorkerThread, enqueue_numbered
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session

from sqla_queue import Registry, admin, enqueue_many
from sqla_queue.db.models import Job
from sqla_queue.worker import WorkerStats
from sqla_queue.worker.connection import STATEMENT_KIND


@dataclass(frozen=True)
class SentClaim:
    """A claim statement as it was sent: its kind and the board at that moment."""

    kind: str
    ready: int
    """Jobs of earlier claims still waiting to start."""
    running: int
    unfinished: int
    """Jobs of earlier claims not yet returned (waiting or running)."""


@contextmanager
def claims_sent(engine: Engine, runner: WorkerThread) -> Iterator[list[SentClaim]]:
    """Every claim statement the worker sends, with its board when it is sent."""
    sent: list[SentClaim] = []
    board = runner.worker.board

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: Any):
        kind = context.execution_options.get(STATEMENT_KIND)
        if kind in ("claim", "complete_and_claim"):
            with board.mutex:
                ready, running = len(board.ready), board.running
            sent.append(SentClaim(kind, ready, running, ready + running))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", before)


def _drained(engine: Engine, runner: WorkerThread, jobs: int) -> WorkerStats:
    """Wait for a burst worker (started by the caller) to finish; its stats, every job done."""
    runner.thread.join(600)  # a deadline only: a loaded machine may take minutes
    assert not runner.thread.is_alive(), "the burst worker did not finish in 600 s"
    assert runner.error is None
    assert runner.stats is not None
    assert runner.stats.succeeded == jobs
    assert _by_status(engine) == {}
    return runner.stats


def _by_status(engine: Engine) -> dict[str, int]:
    with Session(engine) as session:
        rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
        return {str(status.value if hasattr(status, "value") else status): n for status, n in rows}


def test_a_grown_claim_is_sent_while_the_claim_before_still_waits_to_run(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="quick")(lambda n: None)
    enqueue_numbered(engine, "quick", 3_000)
    runner = WorkerThread(engine, registry, concurrency=2, batch=5, max_batch=40, burst=True)
    with claims_sent(engine, runner) as sent, runner:
        stats = _drained(engine, runner, 3_000)

    ahead = [claim for claim in sent if claim.ready > 0]
    # the claim went out while jobs of the claim before had not even started: its round
    # trip (and the finishes it carries) overlaps their handlers
    assert ahead, "no claim was sent before the claim before it had run"
    # the producer counts jobs waiting when it decides; some may start before the send
    assert stats.claims_ahead >= len(ahead)
    # finishes ride along: a claim sent ahead also wrote the successes settled by then
    assert any(claim.kind == "complete_and_claim" for claim in ahead)
    # never ahead by more than a claim's size, nor more running than -c
    assert max(claim.ready for claim in ahead) <= stats.largest_claim
    assert max(claim.running for claim in sent) <= 2


def test_a_limited_queue_is_never_claimed_ahead(engine: Engine) -> None:
    """While a queue has a limit, every claim waits for the ready queue to empty, as
    before: jobs waiting in a worker would hold the queue's slots from other workers."""
    registry = Registry()
    at_once = AtOnce()

    @registry.task(name="quick")
    def quick(n: int) -> None:
        with at_once:
            pass

    with engine.begin() as conn:
        admin.create_queue(conn, "limited")
        admin.set_max_running(conn, "limited", 3)
    enqueue_numbered(engine, "quick", 1_500, queue="limited")
    runner = WorkerThread(engine, registry, concurrency=8, batch=3, max_batch=64, burst=True)
    with claims_sent(engine, runner) as sent, runner:
        stats = _drained(engine, runner, 1_500)
    assert stats.claims_ahead == 0
    assert sent
    assert all(claim.ready == 0 for claim in sent)
    assert at_once.most <= 3


def test_shutdown_releases_the_jobs_claimed_ahead_and_counts_none_as_running(
    engine: Engine,
) -> None:
    """Quick jobs grow the claims until they are sent ahead; then held jobs block their
    handlers. Jobs claimed ahead wait unstarted (not running: the handlers' count stays at
    -c), and stopping releases them to the queue with their attempt unspent."""
    registry = Registry()
    gate = threading.Event()
    registry.task(name="quick")(lambda n: None)

    @registry.task(name="held")
    def held(n: int) -> None:
        gate.wait(60)

    with Session(engine) as session, session.begin():
        rows: list[dict[str, Any]] = [
            {"task": "quick", "args": {"n": n}, "priority": 0} for n in range(2_000)
        ]
        rows += [{"task": "held", "args": {"n": n}, "priority": 5} for n in range(200)]
        enqueue_many(session, rows)
    runner = WorkerThread(engine, registry, concurrency=2, batch=5, max_batch=40)
    board = runner.worker.board
    runner.thread.start()
    try:
        wait_until(
            lambda: board.running == 2 and len(board.ready) > 0 and _quick_done(engine),
            timeout=60,
            what="both handlers held and jobs claimed ahead waiting",
        )
        with board.mutex:
            waiting, running = len(board.ready), board.running
        assert running == 2  # the waiting jobs take no handler slot
        assert runner.worker.stats.claims_ahead > 0
        runner.worker.stop()
        wait_until(lambda: board.paused, timeout=30, what="the shutdown to take the unstarted")
    finally:
        gate.set()
    stats = runner.stop()
    assert stats.succeeded == 2_000 + 2  # the two held handlers, let go after the stop
    with Session(engine) as session:
        left = session.execute(select(Job.status).where(Job.task == "held")).scalars().all()
    statuses = [str(getattr(status, "value", status)) for status in left]
    # every job claimed ahead went back to the queue, none left running or lost
    assert statuses == ["queued"] * 198
    assert waiting <= 198


def _quick_done(engine: Engine) -> bool:
    with Session(engine) as session:
        count = session.scalar(select(func.count()).select_from(Job).where(Job.task == "quick"))
        return count == 0
