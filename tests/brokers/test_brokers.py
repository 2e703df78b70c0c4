"""The outbox relay and the broker workers on the machine's real NATS JetStream and RabbitMQ.

Each test runs once per broker, on a route of its own (a unique subject or exchange) whose
streams, queues and exchange are deleted afterwards. A broker that does not answer skips
its tests with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.broker_kit import (
    Broker,
    Effects,
    Process,
    broker_fixture,
    processes_fixture,
)
from helpers.fault_kit import wait_until
from helpers.support import until_told
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Registry, Snooze, admin, enqueue, enqueue_many
from sqla_queue.brokers.worker import BrokerWorker, BrokerWorkerConfig
from sqla_queue.contrib import metrics
from sqla_queue.contrib.logs import log_jobs
from sqla_queue.enqueue.results import wait_for
from sqla_queue.errors import ResultMissingError

BROKERS = ["nats", "amqp"]


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    yield from broker_fixture(request)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    yield from processes_fixture(tmp_path)


@pytest.fixture
def effects(database_url: str) -> Iterator[Effects]:
    record = Effects(database_url)
    yield record
    record.conn.close()


def route_queue(engine: Engine, broker: Broker, name: str = "out") -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, name)
        admin.set_route(conn, name, str(broker.route))


def from_args(broker: Broker, *extra: str) -> list[str]:
    return [
        "worker",
        "--app",
        "helpers.apps.broker_app:registry",
        "-q",
        "out",
        "--from",
        broker.url,
        *extra,
    ]


def relay_args(broker: Broker, *extra: str) -> list[str]:
    return ["relay", f"--{broker.kind}", broker.url, *extra]


def left_in_table(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.scalar(text("SELECT count(*) FROM sqla_queue.jobs WHERE status = 'queued'")) or 0
        )


def test_relayed_job_runs_once_through_the_broker_and_leaves_the_table(
    broker: Broker,
    engine: Engine,
    database_url: str,
    effects: Effects,
    processes: Callable[..., Process],
) -> None:
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        (job_id,) = enqueue_many(session, [{"task": "effect", "args": {"n": 1}, "queue": "out"}])

    relay = processes(database_url, *relay_args(broker, "--burst"))
    assert relay.wait(60) == 0, relay.log()
    assert left_in_table(engine) == 0
    assert broker.waiting() == 1

    worker = processes(database_url, *from_args(broker, "--burst"))
    assert worker.wait(60) == 0, worker.log()
    assert effects.runs() == {job_id: 1}
    assert broker.waiting() == 0
    with engine.connect() as conn:  # the registry's middleware ran around the handler
        seen = conn.execute(text("SELECT job_id, task FROM public.broker_middleware")).all()
    assert [tuple(row) for row in seen] == [(job_id, "effect")]
    with engine.connect() as conn:  # the rollup, written as the broker worker stopped
        counted = conn.execute(
            text("SELECT queue, task, succeeded, failed FROM sqla_queue.job_counts")
        ).all()
    assert [tuple(row) for row in counted] == [("out", "effect", 1, 0)]


@pytest.mark.slow
def test_committed_half_of_20000_jobs_reaches_the_broker_once_and_runs_once(
    broker: Broker,
    engine: Engine,
    database_url: str,
    effects: Effects,
    processes: Callable[..., Process],
) -> None:
    """20,000 jobs in 400 business transactions of 50, every other one rolled back, while a
    relay runs: the broker holds exactly the 10,000 committed jobs, once each; three broker
    workers then record each one's side effect once."""
    route_queue(engine, broker)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.orders (id serial PRIMARY KEY, n int)"))
    relay = processes(database_url, *relay_args(broker))
    committed: set[int] = set()
    rolled_back: set[int] = set()
    for batch in range(400):
        with Session(engine) as session:
            session.begin()
            rows = []
            for i in range(50):
                order_id = session.execute(
                    text("INSERT INTO public.orders (n) VALUES (:n) RETURNING id"), {"n": i}
                ).scalar_one()
                rows.append({"task": "effect", "args": {"n": order_id}, "queue": "out"})
            ids = enqueue_many(session, rows)
            if batch % 2:
                session.rollback()
                rolled_back.update(ids)
            else:
                session.commit()
                committed.update(ids)
    assert len(committed) == len(rolled_back) == 10_000

    wait_until(lambda: left_in_table(engine) == 0, 120, what="the relay to empty the table")
    relay.stop()
    in_broker = broker.ids_in_route() if broker.kind == "nats" else None
    if in_broker is not None:  # read without consuming: the exact contents
        assert len(in_broker) == len(set(in_broker)) == 10_000
        assert set(in_broker) == committed
    assert broker.waiting() == 10_000

    workers = [processes(database_url, *from_args(broker, "--burst", "-c", "8")) for _ in range(3)]
    for worker in workers:
        assert worker.wait(240) == 0, worker.log()[-3000:]
    runs = effects.runs()
    assert set(runs) == committed
    assert set(runs.values()) == {1}
    assert not set(runs) & rolled_back
    assert broker.waiting() == 0
    with engine.connect() as conn:
        orders = conn.scalar(text("SELECT count(*) FROM public.orders"))
    assert orders == 10_000  # the business rows commit or roll back with their jobs


