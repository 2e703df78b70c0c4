"""A worker's claim grows from `batch` to `max_batch` while jobs are quick, never for slow
ones, and `max_batch` at or below `batch` keeps every claim at `batch`."""

from __future__ import annotations

import time

import pytest
from helpers.support import AtOnce, WorkerThread, enqueue_numbered
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, Registry, admin, enqueue_many
from sqla_queue.db.models import Job
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig
from sqla_queue.worker.claim_size import GROW_WITHIN, ClaimSize


def _left(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_the_ladder_doubles_from_batch_and_stops_at_max_batch() -> None:
    assert ClaimSize(10, 500).ladder == (10, 20, 40, 80, 160, 320, 500)
    assert ClaimSize(50, 50).ladder == (50,)


def test_a_claim_grows_when_half_of_it_returns_quickly_steps_down_when_slow_resets_when_short() -> (
    None
):
    sizes = ClaimSize(10, 80)
    assert sizes.next(0.0, 0) == 10  # nothing claimed yet
    sizes.claimed(10, 10, 0.0, 0)
    assert sizes.next(GROW_WITHIN / 2, 0) == 10  # started, none returned: not quick (yet)
    assert sizes.next(GROW_WITHIN / 2, 4) == 10  # fewer than half returned
    assert sizes.next(GROW_WITHIN / 2, 5) == 20  # half returned within GROW_WITHIN
    sizes.claimed(20, 20, 1.0, 5)
    sizes.claimed(sizes.next(1.01, 15), 40, 1.01, 15)
    sizes.claimed(sizes.next(1.02, 35), 80, 1.02, 35)
    assert sizes.next(1.03, 1_000) == 80  # at max_batch it stays there
    assert sizes.next(1.02 + GROW_WITHIN * 3, 1_000) == 40  # it lasted: one step down
    sizes.claimed(80, 7, 2.0, 1_000)  # short: the backlog is gone
    assert sizes.next(2.001, 2_000) == 10


def test_one_job_claims_grow_only_once_jobs_return() -> None:
    """batch 1 with idle handler threads: the claims that fill them stay at 1 until a job
    has returned (so `--batch 1` with slow jobs holds one job per free thread)."""
    sizes = ClaimSize(1, 64)
    sizes.claimed(1, 1, 0.0, 0)
    assert sizes.next(0.001, 0) == 1
    assert sizes.next(0.001, 1) == 2


def test_a_worker_grows_its_claims_on_a_deep_backlog_of_quick_jobs(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="quick")(lambda n: None)
    enqueue_numbered(engine, "quick", 3_000)

    config = WorkerConfig(concurrency=4, batch=5, max_batch=80, poll_only=True)
    stats = run_until_empty(engine, registry, config)

    assert stats.succeeded == 3_000
    assert stats.largest_claim == 80
    assert _left(engine) == 0


def test_slow_jobs_keep_the_claim_at_batch(engine: Engine) -> None:
    """Each batch of 0.15 s jobs lasts longer than GROW_WITHIN: no claim ever grows, so a
    worker never sits on many slow jobs that other workers could run."""
    registry = Registry()
    registry.task(name="slow")(lambda n: time.sleep(0.15))
    enqueue_numbered(engine, "slow", 12)

    config = WorkerConfig(concurrency=2, batch=4, max_batch=64, poll_only=True)
    stats = run_until_empty(engine, registry, config)

    assert (stats.succeeded, stats.largest_claim) == (12, 4)


@pytest.mark.parametrize("max_batch", [1, 5])
def test_max_batch_at_or_below_batch_keeps_every_claim_at_batch(
    engine: Engine, max_batch: int
) -> None:
    registry = Registry()
    registry.task(name="quick")(lambda n: None)
    enqueue_numbered(engine, "quick", 500)

    config = WorkerConfig(concurrency=4, batch=5, max_batch=max_batch, poll_only=True)
    stats = run_until_empty(engine, registry, config)

    assert (stats.succeeded, stats.largest_claim) == (500, 5)


@pytest.mark.parametrize("bad", [0, -3, 10_001, True, 2.5, "80"])
def test_a_bad_max_batch_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="max_batch must be"):
        WorkerConfig(max_batch=bad)  # type: ignore[arg-type]


def test_a_growing_worker_holds_at_most_concurrency_plus_twice_its_largest_claim(
    engine: Engine,
) -> None:
    """The bound the docs give: held jobs (ready, running, settled but not yet written)
    never pass concurrency + twice the claim's size, however far the claims grew (a grown
    claim is sent ahead, while up to its size of the claim before still wait)."""
    registry = Registry()
    registry.task(name="quick")(lambda n: None)
    enqueue_numbered(engine, "quick", 3_000)
    runner = WorkerThread(engine, registry, concurrency=2, batch=2, max_batch=16, burst=True)
    most = 0
    with runner:
        while runner.thread.is_alive():
            most = max(most, len(runner.worker.board.held))
            time.sleep(0.0005)
    assert runner.stats is not None
    assert (runner.stats.succeeded, runner.stats.largest_claim) == (3_000, 16)
    assert 2 + 2 - 1 < most <= 2 + 2 * 16


def test_growing_claims_never_run_more_than_a_queue_limit_allows(engine: Engine) -> None:
    """Claims and limits together: a deep backlog of quick jobs in a queue limited to 3
    running, served by a worker of 8 threads whose claims may grow to 64. The limit holds
    (counted in the handlers), and the claims, which come back short of the limit's slots
    once they outgrow them, do not pass twice the slots."""
    registry = Registry()
    at_once = AtOnce()

    @registry.task(name="quick")
    def quick(n: int) -> None:
        with at_once:
            time.sleep(0.001)

    with engine.begin() as conn:
        admin.create_queue(conn, "limited")
        admin.set_max_running(conn, "limited", 3)
    with Session(engine) as session, session.begin():
        rows = [{"task": "quick", "args": {"n": n}, "queue": "limited"} for n in range(600)]
        enqueue_many(session, rows)

    config = WorkerConfig(concurrency=8, batch=3, max_batch=64, poll_only=True)
    stats = run_until_empty(engine, registry, config)

    assert stats.succeeded == 600
    assert at_once.most <= 3
    assert stats.largest_claim <= 6
    assert _left(engine) == 0
