"""Past one PostgreSQL: a transactional outbox relay to NATS JetStream or RabbitMQ.

A queue with a route (`sqla-queue queues set out --route nats:jobs.out`) keeps taking jobs
from `enqueue` in the application's transactions; table workers leave them alone;
`sqla-queue relay` moves them to the broker once committed; `sqla-queue worker --from URL`
runs them there with the same registry. See `routes` for the names derived from a route.
"""

from __future__ import annotations

from sqla_queue.brokers.kinds import parse_route
from sqla_queue.brokers.relay import Relay, RelayConfig, RelayStats
from sqla_queue.brokers.routes import Route
from sqla_queue.brokers.worker import BrokerWorker, BrokerWorkerConfig, BrokerWorkerStats

__all__ = [
    "BrokerWorker",
    "BrokerWorkerConfig",
    "BrokerWorkerStats",
    "Relay",
    "RelayConfig",
    "RelayStats",
    "Route",
    "parse_route",
]
