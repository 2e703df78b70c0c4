"""NATS JetStream: the relay's publisher and the broker worker's source (needs `nats-py`).

Publishing: `Nats-Msg-Id` is the job id, so JetStream drops a second copy that arrives
within the stream's duplicate window (a relay that died after the publish ack and before
its delete commits). Consuming: one durable pull consumer per route, explicit acks, an
ack wait equal to the worker's lease (kept alive with in-progress acks while a handler
runs), `nak` with the retry policy's delay, dead letters in a stream of their own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from sqla_queue.brokers.messages import JobMessage
from sqla_queue.brokers.routes import NATS_CONSUMER, Route
from sqla_queue.brokers.transport import (
    Delivery,
    PublishOutcome,
    client_library,
    dead_reason,
    unavailable,
)
from sqla_queue.errors import ConfigurationError

log = logging.getLogger("sqla_queue.brokers.nats")

DEFAULT_DUPLICATE_WINDOW = 120.0
"""Seconds JetStream remembers message ids (its own default): the de-duplication window."""


def _import() -> Any:
    return client_library("nats", "NATS", "nats")


async def _log_error(exc: Exception) -> None:
    log.debug("NATS: %r", exc)


async def _log_reconnected() -> None:
    log.info("NATS connection back")


async def connect(url: str) -> Any:
    """A NATS connection, or a one-line error naming the URL."""
    nats = _import()
    holder: list[Any] = []

    async def disconnected() -> None:
        if holder and not holder[0].is_closed:  # a close() of ours is no outage
            log.warning("NATS connection lost; reconnecting")

    try:
        nc = await nats.connect(
            url,
            connect_timeout=5,
            max_reconnect_attempts=2,
            error_cb=_log_error,
            disconnected_cb=disconnected,
            reconnected_cb=_log_reconnected,
        )
    except Exception as exc:
        raise unavailable(url, exc) from None
    # Fail fast on the first connect, but once connected ride out any outage.
    nc.options["max_reconnect_attempts"] = -1
    holder.append(nc)
    return nc


async def ensure_streams(js: Any, route: Route, duplicate_window: float) -> None:
    """Create the route's stream and its dead-letter stream if they do not exist."""
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    wanted = (
        StreamConfig(
            name=route.stream,
            subjects=[route.subject],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=duplicate_window,
        ),
        StreamConfig(
            name=route.dead_stream,
            subjects=[route.dead_subject],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
        ),
    )
    for config in wanted:
        try:
            await js.stream_info(config.name)
            continue
        except NotFoundError:
            pass
        try:
            await js.add_stream(config)
        except Exception as exc:
            raise ConfigurationError(
                detail=f"cannot create JetStream stream {config.name} for subjects "
                f"{config.subjects}: {exc} (another stream may already take these subjects)"
            ) from None


class NatsPublisher:
    """Publishes relayed jobs to JetStream and waits for every publish ack."""

    def __init__(self, url: str, duplicate_window: float = DEFAULT_DUPLICATE_WINDOW) -> None:
        self.url = url
        self.duplicate_window = duplicate_window
        self._nc: Any = None
        self._js: Any = None
        self._ready: set[Route] = set()

    async def connect(self) -> None:
        self._nc = await connect(self.url)
        self._js = self._nc.jetstream()

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def publish(
        self, route: Route, messages: Sequence[JobMessage], timeout: float
    ) -> PublishOutcome:
        if route not in self._ready:
            await ensure_streams(self._js, route, self.duplicate_window)
            self._ready.add(route)
        futures = [
            await self._js.publish_async(
                route.subject,
                message.encode(),
                headers={"Nats-Msg-Id": message.message_id},
                stream=route.stream,
            )
            for message in messages
        ]
        outcome = PublishOutcome()
        _, pending = await asyncio.wait(futures, timeout=timeout) if futures else (set(), set())
        for message, future in zip(messages, futures, strict=True):
            if future in pending:
                future.cancel()
                outcome.errors.append(f"job {message.id}: no publish ack within {timeout}s")
            elif future.exception() is not None:
                outcome.errors.append(f"job {message.id}: {future.exception()}")
            else:
                outcome.confirmed.append(message.id)
                if future.result().duplicate:
                    outcome.duplicates += 1
        return outcome


