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

Parsing a route, and what publishes to and consumes from each kind: `sqla_queue.brokers.kinds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

KindName = Literal["nats", "amqp"]
NATS: Literal["nats"] = "nats"
AMQP: Literal["amqp"] = "amqp"
NATS_CONSUMER = "sqlaq_worker"
"""The durable pull consumer every broker worker of a NATS route shares."""


@dataclass(frozen=True)
class Route:
    """Where a routed queue's jobs go: a NATS subject or an AMQP exchange and routing key."""

    kind: KindName
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


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
