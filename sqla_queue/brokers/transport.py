"""What the relay and the broker worker need from a broker, whichever it is."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqla_queue.brokers.messages import JobMessage
from sqla_queue.brokers.routes import Route, redact
from sqla_queue.errors import ConfigurationError, SqlaQueueError


class BrokerUnavailableError(SqlaQueueError):
    """Cannot reach the broker at {url}: {detail}. Check that it runs and the URL (nats://HOST:4222 or amqp://USER:PASSWORD@HOST:5672/)."""  # noqa: E501


def unavailable(url: str, exc: BaseException) -> BrokerUnavailableError:
    """The one-line error for a broker at `url` (its password hidden) that did not answer."""
    return BrokerUnavailableError(url=redact(url), detail=str(exc) or type(exc).__name__)


def client_library(module: str, broker: str, extra: str) -> Any:
    """The broker's client library `module`, imported when first used (an optional
    dependency), or `ConfigurationError` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigurationError(
            detail=f"{broker} support is not installed; pip install 'sqla-queue[{extra}]'"
        ) from None


def dead_reason(error: str) -> str:
    """What a dead-lettered message carries of the error that killed it: its last line, at
    most 500 characters ("?" for none)."""
    return error.strip().splitlines()[-1][:500] if error.strip() else "?"


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
    """How many attempts of this job were handed to a worker, this one included (1 the
    first); a snoozed or deferred attempt is not counted."""
    due_in: float | None = None
    """Seconds until this delivery may run (a NATS snoozed copy's first delivery: the
    broker cannot delay a publish), or None: run it now. See `hold`."""

    async def ack(self) -> None:
        raise NotImplementedError

    async def retry(self, delay: float) -> None:
        """Deliver it again after `delay` seconds."""
        raise NotImplementedError

    async def snooze(self, delay: float) -> None:
        """Deliver it again after `delay` seconds without counting this attempt (a `Snooze`,
        or a task this worker has no handler for)."""
        raise NotImplementedError

    async def hold(self) -> None:
        """Hand back a delivery not yet due (`due_in`): delivered again once it is, and not
        counted as an attempt."""
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
