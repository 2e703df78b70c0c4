"""The shop's background tasks. Run them with:

sqla-queue worker --app examples.shop.tasks:registry
"""

from __future__ import annotations

import logging
import os

from sqlalchemy import Engine, create_engine, update

from sqla_queue import JobContext, Registry, normalize_url

from .models import Order

log = logging.getLogger("shop")

# One engine for every job, named once: handlers get it from their context. (Creating an
# engine does not connect; its pool is shared by the worker's handler threads.)
shop_db = create_engine(normalize_url(os.environ.get("SQLA_QUEUE_DATABASE_URL", "postgresql://")))
registry = Registry(resources={"shop_db": shop_db})


@registry.task(name="shop.send_receipt", queue="default", max_attempts=5, pass_context=True)
def send_receipt(ctx: JobContext, order_id: int, email: str) -> None:
    """Pretend to send the receipt; record that it went out.

    A real handler would pass ctx.attempt to the mail API as an idempotency/fencing key.
    """
    log.info("sending receipt for order %s to %s (attempt %s)", order_id, email, ctx.attempt)
    shop_db: Engine = ctx.resource("shop_db")
    with shop_db.begin() as conn:
        conn.execute(update(Order).where(Order.id == order_id).values(receipt_sent=True))
