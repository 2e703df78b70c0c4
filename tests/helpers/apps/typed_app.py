"""A registry of typed tasks for `sqla-queue enqueue --app helpers.apps.typed_app:registry`."""

from __future__ import annotations

import datetime as dt

from sqla_queue import Registry

registry = Registry()


@registry.task(name="shop.send_receipt", queue="emails", priority=7, max_attempts=9)
def send_receipt(order_id: int, when: dt.datetime) -> None:
    """A receipt for an order, sent at `when`."""
