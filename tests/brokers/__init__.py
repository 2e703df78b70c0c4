"""The outbox relay and broker workers (sqla_queue.brokers), and routed queues."""