@pytest.mark.slow
def test_relay_killed_every_half_second_loses_no_job(
    broker: Broker, engine: Engine, database_url: str, processes: Callable[..., Process]
) -> None:
    """kill -9 the relay 0.5 s into every run (after its start-up) until 20,000 jobs moved:
    every job reaches the broker; JetStream drops the copies a dead relay re-publishes,
    RabbitMQ keeps them (its broker workers skip them by job id). The count is printed."""
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        expected = set(
            enqueue_many(
                session,
                [{"task": "effect", "args": {"n": i}, "queue": "out"} for i in range(20_000)],
            )
        )
    kills = 0
    deadline = time.monotonic() + 600
    while left_in_table(engine) and time.monotonic() < deadline:
        relay = processes(database_url, *relay_args(broker, "--batch", "200"))
        wait_until(lambda r=relay: r.started() or not r.alive(), 60, what="the relay to start")
        time.sleep(0.5)
        if relay.alive():
            relay.kill()
            kills += 1
    assert left_in_table(engine) == 0, "the relay did not finish in 10 minutes"
    assert kills >= 2, "the relay was not killed while it moved jobs"

    ids = broker.ids_in_route()
    duplicates = len(ids) - len(set(ids))
    print(f"\n{broker.kind}: {kills} kills, {len(ids)} messages, {duplicates} duplicates")
    assert set(ids) == expected  # nothing lost
    if broker.kind == "nats":
        assert duplicates == 0  # all within JetStream's duplicate window


def test_broker_worker_killed_mid_job_gets_it_delivered_again(
    broker: Broker,
    engine: Engine,
    database_url: str,
    effects: Effects,
    processes: Callable[..., Process],
) -> None:
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        (job_id,) = enqueue_many(session, [{"task": "hang_first", "queue": "out"}])
    assert processes(database_url, *relay_args(broker, "--burst")).wait(60) == 0

    first = processes(database_url, *from_args(broker, "--ack-wait", "2"))
    wait_until(lambda: effects.attempts(job_id) == [1], 60, what="the first attempt to start")
    first.kill()
    second = processes(database_url, *from_args(broker, "--ack-wait", "2", "--burst"))
    assert second.wait(90) == 0, second.log()

    assert effects.attempts(job_id) == [1, 2]
    assert broker.waiting() == 0


