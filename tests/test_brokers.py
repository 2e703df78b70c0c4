"""The outbox relay and the broker workers on the machine's real NATS JetStream and RabbitMQ.

Each test runs once per broker, on a route of its own (a unique subject or exchange) whose
streams, queues and exchange are deleted afterwards. A broker that does not answer skips
its tests with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_kit import (
    Broker,
    Effects,
    Process,
    broker_fixture,
    processes_fixture,
    wait_until,
)
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import admin, enqueue, enqueue_many

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
    return ["worker", "--app", "broker_app:registry", "-q", "out", "--from", broker.url, *extra]


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

    wait_until(lambda: left_in_table(engine) == 0, 120, "the relay to empty the table")
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
        wait_until(lambda r=relay: r.started() or not r.alive(), 60, "the relay to start")
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

    first = processes(database_url, *from_args(broker, "--lease", "2"))
    wait_until(lambda: effects.attempts(job_id) == [1], 60, "the first attempt to start")
    first.kill()
    second = processes(database_url, *from_args(broker, "--lease", "2", "--burst"))
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
    wait_until(lambda: all(r.started() for r in relays), 60, "both relays to start")
    with engine.begin() as conn:
        admin.set_paused(conn, "out", False)

    wait_until(lambda: left_in_table(engine) == 0, 120, "the relays to empty the table")
    for relay in relays:
        relay.stop()

    ids = broker.ids_in_route()
    assert len(ids) == len(expected)
    assert set(ids) == expected
    shares = [int(r.log().rpartition("relay stopped: ")[2].split(" ")[0]) for r in relays]
    print(f"\n{broker.kind}: published per relay {shares}")
    assert sum(shares) == len(expected)
