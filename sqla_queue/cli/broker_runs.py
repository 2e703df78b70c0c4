"""The broker side of `sqla-queue relay` and `sqla-queue worker --from` (imported only when
used, so the broker clients stay optional): each takes the config dataclass the Python API does."""

from __future__ import annotations

import click
from sqlalchemy import Engine

from sqla_queue.brokers.relay import Relay, RelayConfig, RelayStats
from sqla_queue.brokers.worker import BrokerWorker, BrokerWorkerConfig
from sqla_queue.errors import ConfigurationError
from sqla_queue.registry import Registry
from sqla_queue.worker.config import WorkerConfig


def run_relay(engine: Engine, config: RelayConfig) -> RelayStats:
    """Relay with `config` until stopped (or, with burst, until nothing is due); disposes
    of `engine`."""
    try:
        return Relay(engine, config).run()
    finally:
        engine.dispose()


def broker_worker_config(
    broker_url: str, worker: WorkerConfig, ack_wait: float, dedup: bool | None
) -> BrokerWorkerConfig:
    """The broker worker `sqla-queue worker --from URL` runs: the table worker's settings
    (one queue, concurrency, poll interval, burst, shutdown timeout) with the broker's own."""
    names = worker.queues or []
    if len(names) != 1:
        raise ConfigurationError(detail="--from runs one routed queue: pass it as -q NAME")
    return BrokerWorkerConfig(
        broker_url=broker_url,
        queue=names[0],
        concurrency=worker.concurrency,
        ack_wait=ack_wait,
        poll_interval=min(worker.poll_interval, 1.0),
        burst=worker.burst,
        shutdown_timeout=worker.shutdown_timeout,
        dedup=dedup,
    )


def run_broker_worker(engine: Engine, registry: Registry, config: BrokerWorkerConfig) -> None:
    """Run `config`'s routed queue from its broker; disposes of `engine`."""
    try:
        stats = BrokerWorker(engine, registry, config).run()
    finally:
        engine.dispose()
    if config.burst:
        click.echo(
            f"done: {stats.succeeded} succeeded, {stats.retried} retried, {stats.failed} "
            f"failed, {stats.duplicates} duplicates skipped",
            err=True,
        )
