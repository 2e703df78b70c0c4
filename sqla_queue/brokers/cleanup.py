"""Deleting what the relay and broker workers created for a route (tests, benchmarks, teardown).

Deletes the messages in them too: use it only on a route nothing needs any more.
"""

from __future__ import annotations

import contextlib

from sqla_queue.brokers.routes import NATS, Route


async def delete_route(url: str, route: Route) -> None:
    """Delete the route's streams (NATS) or its queues and exchange (RabbitMQ), if present."""
    if route.kind == NATS:
        from sqla_queue.brokers.nats import connect

        nc = await connect(url)
        for stream in (route.stream, route.dead_stream):
            with contextlib.suppress(Exception):  # absent: nothing to delete
                await nc.jetstream().delete_stream(stream)
        await nc.close()
        return
    from sqla_queue.brokers.amqp import RETRY_LADDER, connect

    connection = await connect(url)
    names = [route.amqp_queue, route.amqp_dead_queue]
    names += [route.amqp_retry_queue(step) for step in RETRY_LADDER]
    for name in names:
        channel = await connection.channel()  # a failed delete closes its channel
        with contextlib.suppress(Exception):
            await channel.queue_delete(name)
    channel = await connection.channel()
    with contextlib.suppress(Exception):
        await channel.exchange_delete(route.exchange)
    await connection.close()
