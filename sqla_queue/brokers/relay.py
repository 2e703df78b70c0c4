"""The outbox relay: moves committed jobs of routed queues to their broker.

Per routed queue, in one transaction: lock up to `batch` due jobs (FOR UPDATE SKIP LOCKED,
so several relays split the rows), publish each, wait for the broker's confirmation of
every one, delete the confirmed ones, commit. A relay that dies at any point leaves its
rows locked only until PostgreSQL sees the connection go: they are published again, and
the copy is dropped by JetStream's message-id de-duplication (NATS, within the duplicate
window) or skipped by the broker worker (RabbitMQ). Wakes on NOTIFY, else polls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, RootTransaction

from sqla_queue.brokers.kinds import BROKER_KINDS, broker_kind, parse_route
from sqla_queue.brokers.loop import BrokerLoop
from sqla_queue.brokers.messages import JobMessage
from sqla_queue.brokers.routes import Route, redact
from sqla_queue.brokers.transport import Publisher
from sqla_queue.db.migrate import check_schema
from sqla_queue.db.queries import brokers as queries
from sqla_queue.errors import ConfigurationError
from sqla_queue.runtime.listener import Listener

log = logging.getLogger("sqla_queue.brokers.relay")
# Built once: constructing a Core statement costs more than a small round trip.
_ROUTED = queries.routed_queues()
_CLAIM = queries.claim_for_relay()
_DELETE = queries.delete_relayed()


@dataclass
class RelayConfig:
    """How a relay runs; every field is a `sqla-queue relay` option."""

    broker_url: str
    batch: int = 500
    """Jobs locked, published and deleted per transaction at most."""
    poll_interval: float = 1.0
    """Seconds between polls when idle (delayed jobs become due without a NOTIFY)."""
    publish_timeout: float = 10.0
    """Seconds to wait for the broker's confirmations of a batch before giving it back."""
    duplicate_window: float = 120.0
    """NATS only: the duplicate window of a stream the relay creates."""
    burst: bool = False
    """Exit once a pass over every routed queue finds nothing due."""
    poll_only: bool = False
    """Never LISTEN (PgBouncer in transaction pooling mode)."""

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ConfigurationError(detail=f"batch must be at least 1, got {self.batch}")
        if self.poll_interval <= 0 or self.publish_timeout <= 0:
            raise ConfigurationError(detail="poll interval and publish timeout must be positive")


@dataclass
class RelayStats:
    published: int = 0
    """Jobs the broker confirmed and the relay deleted."""
    duplicates: int = 0
    """Publishes the broker recognised as a copy of an earlier one (NATS) and dropped."""
    failed_publishes: int = 0


class Relay(BrokerLoop):
    """Moves the jobs of routed queues (of this broker's kind) from PostgreSQL to the broker."""

    def __init__(self, engine: Engine, config: RelayConfig) -> None:
        super().__init__()
        self.engine = engine
        self.config = config
        self.kind = broker_kind(config.broker_url)
        self.stats = RelayStats()
        self._conn: Connection | None = None
        self._wake: asyncio.Event | None = None

    def _publisher(self) -> Publisher:
        publisher = BROKER_KINDS[self.kind].publisher
        return publisher(self.config.broker_url, self.config.duplicate_window)

    def run(self, install_signal_handlers: bool | None = None) -> RelayStats:
        """Relay until SIGTERM/SIGINT, or with burst until nothing is due."""
        check_schema(self.engine)
        self._run_loop(install_signal_handlers)
        return self.stats

    async def _main(self) -> None:
        assert self._stopping is not None
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        publisher = self._publisher()
        await publisher.connect()
        wake = self._wake
        listener = None
        if not self.config.poll_only:
            listener = Listener(self.engine, None, lambda: _call_soon(loop, wake.set))
            listener.start()
        log.info(
            "relay %s started: routed queues to %s (batch %d)",
            os.getpid(),
            redact(self.config.broker_url),
            self.config.batch,
        )
        backoff = 0.1
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    moved = await self._pass(publisher)
                    backoff = 0.1
                except ConfigurationError:
                    raise
                except Exception as exc:
                    log.warning("relay pass failed (%r); retrying in %.1fs", exc, backoff)
                    await asyncio.to_thread(self._drop_connection)
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                if moved:
                    continue
                if self.config.burst:
                    return
                await self._sleep(self.config.poll_interval)
        finally:
            if listener is not None:
                listener.stop()
            await asyncio.to_thread(self._drop_connection)
            await publisher.close()
            log.info(
                "relay stopped: %d published, %d duplicates dropped by the broker",
                self.stats.published,
                self.stats.duplicates,
            )

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        assert self._stopping is not None
        waits = [asyncio.ensure_future(e.wait()) for e in (self._wake, self._stopping)]
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()

    async def _pass(self, publisher: Publisher) -> int:
        """One batch from each routed queue; returns how many jobs moved."""
        moved = 0
        for queue, route in await asyncio.to_thread(self._routes):
            if self._stopping is not None and self._stopping.is_set():
                break
            moved += await self._relay_batch(publisher, queue, route)
        return moved

    async def _relay_batch(self, publisher: Publisher, queue: str, route: Route) -> int:
        transaction, rows = await asyncio.to_thread(self._claim, queue)
        try:
            if not rows:
                return 0
            messages = [JobMessage.from_row(row) for row in rows]
            outcome = await publisher.publish(route, messages, self.config.publish_timeout)
            await asyncio.to_thread(self._delete, outcome.confirmed)
            await asyncio.to_thread(transaction.commit)
        finally:
            if transaction.is_active:
                await asyncio.to_thread(transaction.rollback)
        self.stats.published += len(outcome.confirmed)
        self.stats.duplicates += outcome.duplicates
        if outcome.errors:
            self.stats.failed_publishes += len(outcome.errors)
            log.warning(
                "%d of %d job(s) of queue %r not confirmed by the broker (they stay queued): %s",
                len(outcome.errors),
                len(messages),
                queue,
                outcome.errors[0],
            )
            raise RuntimeError("the broker did not confirm every publish")
        return len(outcome.confirmed)

    # -- PostgreSQL (run in a thread) ------------------------------------------------------

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self.engine.connect()
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception as exc:  # it is being thrown away anyway
                log.debug("closing the relay's connection: %r", exc)
            self._conn = None

    def _routes(self) -> list[tuple[str, Route]]:
        conn = self._connection()
        with conn.begin():
            rows = conn.execute(_ROUTED, {"prefix": f"{self.kind}:"}).all()
        return [(str(name), parse_route(str(route))) for name, route in rows]

    def _claim(self, queue: str) -> tuple[RootTransaction, list[Any]]:
        conn = self._connection()
        transaction = conn.begin()
        params = {"queue_name": queue, "limit": self.config.batch}
        return transaction, list(conn.execute(_CLAIM, params))

    def _delete(self, job_ids: list[int]) -> None:
        if job_ids:
            self._connection().execute(_DELETE, {"job_ids": job_ids})

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("received %s: finishing the batch in hand", signal.Signals(signum).name)
            self.stop()
            return
        os._exit(1)  # a second signal: the open transaction rolls back, nothing is lost


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Schedule `callback` on `loop` from the listener's thread."""
    loop.call_soon_threadsafe(callback)
