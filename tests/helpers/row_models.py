"""Mapped classes for the tests of ORM rows as task arguments (issue 37): an order with a
`version_id_col`, and a customer (another table, for forged references)."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import Job
from sqla_queue.orm import HasJobs


class RowBase(DeclarativeBase):
    pass


class Order(RowBase):
    __tablename__ = "row_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")
    version: Mapped[int] = mapped_column(default=1)
    __mapper_args__ = {"version_id_col": version}


class Invoice(HasJobs, RowBase):
    """A row whose ORM delete cancels the jobs about it (`sqla_queue.orm.HasJobs`)."""

    __tablename__ = "row_invoices"

    id: Mapped[int] = mapped_column(primary_key=True)


class Customer(RowBase):
    __tablename__ = "row_customers"

    id: Mapped[int] = mapped_column(primary_key=True)


def make_shop(engine: Engine) -> Engine:
    """The tables, with orders 1 and 2, customer 1 and invoice 1."""
    RowBase.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all([Order(id=1), Order(id=2), Customer(id=1), Invoice(id=1)])
    return engine


def order_of(session: Session, order_id: int = 1) -> Order:
    return session.get_one(Order, order_id)


def bump(engine: Engine, order_id: int = 1) -> None:
    """Change an order in a transaction of its own (its version goes up by one)."""
    with Session(engine) as session, session.begin():
        order = order_of(session, order_id)
        order.status = f"changed from {order.status}"


def stored_job(engine: Engine, job_id: int) -> Job:
    """The job's row as stored now."""
    with Session(engine) as session:
        return session.get_one(Job, job_id)
