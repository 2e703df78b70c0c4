"""What the relay and the broker worker need from a broker, whichever it is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqla_queue.errors import SqlaQueueError

from .messages import JobMessage
from .routes import Route


class BrokerUnavailableError(SqlaQueueError):
    """Cannot reach the broker at {url}: {detail}. Check that it runs and the URL (nats://HOST:4222 or amqp://USER:PASSWORD@HOST:5672/)."""  # noqa: E501


@dataclass
class PublishOutcome:
    """The jobs of a batch the broker confirmed, and what went wrong with the others."""

    confirmed: list[int] = field(default_factory=list)
    duplicates: int = 0
    """Confirmed publishes the broker recognised as copies of an earlier one (NATS only)."""
    errors: list[str] = field(default_factory=list)


class Publisher(Protocol):
    """The relay's side of a broker."""

    async def connect(self) -> None: ...

    async def publish(
        self, route: Route, messages: Sequence[JobMessage], timeout: float
    ) -> PublishOutcome: ...

    async def close(self) -> None: ...


class Delivery:
    """One delivered message, and what the worker may answer to it."""

    body: bytes
    deliveries: int
    """How many times this job was handed to a worker, this time included (1 the first)."""

    async def ack(self) -> None:
        raise NotImplementedError

    async def retry(self, delay: float) -> None:
        """Deliver it again after `delay` seconds."""
        raise NotImplementedError

    async def dead(self, error: str) -> None:
        """Move it to the route's dead-letter place (and drop it from the route)."""
        raise NotImplementedError

    async def keep_alive(self) -> None:
        """Tell the broker the job is still being worked on (NATS ack wait)."""


class Source(Protocol):
    """The broker worker's side of a broker."""

    async def connect(self) -> None: ...

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]: ...

    async def pending(self) -> int: ...

    async def close(self) -> None: ...
