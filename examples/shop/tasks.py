"""The shop's background tasks. Run them with:

sqla-queue worker --app examples.shop.tasks:registry
"""

from __future__ import annotations

import logging
import os

from sqlalchemy import Engine, create_engine, func, select, update

from sqla_queue import JobContext, Registry, Unique, normalize_url

from .models import Order

log = logging.getLogger("shop")

# One engine for every job, named once: handlers get it from their context. (Creating an
# engine does not connect; its pool is shared by the worker's handler threads.)
shop_db = create_engine(normalize_url(os.environ.get("SQLA_QUEUE_DATABASE_URL", "postgresql://")))
registry = Registry(resources={"shop_db": shop_db})


# One receipt per order: a second enqueue for the same order_id, while the first is queued
# or running, is a duplicate the database skips (a retried web request, a double click).
@registry.task(
    name="shop.send_receipt",
    queue="default",
    max_attempts=5,
    pass_context=True,
    unique=Unique(args=["order_id"]),
)
def send_receipt(ctx: JobContext, order_id: int, email: str) -> None:
    """Pretend to send the receipt; record that it went out.

    A real handler would pass ctx.attempt to the mail API as an idempotency/fencing key.
    """
    log.info("sending receipt for order %s to %s (attempt %s)", order_id, email, ctx.attempt)
    shop_db: Engine = ctx.resource("shop_db")
    with shop_db.begin() as conn:
        conn.execute(update(Order).where(Order.id == order_id).values(receipt_sent=True))


@registry.periodic(cron="0 2 * * *", timezone="Europe/Paris", name="shop.nightly_sales_report")
def nightly_sales_report() -> None:
    """Every night at 02:00 Paris time, enqueued by whichever worker gets there first."""
    shop_db: Engine = registry.resources["shop_db"]
    with shop_db.connect() as conn:
        count, total = conn.execute(
            select(func.count(), func.coalesce(func.sum(Order.total), 0))
        ).one()
    log.info("sales report: %s orders, %s in total", count, total)
