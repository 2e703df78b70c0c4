"""The FastAPI example's background task, async like the app.

sqla-queue worker --app examples.fastapi_app.tasks:registry
"""

from __future__ import annotations

import os

from sqlalchemy import pool, update
from sqlalchemy.ext.asyncio import create_async_engine

from sqla_queue import Registry
from sqla_queue.db.database import normalize_url

from .models import Order

registry = Registry()


@registry.task(name="fastapi_app.send_receipt", max_attempts=5, timeout=30)
async def send_receipt(order_id: int) -> None:
    """Pretend to mail the receipt, then record that it went out."""
    # NullPool: the worker's event loop may change between runs; pooled connections would not.
    engine = create_async_engine(
        normalize_url(os.environ["SQLA_QUEUE_DATABASE_URL"]), poolclass=pool.NullPool
    )
    try:
        async with engine.begin() as conn:
            await conn.execute(update(Order).where(Order.id == order_id).values(receipt_sent=True))
    finally:
        await engine.dispose()