def test_always_failing_job_ends_in_the_dead_letter_place_after_max_attempts(
    broker: Broker,
    engine: Engine,
    database_url: str,
    effects: Effects,
    processes: Callable[..., Process],
) -> None:
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        (job_id,) = enqueue_many(session, [{"task": "always_fails", "queue": "out"}])
    assert processes(database_url, *relay_args(broker, "--burst")).wait(60) == 0

    worker = processes(database_url, *from_args(broker, "--burst"))
    assert worker.wait(90) == 0, worker.log()

    assert effects.attempts(job_id) == [1, 2, 3]  # the task's max_attempts=3
    assert broker.dead_letters() == 1
    assert broker.waiting() == 0
    status, attempts, error = effects.conn.execute(
        "SELECT status, attempts, last_error FROM sqla_queue.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert (status, attempts) == ("failed", 3)
    assert "always fails (attempt 3)" in error


def test_duplicate_delivery_runs_once_with_consumer_deduplication(
    broker: Broker,
    engine: Engine,
    database_url: str,
    effects: Effects,
    processes: Callable[..., Process],
) -> None:
    """The same job published twice (a relay that died after the broker's confirmation and
    before its delete) runs once: JetStream drops the copy, and the RabbitMQ worker skips it."""
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        (job_id,) = enqueue_many(session, [{"task": "effect", "args": {"n": 1}, "queue": "out"}])
        row = session.execute(
            text(
                "SELECT id, task, args, queue, priority, attempts, max_attempts, created_at "
                "FROM sqla_queue.jobs WHERE id = :id"
            ),
            {"id": job_id},
        ).one()
    from sqla_queue.brokers.messages import JobMessage

    message = JobMessage.from_row(tuple(row))
    broker.run(_publish_twice(broker, message))

    worker = processes(database_url, *from_args(broker, "--burst"))
    assert worker.wait(60) == 0, worker.log()
    assert effects.runs() == {job_id: 1}


async def _publish_twice(broker: Broker, message: object) -> None:
    from sqla_queue.brokers.amqp import AmqpPublisher
    from sqla_queue.brokers.nats import NatsPublisher

    publisher = NatsPublisher(broker.url) if broker.kind == "nats" else AmqpPublisher(broker.url)
    await publisher.connect()
    try:
        for _ in range(2):
            outcome = await publisher.publish(broker.route, [message], timeout=10)  # type: ignore[list-item]
            assert outcome.errors == []
    finally:
        await publisher.close()


def test_relay_moves_a_delayed_job_only_once_it_is_due_and_skips_paused_queues(
    broker: Broker, engine: Engine, database_url: str, processes: Callable[..., Process]
) -> None:
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        # an hour: a relay that starts slowly on a loaded machine still finds it not due
        enqueue(session, "effect", {"n": 1}, queue="out", delay=3600)
    assert processes(database_url, *relay_args(broker, "--burst")).wait(60) == 0
    assert left_in_table(engine) == 1  # not due yet

    with engine.begin() as conn:
        admin.set_paused(conn, "out", True)
        # the hour passes: the job is due from now on
        conn.execute(text("UPDATE sqla_queue.jobs SET run_at = now() WHERE queue = 'out'"))
    assert processes(database_url, *relay_args(broker, "--burst")).wait(60) == 0
    assert left_in_table(engine) == 1  # due, but its queue is paused

    with engine.begin() as conn:
        admin.set_paused(conn, "out", False)
    assert processes(database_url, *relay_args(broker, "--burst")).wait(60) == 0
    assert left_in_table(engine) == 0
    assert broker.waiting() == 1


def test_two_relays_at_once_publish_each_job_once(
    broker: Broker, engine: Engine, database_url: str, processes: Callable[..., Process]
) -> None:
    """SKIP LOCKED splits the rows: on RabbitMQ, which keeps every copy, any job published
    by both relays would show up twice."""
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        rows = [{"task": "effect", "args": {"n": i}, "queue": "out"} for i in range(5_000)]
        expected = set(enqueue_many(session, rows))
    with engine.begin() as conn:  # hold the jobs back until both relays are up
        admin.set_paused(conn, "out", True)
    relays = [processes(database_url, *relay_args(broker, "--batch", "50")) for _ in range(2)]
    wait_until(lambda: all(r.started() for r in relays), 60, what="both relays to start")
    with engine.begin() as conn:
        admin.set_paused(conn, "out", False)

    wait_until(lambda: left_in_table(engine) == 0, 120, what="the relays to empty the table")
    for relay in relays:
        relay.stop()

    ids = broker.ids_in_route()
    assert len(ids) == len(expected)
    assert set(ids) == expected
    shares = [int(r.log().rpartition("relay stopped: ")[2].split(" ")[0]) for r in relays]
    print(f"\n{broker.kind}: published per relay {shares}")
    assert sum(shares) == len(expected)


# -- the job core under the broker worker (in this process: its hooks and stats are read) --


def _relay_and_worker(
    broker: Broker,
    engine: Engine,
    database_url: str,
    processes: Callable[..., Process],
    registry: Registry,
    task: str,
    *,
    burst: bool = True,
) -> tuple[int, BrokerWorker]:
    """One job of `task` relayed to a routed queue, and an in-process worker for it."""
    route_queue(engine, broker)
    with Session(engine) as session, session.begin():
        (job_id,) = enqueue_many(session, [{"task": task, "queue": "out"}])
    assert processes(database_url, *relay_args(broker, "--burst")).wait(60) == 0
    config = BrokerWorkerConfig(broker.url, "out", burst=burst, poll_interval=0.2)
    return job_id, BrokerWorker(engine, registry, config)


def test_a_snoozed_broker_job_runs_again_without_using_an_attempt_and_hooks_logs_metrics_fire(
    broker: Broker,
    engine: Engine,
    database_url: str,
    processes: Callable[..., Process],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prometheus_client import CollectorRegistry

    registry = Registry()
    attempts: list[int] = []
    claimed: list[int] = []
    finished: list[str] = []

    @registry.task(name="snoozer", pass_context=True, max_attempts=1)
    def snoozer(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            raise Snooze(1)

    registry.on_job_claimed(lambda ctx: claimed.append(ctx.job_id))
    registry.on_job_finished(lambda ctx, outcome: finished.append(outcome.kind.value))
    log_jobs(registry)
    prom = CollectorRegistry()
    metrics.instrument(registry, prometheus_registry=prom)
    job_id, worker = _relay_and_worker(broker, engine, database_url, processes, registry, "snoozer")

    with caplog.at_level(logging.INFO, logger="sqla_queue.jobs"):
        stats = worker.run(install_signal_handlers=False)

    # max_attempts=1: had the snooze used the attempt, the second run could not happen
    assert attempts == [1, 1]
    assert (stats.snoozed, stats.succeeded, stats.failed) == (1, 1, 0)
    assert claimed == [job_id, job_id]
    assert finished == ["snoozed", "succeeded"]
    lines = [r for r in caplog.records if r.name == "sqla_queue.jobs"]
    assert [(r.job_id, r.outcome) for r in lines] == [(job_id, "snoozed"), (job_id, "succeeded")]  # type: ignore[attr-defined]
    assert all(r.duration_seconds >= 0 for r in lines)  # type: ignore[attr-defined]
    labels = {"queue": "out", "task": "snoozer"}
    for outcome in ("snoozed", "succeeded"):
        sample = prom.get_sample_value(
            "sqla_queue_jobs_finished_total", {**labels, "outcome": outcome}
        )
        assert sample == 1, outcome
    assert prom.get_sample_value("sqla_queue_jobs_claimed_total", labels) == 2
    assert prom.get_sample_value("sqla_queue_jobs_held") == 0
    assert broker.waiting() == 0
    assert broker.dead_letters() == 0


def test_a_broker_job_keeps_no_result_and_wait_for_says_so_at_once(
    broker: Broker,
    engine: Engine,
    database_url: str,
    processes: Callable[..., Process],
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()

    @registry.task(name="answer", keep_result=True)
    def answer() -> int:
        return 42

    job_id, worker = _relay_and_worker(broker, engine, database_url, processes, registry, "answer")
    with caplog.at_level(logging.WARNING, logger="sqla_queue.brokers.worker"):
        stats = worker.run(install_signal_handlers=False)

    assert stats.succeeded == 1
    assert any("answer keeps its result" in r.getMessage() for r in caplog.records)
    started = time.monotonic()
    with pytest.raises(ResultMissingError):
        wait_for(engine, job_id, timeout=3600)
    assert time.monotonic() - started < 600  # a clear error, not a wait for the hour


def test_a_broker_job_of_an_unknown_task_is_put_back_not_failed(
    broker: Broker, engine: Engine, database_url: str, processes: Callable[..., Process]
) -> None:
    _, worker = _relay_and_worker(
        broker, engine, database_url, processes, Registry(), "not_deployed_yet", burst=False
    )
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    runner.start()
    try:
        wait_until(lambda: worker.stats.snoozed >= 1, 60, what="the job to be put back")
    finally:
        worker.stop()
        runner.join(60)
    assert (worker.stats.failed, worker.stats.succeeded) == (0, 0)
    assert broker.dead_letters() == 0
    with engine.connect() as conn:  # not recorded as failed either
        assert conn.scalar(text("SELECT count(*) FROM sqla_queue.jobs")) == 0


def test_a_sync_broker_handler_past_its_timeout_keeps_its_slot_and_then_times_out(
    broker: Broker, engine: Engine, database_url: str, processes: Callable[..., Process]
) -> None:
    registry = Registry()
    returned: list[float] = []
    finished: list[tuple[str, float, bool]] = []

    @registry.task(name="overruns", pass_context=True, timeout=0.5, max_attempts=1)
    def overruns(ctx: JobContext) -> None:
        until_told(ctx)  # never told: 60 s, and `told` below fails
        returned.append(time.monotonic())

    registry.on_job_finished(
        lambda ctx, o: finished.append((o.kind.value, time.monotonic(), ctx.cancelled))
    )
    job_id, worker = _relay_and_worker(
        broker, engine, database_url, processes, registry, "overruns"
    )
    stats = worker.run(install_signal_handlers=False)

    assert len(returned) == 1
    [(kind, at, told)] = finished
    assert (kind, told) == ("timed out", True)  # the handler was told at its deadline
    assert at >= returned[0]  # settled only once the handler returned: its slot was held
    assert stats.failed == 1
    assert broker.dead_letters() == 1
    with engine.connect() as conn:
        status, error = conn.execute(
            text("SELECT status, last_error FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        ).one()
    assert status == "failed"
    assert "JobTimeoutError" in error


def test_an_async_broker_handler_past_its_timeout_is_cancelled_and_times_out(
    broker: Broker, engine: Engine, database_url: str, processes: Callable[..., Process]
) -> None:
    registry = Registry()
    cancelled: list[bool] = []

    @registry.task(name="hangs", timeout=0.5, max_attempts=1)
    async def hangs() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    job_id, worker = _relay_and_worker(broker, engine, database_url, processes, registry, "hangs")
    started = time.monotonic()
    stats = worker.run(install_signal_handlers=False)

    assert time.monotonic() - started < 600  # cancelled at its deadline, not after the hour
    assert cancelled == [True]
    assert (stats.failed, stats.succeeded) == (1, 0)
    with engine.connect() as conn:
        error = conn.scalar(
            text("SELECT last_error FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        )
    assert "JobTimeoutError" in error
