"""A stateful, model-based test of the ORM-native jobs (issue 25): Hypothesis drives orders
through the real ORM on the real PostgreSQL, with an `on_change` rule (a receipt when an
order becomes paid) and `HasJobs` (a deleted order cancels its queued jobs), and a model
says after every step which jobs the committed changes call for.

Rules: add an order (new or paid), change an order's status through a sequence of values
flushed one by one in one transaction, delete an order, update a status with a Core
UPDATE that bypasses the ORM; each transaction commits or rolls back.

What must hold after each step: the receipt jobs in the table are exactly those the
committed changes call for: one per committed transaction that left an order paid that had
not been paid at its start (an insert counts, a bypassing UPDATE does not), queued while
its order exists, cancelled once its order was deleted through the ORM.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import Engine, select, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import Job, Registry
from sqla_queue.orm import HasJobs
from sqla_queue.orm.on_change import remove_rules

STATUSES = ["new", "paid", "shipped"]


class Shop(DeclarativeBase):
    pass


class Order(HasJobs, Shop):
    __tablename__ = "model_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str]


def _commit_or_roll_back(session: Session, commit: bool) -> None:
    if commit:
        session.commit()
    else:
        session.rollback()


class OrmModel(RuleBasedStateMachine):
    engine: ClassVar[Engine]

    def __init__(self) -> None:
        super().__init__()
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM model_orders"))
            conn.execute(text("DELETE FROM sqla_queue.jobs"))
        self.orders: dict[int, str] = {}
        """Committed orders: id -> status."""
        self.deleted: set[int] = set()
        self.receipts: Counter[int] = Counter()
        """Receipt jobs the committed changes called for, per order id."""

    def _pick(self, index: int) -> int:
        ids = sorted(self.orders)
        return ids[index % len(ids)]

    @rule(status=st.sampled_from(STATUSES), commit=st.booleans())
    def add_order(self, status: str, commit: bool) -> None:
        with Session(self.engine) as session:
            order = Order(status=status)
            session.add(order)
            session.flush()
            order_id = order.id
            _commit_or_roll_back(session, commit)
        if commit:
            self.orders[order_id] = status
            self.receipts[order_id] += status == "paid"

    @precondition(lambda self: self.orders)
    @rule(
        index=st.integers(0, 20),
        values=st.lists(st.sampled_from(STATUSES), min_size=1, max_size=3),
        commit=st.booleans(),
    )
    def change_status(self, index: int, values: list[str], commit: bool) -> None:
        order_id = self._pick(index)
        with Session(self.engine) as session:
            order = session.get_one(Order, order_id)
            for value in values:
                order.status = value
                session.flush()
            _commit_or_roll_back(session, commit)
        if commit:
            before, after = self.orders[order_id], values[-1]
            self.receipts[order_id] += before != "paid" and after == "paid"
            self.orders[order_id] = after

    @precondition(lambda self: self.orders)
    @rule(index=st.integers(0, 20), commit=st.booleans())
    def delete_order(self, index: int, commit: bool) -> None:
        order_id = self._pick(index)
        with Session(self.engine) as session:
            session.delete(session.get_one(Order, order_id))
            session.flush()
            _commit_or_roll_back(session, commit)
        if commit:
            del self.orders[order_id]
            self.deleted.add(order_id)

    @precondition(lambda self: self.orders)
    @rule(index=st.integers(0, 20), status=st.sampled_from(STATUSES))
    def bypass_update(self, index: int, status: str) -> None:
        order_id = self._pick(index)
        with Session(self.engine) as session, session.begin():
            session.execute(update(Order).where(Order.id == order_id).values(status=status))
        self.orders[order_id] = status  # no ORM event: no job, by design

    @invariant()
    def jobs_are_those_the_committed_changes_call_for(self) -> None:
        with Session(self.engine) as session:
            jobs = session.scalars(select(Job).where(Job.task == "receipt")).all()
        found: Counter[int] = Counter()
        for job in jobs:
            table, _, key = (job.about or "").partition(":")
            assert table == "model_orders", f"job {job.id} is about {job.about!r}"
            order_id = int(key)
            found[order_id] += 1
            expected = "cancelled" if order_id in self.deleted else "queued"
            assert job.status == expected, (
                f"receipt job {job.id} of order {order_id} is {job.status}, not {expected}"
            )
            assert job.args == {"id": order_id}
        assert +found == +self.receipts, f"receipts per order {dict(found)} != {self.receipts}"


def test_orm_jobs_model(engine: Engine) -> None:
    Shop.metadata.create_all(engine)
    registry = Registry()
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
    OrmModel.engine = engine
    try:
        machine: Any = OrmModel.TestCase
        machine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
        machine().runTest()
    finally:
        remove_rules(registry)