CARRIED_HEADER = "Sqlaq-Carried"
"""A snoozed copy's attempts before the snoozed one (its deliveries count on from there)."""
NOT_BEFORE_HEADER = "Sqlaq-Not-Before"
"""When a snoozed copy may run (Unix time): its first delivery is handed back until then."""


class _NatsDelivery(Delivery):
    def __init__(self, source: NatsSource, msg: Any) -> None:
        self._source = source
        self._msg = msg
        self.body = bytes(msg.data)
        delivered = int(msg.metadata.num_delivered)
        headers = msg.headers or {}
        if NOT_BEFORE_HEADER in headers:
            # a snoozed copy: its first delivery is always handed back (`hold`), uncounted
            carried = int(headers.get(CARRIED_HEADER) or 0)
            self.deliveries = carried + max(delivered - 1, 1)
            if delivered == 1:
                self.due_in = max(float(headers[NOT_BEFORE_HEADER]) - time.time(), 0.0)
        else:
            self.deliveries = delivered

    async def ack(self) -> None:
        await self._msg.ack_sync(timeout=10)

    async def retry(self, delay: float) -> None:
        await self._msg.nak(delay=max(delay, 0.0))

    async def keep_alive(self) -> None:
        await self._msg.in_progress()

    async def snooze(self, delay: float) -> None:
        # JetStream cannot change a message's delivery count: publish a copy that carries
        # the attempts so far and when it is due, then drop this one.
        headers = {
            "Nats-Msg-Id": f"snooze-{self._msg.metadata.sequence.stream}",
            CARRIED_HEADER: str(self.deliveries - 1),
            NOT_BEFORE_HEADER: repr(time.time() + max(delay, 0.0)),
        }
        route = self._source.route
        await self._source.js.publish(
            route.subject, self.body, timeout=10, stream=route.stream, headers=headers
        )
        await self._msg.ack_sync(timeout=10)

    async def hold(self) -> None:
        await self._msg.nak(delay=self.due_in or 0.0)

    async def dead(self, error: str) -> None:
        headers = {"Nats-Msg-Id": f"dead-{self._msg.metadata.sequence.stream}"}
        headers["Sqlaq-Error"] = dead_reason(error)
        headers["Sqlaq-Deliveries"] = str(self.deliveries)
        route = self._source.route
        await self._source.js.publish(
            route.dead_subject, self.body, timeout=10, stream=route.dead_stream, headers=headers
        )
        await self._msg.term()


class NatsSource:
    """The route's durable pull consumer, shared by every broker worker of the queue."""

    def __init__(self, url: str, route: Route, ack_wait: float) -> None:
        self.url = url
        self.route = route
        self.ack_wait = ack_wait
        self._nc: Any = None
        self.js: Any = None
        self._sub: Any = None

    async def connect(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig

        self._nc = await connect(self.url)
        self.js = self._nc.jetstream()
        await ensure_streams(self.js, self.route, DEFAULT_DUPLICATE_WINDOW)
        config = ConsumerConfig(
            durable_name=NATS_CONSUMER,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=-1,  # the worker enforces each job's own max_attempts
            max_ack_pending=-1,
        )
        self._sub = await self.js.pull_subscribe(
            self.route.subject, durable=NATS_CONSUMER, stream=self.route.stream, config=config
        )

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        from nats.errors import TimeoutError as NatsTimeoutError

        try:
            msgs = await self._sub.fetch(batch, timeout=timeout)
        except (NatsTimeoutError, asyncio.TimeoutError):
            return []
        return [_NatsDelivery(self, msg) for msg in msgs]

    async def pending(self) -> int:
        """Messages not yet delivered, or delivered and not yet acked (by any worker)."""
        info = await self.js.consumer_info(self.route.stream, NATS_CONSUMER)
        return int(info.num_pending) + int(info.num_ack_pending)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
