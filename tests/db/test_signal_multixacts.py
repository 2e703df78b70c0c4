"""Signals mint no MultiXact: parks, signals sent while jobs park (8 senders, each in its
own transaction), consumption and wakes, counted on a private cluster (the counter is
cluster-wide; see `helpers.multixact_support`); and steps, sleeps and signals together on 8
worker processes, with no savepoint seen (none sent, no backend writing in one)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from helpers.apps.steps_app import SAVEPOINT_SEEN, STEPS_TABLES, trip_key
from helpers.fault_kit import WorkerProcess, libpq_dsn
from helpers.multixact_support import count_multixacts
from helpers.support import enqueue_jobs, enqueue_numbered
from sqlalchemy import Engine, create_engine, text

import sqla_queue
from sqla_queue import JobContext, Registry
from sqla_queue.db.queries.catalog import subtransaction_writers
from sqla_queue.worker import Worker, WorkerConfig

pytestmark = pytest.mark.slow

KEYS = 40
PER_KEY = 8
SENDERS = 8
DEADLINE = 180.0


def test_parks_signals_and_wakes_under_concurrency_mint_no_multixacts(
    private_queue_engine: Engine, private_admin: Engine
) -> None:
    registry = Registry()
    received: list[int] = []
    lock = threading.Lock()

    @registry.task(name="waiter", pass_context=True)
    def waiter(ctx: JobContext, key: int) -> None:
        payload = ctx.wait_for_signal(f"k{key}", timeout=3600)
        with lock:
            received.append(payload)

    for key in range(KEYS):
        enqueue_jobs(private_queue_engine, "waiter", PER_KEY, args={"key": key})
    config = WorkerConfig(concurrency=4, batch=10, heartbeat=0.5, poll_interval=0.2)
    workers = [Worker(private_queue_engine, registry, config) for _ in range(2)]

    def send(sender: int) -> None:
        for n in range(sender, KEYS * PER_KEY, SENDERS):
            with private_queue_engine.begin() as conn:
                sqla_queue.signal(conn, f"k{n % KEYS}", n)

    def work() -> None:
        threads = [
            threading.Thread(target=w.run, kwargs={"install_signal_handlers": False})
            for w in workers
        ]
        threads += [threading.Thread(target=send, args=(s,)) for s in range(SENDERS)]
        for thread in threads:
            thread.start()
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            with private_queue_engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM sqla_queue.jobs")).scalar_one()
            if left == 0:
                break
            time.sleep(0.2)
        for w in workers:
            w.stop()
        for thread in threads:
            thread.join(30)

    minted = count_multixacts(private_admin, work)
    assert sorted(received) == list(range(KEYS * PER_KEY))  # each signal consumed once
    with private_queue_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sqla_queue.jobs")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM sqla_queue.signals")).scalar_one() == 0
    assert minted == 0


PROCESSES = 8
TRIPS = 240
TRIP_DEADLINE = 600.0


def test_steps_sleeps_and_signals_of_8_worker_processes_mint_no_multixacts(
    private_url: str, private_admin: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    """240 jobs, each an outside step, a database-only step, a durable sleep, a wait for its
    signal and a last database-only step, on 8 `sqla-queue worker` processes, while 8
    threads send the signals (some before the wait, some while it is parked): 0 MultiXacts
    minted (counted), no savepoint statement sent by any worker process, and no backend of
    the database seen writing in a savepoint (sampled all along: a savepoint that locked a
    job row would hold a transaction id of its own)."""
    with psycopg.connect(libpq_dsn(private_url), autocommit=True) as conn:
        conn.execute(STEPS_TABLES)
    engine = create_engine(private_url, pool_size=10, max_overflow=10)
    pool: list[WorkerProcess] = []
    savepoint_writers: set[int] = set()
    done = threading.Event()

    def watch() -> None:  # backends holding more than one xid: writing in a savepoint
        with private_admin.connect() as conn:
            while not done.is_set():
                savepoint_writers.update(
                    pid for pid, _, _ in conn.execute(subtransaction_writers())
                )
                time.sleep(0.02)

    def send(sender: int) -> None:
        rng = random.Random(sender)
        for n in range(sender, TRIPS, PROCESSES):
            time.sleep(rng.uniform(0.0, 0.3))
            with engine.begin() as conn:
                sqla_queue.signal(conn, trip_key(n), n)

    def work() -> None:
        enqueue_numbered(engine, "steps.trip", TRIPS)
        options = ("-q", "default", "-c", "4", "--batch", "5")
        pool.extend(
            workers(private_url, *options, app="helpers.apps.steps_app:registry")
            for _ in range(PROCESSES)
        )
        threads = [threading.Thread(target=watch)]
        threads += [threading.Thread(target=send, args=(s,)) for s in range(PROCESSES)]
        for thread in threads:
            thread.start()
        end = time.monotonic() + TRIP_DEADLINE
        left = TRIPS
        while left and time.monotonic() < end:
            time.sleep(0.5)
            with engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM sqla_queue.jobs")).scalar_one()
        done.set()
        for worker in pool:
            worker.stop()
        for thread in threads:
            thread.join(60)
        assert not left, f"{left} of {TRIPS} jobs not done in {TRIP_DEADLINE:.0f} s"

    try:
        minted = count_multixacts(private_admin, work)
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT step, count(*) FROM public.steps_rows GROUP BY step")
            ).all()
            signals_left = conn.execute(text("SELECT count(*) FROM sqla_queue.signals"))
            signals_left = signals_left.scalar_one()
            outside = conn.execute(
                text("SELECT count(DISTINCT job_id) FROM public.steps_ledger")
            ).scalar_one()
    finally:
        done.set()
        engine.dispose()
    counts = dict(rows)
    assert counts.pop("s1") == TRIPS  # each database-only step once
    assert counts == {f"s2:{n}": 1 for n in range(TRIPS)}  # each got its own signal, once
    assert outside == TRIPS
    assert signals_left == 0  # every signal consumed
    seen = [line for w in pool for line in w.log().splitlines() if SAVEPOINT_SEEN in line]
    assert not seen, f"worker processes sent savepoints: {seen[:3]}"
    assert not savepoint_writers, f"backends wrote in savepoints: {sorted(savepoint_writers)}"
    assert minted == 0
