"""RabbitMQ: the relay's publisher and the broker worker's source (needs `aio-pika`).

Publishing: persistent messages with the job id as `message_id`, `mandatory` (an
unroutable message is an error, not a silent drop), each confirmed by the broker
(publisher confirms) before the relay deletes the job. The route's queue is a durable
quorum queue, declared by whichever of relay and worker comes first.

Consuming: manual acks after the handler; a failed attempt is republished to a retry
queue whose TTL dead-letters it back to the exchange (delays rounded up to `RETRY_LADDER`),
then acked; a job past its max attempts goes to the dead-letter queue. RabbitMQ cannot drop
a duplicate on publish: the broker worker skips a job id it has already run (broker_done).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from sqla_queue.brokers.messages import CONTENT_TYPE, JobMessage
from sqla_queue.brokers.routes import Route
from sqla_queue.brokers.transport import (
    Delivery,
    PublishOutcome,
    client_library,
    dead_reason,
    unavailable,
)
from sqla_queue.errors import ConfigurationError

log = logging.getLogger("sqla_queue.brokers.amqp")

RETRY_LADDER = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
"""Seconds of the retry queues; a retry waits for the first step at or above its delay."""
FAILURES_HEADER = "x-sqlaq-failures"


def _import() -> Any:
    return client_library("aio_pika", "RabbitMQ", "amqp")


async def connect(url: str) -> Any:
    """A robust (reconnecting) AMQP connection, or a one-line error naming the URL."""
    aio_pika = _import()
    try:
        # A quiet plain connection first: the robust one logs and retries where we want one
        # error line; it is used once this one worked.
        transport_log = logging.getLogger("aiormq.connection")
        level = transport_log.level
        transport_log.setLevel(logging.CRITICAL)
        try:
            await (await aio_pika.connect(url, timeout=10)).close()
        finally:
            transport_log.setLevel(level)
        return await aio_pika.connect_robust(url, timeout=10)
    except Exception as exc:
        raise unavailable(url, exc) from None


def retry_step(delay: float) -> int:
    """The retry queue (seconds) a retry after `delay` seconds waits in."""
    return next((step for step in RETRY_LADDER if step >= delay), RETRY_LADDER[-1])


async def declare_route(channel: Any, route: Route) -> tuple[Any, Any]:
    """The route's exchange and quorum queue (bound), and its dead-letter queue."""
    aio_pika = _import()
    try:
        exchange = await channel.declare_exchange(
            route.exchange, aio_pika.ExchangeType.DIRECT, durable=True
        )
        queue = await channel.declare_queue(
            route.amqp_queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(exchange, route.routing_key)
        await channel.declare_queue(route.amqp_dead_queue, durable=True)
    except Exception as exc:
        raise ConfigurationError(
            detail=f"cannot declare RabbitMQ exchange {route.exchange!r} and queue "
            f"{route.amqp_queue!r}: {exc} (do they exist with other settings?)"
        ) from None
    return exchange, queue


async def declare_retry_queues(channel: Any, route: Route) -> list[Any]:
    return [
        await channel.declare_queue(
            route.amqp_retry_queue(step),
            durable=True,
            arguments={
                "x-message-ttl": step * 1000,
                "x-dead-letter-exchange": route.exchange,
                "x-dead-letter-routing-key": route.routing_key,
            },
        )
        for step in RETRY_LADDER
    ]


def _persistent(body: bytes, message_id: str, headers: dict[str, Any] | None = None) -> Any:
    aio_pika = _import()
    return aio_pika.Message(
        body,
        message_id=message_id,
        content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=headers or {},
    )


class AmqpPublisher:
    """Publishes relayed jobs to RabbitMQ with publisher confirms."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: Any = None
        self._channel: Any = None
        self._exchanges: dict[Route, Any] = {}

    async def connect(self) -> None:
        self._connection = await connect(self.url)
        self._channel = await self._connection.channel(publisher_confirms=True)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()

    async def publish(
        self, route: Route, messages: Sequence[JobMessage], timeout: float
    ) -> PublishOutcome:
        exchange = self._exchanges.get(route)
        if exchange is None:
            exchange, _ = await declare_route(self._channel, route)
            self._exchanges[route] = exchange
        confirms = [
            asyncio.ensure_future(
                exchange.publish(
                    _persistent(message.encode(), message.message_id),
                    route.routing_key,
                    mandatory=True,
                    timeout=timeout,
                )
            )
            for message in messages
        ]
        results = await asyncio.gather(*confirms, return_exceptions=True)
        outcome = PublishOutcome()
        for message, result in zip(messages, results, strict=True):
            if isinstance(result, BaseException):
                outcome.errors.append(f"job {message.id}: {result!r}")
            else:
                outcome.confirmed.append(message.id)
        return outcome


class _AmqpDelivery(Delivery):
    def __init__(self, source: AmqpSource, message: Any) -> None:
        self._source = source
        self._message = message
        self.body = bytes(message.body)
        headers = message.headers or {}
        failures = int(headers.get(FAILURES_HEADER) or 0)
        # Quorum queues count redeliveries (a worker died or its channel closed mid-job).
        self.deliveries = failures + int(headers.get("x-delivery-count") or 0) + 1

    async def ack(self) -> None:
        await self._message.ack()

    async def _republish(self, queue_name: str, headers: dict[str, Any]) -> None:
        message = _persistent(self.body, self._message.message_id or "", headers)
        await self._source.publish_channel.default_exchange.publish(
            message, routing_key=queue_name, mandatory=True, timeout=10
        )
        await self._message.ack()

    async def retry(self, delay: float) -> None:
        # The copy starts a fresh delivery count: carry every attempt so far in a header.
        queue_name = self._source.route.amqp_retry_queue(retry_step(delay))
        await self._republish(queue_name, {FAILURES_HEADER: self.deliveries})

    async def snooze(self, delay: float) -> None:
        # The copy carries the attempts before this one: its first delivery is this attempt
        # again. A delay past the longest retry queue waits that long, and runs earlier.
        queue_name = self._source.route.amqp_retry_queue(retry_step(delay))
        await self._republish(queue_name, {FAILURES_HEADER: self.deliveries - 1})

    async def hold(self) -> None:  # never due later: RabbitMQ delays with its retry queues
        raise NotImplementedError("a RabbitMQ delivery is always due")

    async def dead(self, error: str) -> None:
        headers = {"x-sqlaq-error": dead_reason(error), "x-sqlaq-deliveries": self.deliveries}
        await self._republish(self._source.route.amqp_dead_queue, headers)


class AmqpSource:
    """Consumes the route's quorum queue with a prefetch of the worker's concurrency."""

    def __init__(self, url: str, route: Route, prefetch: int) -> None:
        self.url = url
        self.route = route
        self.prefetch = prefetch
        self._connection: Any = None
        self._channel: Any = None
        self.publish_channel: Any = None
        self._queues: list[Any] = []
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()

    async def connect(self) -> None:
        self._connection = await connect(self.url)
        self._channel = await self._connection.channel()
        await self._channel.set_qos(prefetch_count=self.prefetch)
        self.publish_channel = await self._connection.channel(publisher_confirms=True)
        _, queue = await declare_route(self.publish_channel, self.route)
        retries = await declare_retry_queues(self.publish_channel, self.route)
        self._queues = [queue, *retries]
        consumed = await self._channel.get_queue(self.route.amqp_queue, ensure=False)
        await consumed.consume(self._inbox.put)

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        try:
            first = await asyncio.wait_for(self._inbox.get(), timeout)
        except asyncio.TimeoutError:
            return []
        got: list[Delivery] = [_AmqpDelivery(self, first)]
        while len(got) < batch and not self._inbox.empty():
            got.append(_AmqpDelivery(self, self._inbox.get_nowait()))
        return got

    async def pending(self) -> int:
        """Messages ready in the route's queue and its retry queues (not those held by
        other workers' handlers)."""
        total = 0
        for queue in self._queues:
            declared = await self.publish_channel.declare_queue(
                queue.name, durable=True, arguments=queue.arguments
            )
            total += int(declared.declaration_result.message_count or 0)
        return total + self._inbox.qsize()

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
