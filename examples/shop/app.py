"""Place orders the way a web request would: the order and its receipt job in one transaction.

python -m examples.shop.app      (uses SQLA_QUEUE_DATABASE_URL)
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from sqla_queue import Job, enqueue, normalize_url

from .models import Base, Order
from .tasks import send_receipt


def place_order(session: Session, email: str, total: float) -> Order:
    order = Order(email=email, total=total)
    session.add(order)
    session.flush()  # the order's id, for the job's args
    send_receipt.enqueue(session, {"order_id": order.id, "email": email})
    return order


def main() -> None:
    engine = create_engine(normalize_url(os.environ["SQLA_QUEUE_DATABASE_URL"]))
    Base.metadata.create_all(engine)

    first_id = None
    for email, total in [("ada@example.com", 12.5), ("alan@example.com", 99.0)]:
        with Session(engine) as session, session.begin():
            order_id = place_order(session, email, total).id
            first_id = first_id or order_id

    # By name, with the task's unique default given explicitly (no default registry here).
    with Session(engine) as session, session.begin():
        order = Order(email="grace@example.com", total=7.0)
        session.add(order)
        session.flush()
        enqueue(
            session,
            "shop.send_receipt",
            {"order_id": order.id, "email": order.email},
            unique=send_receipt.unique,
        )

    # A retried request for the first order: one receipt per order, so the database skips
    # it and says so; the transaction goes on.
    with Session(engine) as session, session.begin():
        again = send_receipt.enqueue(session, {"order_id": first_id, "email": "ada@example.com"})
    print(f"receipt for order {first_id} again: duplicate={again.duplicate} (job {again.id})")

    # A failed request: the order and its job roll back together; nothing is enqueued.
    try:
        with Session(engine) as session, session.begin():
            place_order(session, "nobody@example.com", 1.0)
            raise RuntimeError("payment declined")
    except RuntimeError:
        pass

    with Session(engine) as session:
        jobs = session.scalar(select(func.count()).select_from(Job))
        orders = session.scalar(select(func.count()).select_from(Order))
    print(f"{orders} orders placed, {jobs} receipt jobs queued (the declined one left neither)")
    engine.dispose()


if __name__ == "__main__":
    main()
