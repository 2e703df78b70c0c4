"""Enqueue on change (issue 25): `@registry.on_change(Order.status, to="paid")` enqueues one
job about the order in each transaction that leaves it paid, at commit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.multixact_support import admin_engine, count_multixacts
from sqlalchemy import Engine, create_engine, select, update
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import ConfigurationError, Job, Registry
from sqla_queue.db.database import normalize_url
from sqla_queue.orm import jobs_of
from sqla_queue.orm.on_change import remove_rules
from sqla_queue.testing import drain


class Shop(DeclarativeBase):
    pass


class Order(Shop):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")
    email: Mapped[str] = mapped_column(default="ada@example.com")


@pytest.fixture
def registry() -> Iterator[Registry]:
    registry = Registry()
    yield registry
    remove_rules(registry)


@pytest.fixture
def shop(engine: Engine) -> Engine:
    Shop.metadata.create_all(engine)
    return engine


def receipts(engine: Engine) -> list[Job]:
    with Session(engine) as session:
        return list(session.scalars(select(Job).where(Job.task == "receipt").order_by(Job.id)))


def test_setting_an_order_paid_enqueues_one_job_about_it_with_its_key(
    shop: Engine, registry: Registry
) -> None:
    got: list[int] = []

    @registry.on_change(Order.status, to="paid", name="receipt")
    def receipt(id: int) -> None:
        got.append(id)

    with Session(shop, expire_on_commit=False) as session, session.begin():
        order, other = Order(), Order()
        session.add_all([order, other])
    with Session(shop) as session, session.begin():
        session.get_one(Order, order.id).status = "paid"
        session.get_one(Order, other.id).status = "shipped"  # not paid: no job
    (job,) = receipts(shop)
    assert (job.args, job.about, job.status) == ({"id": order.id}, f"orders:{order.id}", "queued")
    drain(shop, registry)
    assert got == [order.id]


def test_a_rollback_leaves_no_job_and_an_insert_counts_as_a_change(
    shop: Engine, registry: Registry
) -> None:
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
    with Session(shop) as session:
        session.add(Order(status="paid"))
        session.flush()
        session.rollback()
    assert receipts(shop) == []
    with Session(shop) as session, session.begin():
        session.add(Order(status="paid"))  # inserted paid: a change from nothing
    assert len(receipts(shop)) == 1


def test_change_back_and_again_in_one_transaction_gives_one_job_and_back_gives_none(
    shop: Engine, registry: Registry
) -> None:
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
    with Session(shop, expire_on_commit=False) as session, session.begin():
        first, second = Order(), Order()
        session.add_all([first, second])
    with Session(shop) as session, session.begin():
        order = session.get_one(Order, first.id)
        for status in ("paid", "new", "paid"):
            order.status = status
            session.flush()
        back = session.get_one(Order, second.id)
        back.status = "paid"
        session.flush()
        back.status = "new"  # ends where it began: no job
    assert [j.about for j in receipts(shop)] == [f"orders:{first.id}"]


def test_released_savepoints_enqueue_nothing_the_outer_commit_judges_the_net_change(
    shop: Engine, registry: Registry
) -> None:
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
    with Session(shop, expire_on_commit=False) as session, session.begin():
        back, twice, left_open = Order(), Order(), Order()
        session.add_all([back, twice, left_open])
    with Session(shop) as session, session.begin():
        order = session.get_one(Order, back.id)
        order.status = "paid"
        with session.begin_nested():  # released: not a commit of the transaction
            pass
        order.status = "new"  # ends open: no receipt
        other = session.get_one(Order, twice.id)
        for status in ("paid", "new", "paid"):  # paid at the end: one receipt, not two
            with session.begin_nested():
                other.status = status
    with Session(shop) as session, session.begin():  # the outer commit, a savepoint open
        session.begin_nested()
        session.get_one(Order, left_open.id).status = "paid"
    assert sorted(j.about for j in receipts(shop)) == sorted(
        [f"orders:{twice.id}", f"orders:{left_open.id}"]
    )


def test_from_when_args_and_several_attributes(shop: Engine, registry: Registry) -> None:
    registry.on_change(Order.status, from_="paid", to="refunded", name="refund")(lambda id: None)
    registry.on_change(
        Order.status,
        to="paid",
        when=lambda order: order.email.endswith("@example.com"),
        args=lambda order: {"order_id": order.id, "email": order.email},
        name="receipt",
    )(lambda order_id, email: None)
    registry.on_change(Order.status, Order.email, name="audit")(lambda id: None)
    with Session(shop, expire_on_commit=False) as session, session.begin():
        a, b = Order(status="paid"), Order(status="paid", email="bo@other.org")
        session.add_all([a, b])
    with Session(shop) as session, session.begin():
        session.get_one(Order, a.id).status = "refunded"  # from paid: a refund
        session.get_one(Order, b.id).email = "bo@example.org"  # an audit only
    with Session(shop) as session:
        jobs = session.scalars(select(Job).order_by(Job.id)).all()
        made = [(j.task, j.args) for j in jobs]
    expected = [
        ("receipt", {"order_id": a.id, "email": "ada@example.com"}),  # inserted paid
        ("audit", {"id": a.id}),  # inserts change both attributes
        ("audit", {"id": b.id}),  # b's email fails `when`: no receipt
        ("refund", {"id": a.id}),
        ("audit", {"id": a.id}),
        ("audit", {"id": b.id}),
    ]
    assert sorted(made, key=str) == sorted(expected, key=str)


def test_an_orm_bypassing_update_enqueues_nothing(shop: Engine, registry: Registry) -> None:
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
    with Session(shop) as session, session.begin():
        session.add(Order())
    with Session(shop) as session, session.begin():
        session.execute(update(Order).values(status="paid"))
    assert receipts(shop) == []


def test_bad_rules_are_refused_by_name(registry: Registry) -> None:
    with pytest.raises(ConfigurationError, match="takes mapped attributes"):
        registry.on_change("status", to="paid")(lambda id: None)
    with pytest.raises(ConfigurationError, match="use when=lambda"):
        registry.on_change(Order.status, Order.email, to="paid")(lambda id: None)


def test_a_handler_that_cannot_take_the_default_args_is_refused_at_registration(
    registry: Registry,
) -> None:
    with pytest.raises(ConfigurationError) as refused:

        @registry.on_change(Order.status, to="paid", name="receipt")
        def receipt(order_id: int) -> None: ...

    assert str(refused.value).count("\n") == 0
    assert "primary key as args by default" in str(refused.value)
    assert "missing required argument order_id" in str(refused.value)
    assert "args=lambda obj" in str(refused.value)
    assert "receipt" not in registry  # nothing registered, no rule left behind

    @registry.on_change(Order.status, to="paid", name="receipt", pass_context=True)
    def takes_id(ctx: Any, id: int) -> None: ...

    @registry.on_change(Order.status, to="paid", args=lambda o: {"order_id": o.id}, name="r2")
    def takes_its_own(order_id: int) -> None: ...

    assert {"receipt", "r2"} <= set(registry)


def test_an_async_session_enqueues_on_change_too(
    shop: Engine, registry: Registry, database_url: str
) -> None:
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)

    async def pay() -> int:
        engine = create_async_engine(normalize_url(database_url))
        try:
            async with async_sessionmaker(engine)() as session, session.begin():
                order = Order(status="paid")
                session.add(order)
                await session.flush()
                return order.id
        finally:
            await engine.dispose()

    order_id = asyncio.run(pay())
    assert [j.about for j in receipts(shop)] == [f"orders:{order_id}"]


PAYER = textwrap.dedent(
    """
    import sys
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session
    sys.path.insert(0, sys.argv[3])
    from orm.test_on_change import Order
    from sqla_queue import Registry
    registry = Registry()
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
    engine = create_engine(sys.argv[1])
    first = int(sys.argv[2])
    for order_id in range(first, first + 125):
        with Session(engine) as session, session.begin():
            session.get_one(Order, order_id).status = "paid"
    """
)


@pytest.mark.slow
def test_eight_processes_paying_1000_orders_enqueue_1000_jobs_and_mint_no_multixacts(
    private_url: str, request: Any
) -> None:
    admin = admin_engine(private_url)
    url = normalize_url(private_url)
    engine = create_engine(url)  # the default schema: the queue check locks nothing
    Shop.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all([Order(id=n) for n in range(1, 1001)])
    here = str(request.path.parents[1])

    def pay() -> None:
        processes = [
            subprocess.Popen([sys.executable, "-c", PAYER, url, str(1 + 125 * k), here])
            for k in range(8)
        ]
        for process in processes:
            assert process.wait(timeout=600) == 0

    try:
        minted = count_multixacts(admin, pay)
        with Session(engine) as session:
            jobs = session.scalars(select(Job)).all()
            assert len(jobs) == 1000
            assert {j.about for j in jobs} == {f"orders:{n}" for n in range(1, 1001)}
            assert len(jobs_of(session, "orders:1")) == 1
    finally:
        engine.dispose()
        admin.dispose()
    assert minted == 0


def test_two_registries_keep_their_own_rules_and_listeners(
    shop: Engine, registry: Registry
) -> None:
    other = Registry()
    registry.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
    other.on_change(Order.status, to="paid", name="audit", priority=7)(lambda id: None)
    try:
        assert [rule.task.name for rule in registry.change_rules.rules] == ["receipt"]
        assert [rule.task.name for rule in other.change_rules.rules] == ["audit"]
        with Session(shop, expire_on_commit=False) as session, session.begin():
            order = Order(status="paid")
            session.add(order)
        with Session(shop) as session:
            jobs = session.scalars(select(Job).order_by(Job.task)).all()
            # each through its own registry: "audit" has its task's priority, "receipt" not
            assert [(j.task, j.priority) for j in jobs] == [("audit", 7), ("receipt", 0)]

        assert remove_rules(registry) == 1
        assert not registry.change_rules.listening()
        assert other.change_rules.listening()
        with Session(shop) as session, session.begin():
            session.get_one(Order, order.id).status = "new"
        with Session(shop) as session, session.begin():
            session.get_one(Order, order.id).status = "paid"  # only the other's rule is left
        with Session(shop) as session:
            tasks = session.scalars(select(Job.task).order_by(Job.id)).all()
            assert (sorted(tasks[:2]), tasks[2:]) == (["audit", "receipt"], ["audit"])
    finally:
        remove_rules(other)
    assert not other.change_rules.listening()
