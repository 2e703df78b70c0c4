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
    enqueue(session, "shop.send_receipt", {"order_id": order.id, "email": email})
    return order


def main() -> None:
    engine = create_engine(normalize_url(os.environ["SQLA_QUEUE_DATABASE_URL"]))
    Base.metadata.create_all(engine)

    for email, total in [("ada@example.com", 12.5), ("alan@example.com", 99.0)]:
        with Session(engine) as session, session.begin():
            place_order(session, email, total)

    # Task-bound sugar does the same: the job commits with the order.
    with Session(engine) as session, session.begin():
        order = Order(email="grace@example.com", total=7.0)
        session.add(order)
        session.flush()
        send_receipt.enqueue(session, {"order_id": order.id, "email": order.email})

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
