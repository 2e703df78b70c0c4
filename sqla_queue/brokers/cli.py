"""The broker side of `sqla-queue relay` and `sqla-queue worker --from` (kept out of cli.py)."""

from __future__ import annotations

import click
from sqlalchemy import Engine

from sqla_queue.errors import ConfigurationError
from sqla_queue.registry import Registry

from .relay import Relay, RelayConfig, RelayStats
from .worker import BrokerWorker, BrokerWorkerConfig


def run_relay(
    engine: Engine,
    broker_url: str,
    batch: int,
    poll_interval: float,
    publish_timeout: float,
    duplicate_window: float,
    burst: bool,
    poll_only: bool,
) -> RelayStats:
    config = RelayConfig(
        broker_url=broker_url,
        batch=batch,
        poll_interval=poll_interval,
        publish_timeout=publish_timeout,
        duplicate_window=duplicate_window,
        burst=burst,
        poll_only=poll_only,
    )
    try:
        return Relay(engine, config).run()
    finally:
        engine.dispose()


def run_broker_worker(
    engine: Engine,
    registry: Registry,
    broker_url: str,
    queues: str | None,
    concurrency: int,
    lease: float,
    poll_interval: float,
    burst: bool,
    shutdown_timeout: float,
    dedup: bool | None,
) -> None:
    names = [q.strip() for q in (queues or "").split(",") if q.strip()]
    if len(names) != 1:
        raise ConfigurationError(detail="--from runs one routed queue: pass it as -q NAME")
    config = BrokerWorkerConfig(
        broker_url=broker_url,
        queue=names[0],
        concurrency=concurrency,
        lease=lease,
        poll_interval=min(poll_interval, 1.0),
        burst=burst,
        shutdown_timeout=shutdown_timeout,
        dedup=dedup,
    )
    try:
        stats = BrokerWorker(engine, registry, config).run()
    finally:
        engine.dispose()
    if burst:
        click.echo(
            f"done: {stats.succeeded} succeeded, {stats.retried} retried, {stats.failed} "
            f"failed, {stats.duplicates} duplicates skipped",
            err=True,
        )
