"""A routed queue's destination in a broker, and the names derived from it.

A queue whose `route` is set is an outbox: table workers never claim its jobs; `sqla-queue
relay` moves them to the broker, and `sqla-queue worker --from URL` runs them from there.

    nats:SUBJECT                  JetStream subject, e.g. nats:jobs.out
    amqp:EXCHANGE/ROUTING_KEY     RabbitMQ direct exchange and routing key, e.g. amqp:jobs/out

Derived names (created on first use by the relay or a worker, whichever comes first):

    NATS   stream SQLAQ_<subject, dots as underscores>, subject SUBJECT;
           durable pull consumer `sqlaq_worker`, shared by every worker of the route;
           dead letters in stream SQLAQ_DEAD_<...>, subject sqlaq.dead.SUBJECT.
    AMQP   durable quorum queue sqlaq.EXCHANGE.ROUTING_KEY bound to the direct exchange;
           retry queues sqlaq.EXCHANGE.ROUTING_KEY.retry.<N>s (per-queue TTL, dead-lettered
           back to the exchange); dead letters in sqlaq.EXCHANGE.ROUTING_KEY.dead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from sqla_queue.errors import ConfigurationError

NATS: Literal["nats"] = "nats"
AMQP: Literal["amqp"] = "amqp"
ROUTE_EXAMPLES = (
    "nats:SUBJECT (e.g. nats:jobs.out) or amqp:EXCHANGE/ROUTING_KEY (e.g. amqp:jobs/out)"
)
NATS_CONSUMER = "sqlaq_worker"
"""The durable pull consumer every broker worker of a NATS route shares."""
MAX_NAME = 200

_NATS_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")
_AMQP_NAME = re.compile(r"^[A-Za-z0-9_\-.:]+$")


@dataclass(frozen=True)
class Route:
    """Where a routed queue's jobs go: a NATS subject or an AMQP exchange and routing key."""

    kind: Literal["nats", "amqp"]
    subject: str = ""
    exchange: str = ""
    routing_key: str = ""

    def __str__(self) -> str:
        if self.kind == NATS:
            return f"nats:{self.subject}"
        return f"amqp:{self.exchange}/{self.routing_key}"

    # -- NATS JetStream --
    @property
    def stream(self) -> str:
        return "SQLAQ_" + self.subject.replace(".", "_")

    @property
    def dead_stream(self) -> str:
        return "SQLAQ_DEAD_" + self.subject.replace(".", "_")

    @property
    def dead_subject(self) -> str:
        return "sqlaq.dead." + self.subject

    # -- RabbitMQ --
    @property
    def amqp_queue(self) -> str:
        return f"sqlaq.{self.exchange}.{self.routing_key}"

    @property
    def amqp_dead_queue(self) -> str:
        return self.amqp_queue + ".dead"

    def amqp_retry_queue(self, seconds: int) -> str:
        return f"{self.amqp_queue}.retry.{seconds}s"


def _bad(value: str, why: str) -> ConfigurationError:
    return ConfigurationError(detail=f"route {value!r} {why}; use {ROUTE_EXAMPLES}")


def parse_route(value: str) -> Route:
    """Parse and check a route; raises `ConfigurationError` naming the problem and the form."""
    kind, sep, rest = value.partition(":")
    if not sep or kind not in (NATS, AMQP):
        raise _bad(value, "does not start with nats: or amqp:")
    if not rest or len(rest) > MAX_NAME:
        raise _bad(value, f"needs a destination of 1 to {MAX_NAME} characters after {kind}:")
    if kind == NATS:
        tokens = rest.split(".")
        if not all(_NATS_TOKEN.match(token) for token in tokens):
            raise _bad(
                value,
                "is not a NATS subject to publish to (dot-separated tokens of letters, "
                "digits, - and _; no wildcards or spaces)",
            )
        return Route(kind=NATS, subject=rest)
    exchange, slash, routing_key = rest.partition("/")
    if not slash or not exchange or not routing_key:
        raise _bad(value, "needs both an exchange and a routing key, as EXCHANGE/ROUTING_KEY")
    if not _AMQP_NAME.match(exchange) or not _AMQP_NAME.match(routing_key):
        raise _bad(value, "has characters other than letters, digits, -, _, . and :")
    if exchange.startswith("amq."):
        raise _bad(value, "names a reserved exchange (amq.*)")
    return Route(kind=AMQP, exchange=exchange, routing_key=routing_key)


def broker_kind(url: str) -> Literal["nats", "amqp"]:
    """`nats` or `amqp` from a broker URL's scheme, or a clear error."""
    scheme = url.partition("://")[0].lower()
    if scheme in ("nats", "tls"):
        return NATS
    if scheme in ("amqp", "amqps"):
        return AMQP
    raise ConfigurationError(
        detail=f"broker URL {url!r} is neither nats:// nor amqp://; pass e.g. "
        "nats://127.0.0.1:4222 or amqp://guest:guest@127.0.0.1:5672/"
    )


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
