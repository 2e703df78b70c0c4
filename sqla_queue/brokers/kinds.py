"""The broker kinds: how each kind's URLs and routes are spelled, and what publishes to it
and consumes from it (`BROKER_KINDS`, read by the relay, the broker worker and the CLI).

A new kind is one entry in `BROKER_KINDS` and its module. Each kind's client module (nats-py,
aio-pika) is imported when that kind is used, so both stay optional.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqla_queue.brokers.routes import AMQP, NATS, KindName, Route
from sqla_queue.brokers.transport import Publisher, Source
from sqla_queue.errors import ConfigurationError

MAX_NAME = 200
"""The longest destination a route may name, after `kind:`."""

_NATS_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")
_AMQP_NAME = re.compile(r"^[A-Za-z0-9_\-.:]+$")


def _bad(value: str, why: str) -> ConfigurationError:
    return ConfigurationError(detail=f"route {value!r} {why}; use {ROUTE_EXAMPLES}")


def _nats_route(value: str, rest: str) -> Route:
    tokens = rest.split(".")
    if not all(_NATS_TOKEN.match(token) for token in tokens):
        raise _bad(
            value,
            "is not a NATS subject to publish to (dot-separated tokens of letters, "
            "digits, - and _; no wildcards or spaces)",
        )
    return Route(kind=NATS, subject=rest)


def _amqp_route(value: str, rest: str) -> Route:
    exchange, slash, routing_key = rest.partition("/")
    if not slash or not exchange or not routing_key:
        raise _bad(value, "needs both an exchange and a routing key, as EXCHANGE/ROUTING_KEY")
    if not _AMQP_NAME.match(exchange) or not _AMQP_NAME.match(routing_key):
        raise _bad(value, "has characters other than letters, digits, -, _, . and :")
    if exchange.startswith("amq."):
        raise _bad(value, "names a reserved exchange (amq.*)")
    return Route(kind=AMQP, exchange=exchange, routing_key=routing_key)


def _nats_publisher(url: str, duplicate_window: float) -> Publisher:
    from sqla_queue.brokers.nats import NatsPublisher

    return NatsPublisher(url, duplicate_window)


def _amqp_publisher(url: str, duplicate_window: float) -> Publisher:
    from sqla_queue.brokers.amqp import AmqpPublisher

    return AmqpPublisher(url)


def _nats_source(url: str, route: Route, ack_wait: float, prefetch: int) -> Source:
    from sqla_queue.brokers.nats import NatsSource

    return NatsSource(url, route, ack_wait=ack_wait)


def _amqp_source(url: str, route: Route, ack_wait: float, prefetch: int) -> Source:
    from sqla_queue.brokers.amqp import AmqpSource

    return AmqpSource(url, route, prefetch=prefetch)


@dataclass(frozen=True)
class BrokerKind:
    """One kind of broker: how its URLs and routes are spelled, and what publishes to it and
    consumes from it. The relay, the broker worker and the CLI read `BROKER_KINDS`, so a
    new kind is one entry there (and its module)."""

    name: KindName
    schemes: tuple[str, ...]
    """URL schemes that name this kind (`nats://`, `tls://`)."""
    route_form: str
    """The route's form, for help and errors: nats:SUBJECT."""
    route_example: str
    example_url: str
    dedup: bool
    """Whether a broker worker skips job ids already run unless told (--dedup/--no-dedup):
    on where the broker keeps no single copy per job itself."""
    parse: Callable[[str, str], Route]
    """(the whole route, the part after `name:`) -> the checked `Route`."""
    publisher: Callable[[str, float], Publisher]
    """(URL, duplicate window) -> the relay's publisher."""
    source: Callable[[str, Route, float, int], Source]
    """(URL, route, ack wait, prefetch) -> a broker worker's source."""


BROKER_KINDS: dict[str, BrokerKind] = {
    kind.name: kind
    for kind in (
        BrokerKind(
            name=NATS,
            schemes=("nats", "tls"),
            route_form="nats:SUBJECT",
            route_example="nats:jobs.out",
            example_url="nats://127.0.0.1:4222",
            dedup=False,  # JetStream's publish-side de-duplication keeps one copy per job
            parse=_nats_route,
            publisher=_nats_publisher,
            source=_nats_source,
        ),
        BrokerKind(
            name=AMQP,
            schemes=("amqp", "amqps"),
            route_form="amqp:EXCHANGE/ROUTING_KEY",
            route_example="amqp:jobs/out",
            example_url="amqp://guest:guest@127.0.0.1:5672/",
            dedup=True,
            parse=_amqp_route,
            publisher=_amqp_publisher,
            source=_amqp_source,
        ),
    )
}
"""Every broker kind a route may name, by the name its routes start with."""

ROUTE_EXAMPLES = " or ".join(
    f"{kind.route_form} (e.g. {kind.route_example})" for kind in BROKER_KINDS.values()
)


def parse_route(value: str) -> Route:
    """Parse and check a route; raises `ConfigurationError` naming the problem and the form."""
    name, sep, rest = value.partition(":")
    kind = BROKER_KINDS.get(name) if sep else None
    if kind is None:
        starts = " or ".join(f"{known}:" for known in BROKER_KINDS)
        raise _bad(value, f"does not start with {starts}")
    if not rest or len(rest) > MAX_NAME:
        raise _bad(value, f"needs a destination of 1 to {MAX_NAME} characters after {name}:")
    return kind.parse(value, rest)


def broker_kind(url: str) -> KindName:
    """The kind of broker a URL's scheme names (`nats`, `amqp`), or a clear error."""
    scheme = url.partition("://")[0].lower()
    for kind in BROKER_KINDS.values():
        if scheme in kind.schemes:
            return kind.name
    schemes = " nor ".join(f"{kind.name}://" for kind in BROKER_KINDS.values())
    examples = " or ".join(kind.example_url for kind in BROKER_KINDS.values())
    raise ConfigurationError(
        detail=f"broker URL {url!r} is neither {schemes}; pass e.g. {examples}"
    )
