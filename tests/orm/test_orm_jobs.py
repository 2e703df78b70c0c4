"""Jobs tied to the rows they are about (issue 25): `enqueue(..., about=order)`, `jobs_of`,
`order.jobs`, the cancel when the row is deleted through the ORM, `Unique(about=True)`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from helpers.multixact_support import admin_engine, count_multixacts
from sqlalchemy import Engine, ForeignKeyConstraint, create_engine, delete, select, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import ConfigurationError, InvalidJobError, Job, Unique, enqueue, enqueue_many
from sqla_queue.db.database import normalize_url
from sqla_queue.orm import HasJobs, about_key, cancel_jobs_about, jobs_of
from sqla_queue.orm.triggers import cancel_on_delete, enqueue_on_update


class Shop(DeclarativeBase):
    pass


class Order(HasJobs, Shop):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")


class Line(HasJobs, Shop):
    __tablename__ = "order_lines"
    __table_args__ = (ForeignKeyConstraint(["order_id"], ["orders.id"]),)

    order_id: Mapped[int] = mapped_column(primary_key=True)
    number: Mapped[int] = mapped_column(primary_key=True)


@pytest.fixture
def shop(engine: Engine) -> Engine:
    Shop.metadata.create_all(engine)
    return engine


def test_a_job_enqueued_about_a_new_order_names_it_and_is_listed_by_it(shop: Engine) -> None:
    with Session(shop) as session, session.begin():
        order = Order()
        session.add(order)  # pending: enqueue flushes it, so it has its key
        job = enqueue(session, "shop.receipt", {"order_id": 0}, about=order, flush=True)
        other = Order()
        session.add(other)
        session.flush()
        enqueue(session, "shop.receipt", {}, about=other, flush=True)
        assert job.about == f"orders:{order.id}" == about_key(order)
        order_id, job_id = order.id, job.id
    with Session(shop) as session:
        order = session.get_one(Order, order_id)
        assert [j.id for j in jobs_of(session, order)] == [job_id]
        assert [j.id for j in jobs_of(session, f"orders:{order_id}", status="queued")] == [job_id]
        assert jobs_of(session, order, status=["done", "failed"]) == []
        assert [j.id for j in order.jobs] == [job_id]  # the read-only relationship
        with pytest.raises(ConfigurationError, match=r"jobs_of\(status=.*got finished"):
            jobs_of(session, order, status="finished")


def test_a_rolled_back_transaction_leaves_neither_the_order_nor_its_job(shop: Engine) -> None:
    with Session(shop) as session:
        order = Order()
        session.add(order)
        enqueue(session, "shop.receipt", {}, about=order, flush=True)
        session.rollback()
    with Session(shop) as session:
        assert session.scalars(select(Job)).all() == []
        assert session.scalars(select(Order)).all() == []


def test_deleting_the_order_cancels_its_queued_and_waiting_jobs_in_the_same_transaction(
    shop: Engine,
) -> None:
    with Session(shop, expire_on_commit=False) as session, session.begin():
        order, kept = Order(), Order()
        session.add_all([order, kept])
        session.flush()
        queued = enqueue(session, "shop.receipt", {}, about=order, flush=True)
        parent = enqueue(session, "shop.charge", {}, flush=True)
        waiting = enqueue(session, "shop.ship", {}, about=order, depends_on=[parent], flush=True)
        other = enqueue(session, "shop.receipt", {}, about=kept, flush=True)
    with Session(shop) as session:
        session.delete(session.get_one(Order, order.id))
        session.flush()
        # the same transaction sees them cancelled; nothing else is touched
        statuses = {row.id: row.status for row in session.execute(select(Job.id, Job.status))}
        session.rollback()
    assert statuses[queued.id] == statuses[waiting.id] == "cancelled"
    assert statuses[parent.id] == statuses[other.id] == "queued"
    with Session(shop) as session, session.begin():  # rolled back: still queued
        assert session.get_one(Job, queued.id).status == "queued"
        session.delete(session.get_one(Order, order.id))
    with Session(shop) as session:
        job = session.get_one(Job, queued.id)
        assert job.status == "cancelled"
        assert job.last_error == f"cancelled: orders:{order.id}, the row it was about, was deleted"
        assert session.get_one(Job, other.id).status == "queued"


def test_a_delete_that_bypasses_the_orm_cancels_by_hand(shop: Engine) -> None:
    with Session(shop, expire_on_commit=False) as session, session.begin():
        order = Order()
        session.add(order)
        job = enqueue(session, "shop.receipt", {}, about=order, flush=True)
    with Session(shop) as session, session.begin():
        session.execute(delete(Order).where(Order.id == order.id))
        assert session.get_one(Job, job.id).status == "queued"  # no ORM event: nothing
        assert cancel_jobs_about(session, f"orders:{order.id}") == [job.id]


def test_unique_about_admits_one_job_per_task_and_row(shop: Engine) -> None:
    per_order = Unique(about=True)
    with Session(shop) as session, session.begin():
        first, second = Order(), Order()
        session.add_all([first, second])
        session.flush()
        a = enqueue(session, "shop.sync", {"try": 1}, about=first, unique=per_order)
        b = enqueue(session, "shop.sync", {"try": 2}, about=first, unique=per_order)
        c = enqueue(session, "shop.sync", {"try": 1}, about=second, unique=per_order)
        d = enqueue(session, "shop.other", {"try": 1}, about=first, unique=per_order)
        assert (a.duplicate, b.duplicate, c.duplicate, d.duplicate) == (False, True, False, False)
        assert b.id == a.id
        with pytest.raises(ConfigurationError, match=r"about=True.*enqueued without about="):
            enqueue(session, "shop.sync", {}, unique=per_order)


def test_a_composite_key_is_a_json_array_and_its_relationship_finds_the_jobs(
    shop: Engine,
) -> None:
    with Session(shop, expire_on_commit=False) as session, session.begin():
        order = Order()
        session.add(order)
        session.flush()
        line = Line(order_id=order.id, number=2)
        session.add(line)
        rows = [{"task": "shop.pack", "args": {}, "about": line} for _ in range(2)]
        ids = enqueue_many(session, rows)
    with Session(shop) as session:
        line = session.get_one(Line, (order.id, 2))
        assert about_key(line) == f"order_lines:[{order.id}, 2]"
        assert sorted(j.id for j in line.jobs) == sorted(ids)
        assert order.id is not None


def test_about_refuses_what_is_not_a_mapped_row_or_its_text(shop: Engine) -> None:
    with Session(shop) as session:
        with pytest.raises(InvalidJobError, match="about= takes a mapped instance"):
            enqueue(session, "shop.receipt", {}, about=object())
        with pytest.raises(InvalidJobError, match="'<table>:<key>' text"):
            enqueue(session, "shop.receipt", {}, about="orders")
        with pytest.raises(InvalidJobError, match="no primary key yet"):
            enqueue(session, "shop.receipt", {}, about=Order())  # not in any session


ENQUEUER = """
import sys
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqla_queue import enqueue
engine = create_engine(sys.argv[1])
for n in range(int(sys.argv[2])):
    with Session(engine) as session, session.begin():
        enqueue(session, "shop.receipt", {"n": n}, about="orders:1")
        session.execute(__import__("sqlalchemy").text("SELECT id FROM orders WHERE id = 1"))
"""


@pytest.mark.slow
def test_eight_processes_enqueueing_about_one_hot_row_mint_no_multixacts(
    private_url: str,
) -> None:
    admin = admin_engine(private_url)
    url = normalize_url(private_url)
    engine = create_engine(url)
    # the default schema: the queue check locks nothing (the foreign key before sqlaq_0031
    # minted one MultiXact per job here, from the queue's row)
    Shop.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add(Order(id=1))

    def contend() -> None:
        processes = [
            subprocess.Popen([sys.executable, "-c", ENQUEUER, url, "125"]) for _ in range(8)
        ]
        for process in processes:
            assert process.wait(timeout=600) == 0

    updates: list[int] = []

    def touch_the_order() -> None:  # the hot row is written meanwhile, as an app would
        with Session(engine) as session:
            for _ in range(200):
                with session.begin():
                    order = session.get_one(Order, 1)
                    order.status = "paid" if order.status == "new" else "new"
                updates.append(1)

    try:
        toucher = threading.Thread(target=touch_the_order)
        toucher.start()
        minted = count_multixacts(admin, contend)
        toucher.join(60)
        with Session(engine) as session:
            assert len(jobs_of(session, "orders:1")) == 1000
    finally:
        engine.dispose()
        admin.dispose()
    assert len(updates) == 200
    assert minted == 0


def test_generated_triggers_act_on_changes_that_bypass_the_orm(shop: Engine) -> None:
    remove = cancel_on_delete("orders", ["id"])
    paid = enqueue_on_update("orders", ["id"], "status", "paid", "shop.receipt", "billing")
    shipped = enqueue_on_update("orders", ["id"], "status", "shipped", "shop.notify")
    lines = cancel_on_delete("order_lines", ["order_id", "number"])
    with pytest.raises(ConfigurationError, match="without '\\$'"):
        enqueue_on_update("orders", ["id"], "status", "paid", "x$sqlaq$; DROP TABLE orders")
    with shop.begin() as conn:  # two rules on one column: each its own trigger
        for sql in (remove, paid, shipped, lines):
            conn.exec_driver_sql(sql.create)
    with Session(shop, expire_on_commit=False) as session, session.begin():
        order, other = Order(), Order()
        session.add_all([order, other])
        session.flush()
        line = Line(order_id=order.id, number=1)
        session.add(line)
        session.flush()
        about_line = enqueue(session, "shop.pack", {}, about=line, flush=True)
    with Session(shop) as session, session.begin():  # Core statements: no ORM event
        session.execute(update(Order).where(Order.id == order.id).values(status="paid"))
        session.execute(update(Order).where(Order.id == order.id).values(status="paid"))
        session.execute(update(Order).where(Order.id == other.id).values(status="shipped"))
    with Session(shop) as session:
        (receipt,) = jobs_of(session, order)
        assert (receipt.task, receipt.args, receipt.status) == (
            "shop.receipt",
            {"id": order.id},
            "queued",
        )
        assert [j.task for j in jobs_of(session, other)] == ["shop.notify"]
        assert receipt.queue == "billing"  # the queue row was made for it
    with Session(shop) as session, session.begin():
        session.execute(delete(Line))
        session.execute(delete(Order).where(Order.id == order.id))
    with Session(shop) as session:
        assert session.get_one(Job, receipt.id).status == "cancelled"
        assert session.get_one(Job, about_line.id).status == "cancelled"
        assert session.get_one(Job, about_line.id).last_error == (
            f"cancelled: order_lines:[{order.id}, 1], the row it was about, was deleted"
        )
    with shop.begin() as conn:
        for sql in (remove, paid, shipped, lines):
            conn.exec_driver_sql(sql.drop)
        left = conn.execute(text("SELECT count(*) FROM pg_trigger WHERE tgname ~ '^sqla_queue_'"))
        assert left.scalar() == 0


def test_the_cli_and_the_dashboard_find_a_rows_jobs(shop: Engine, database_url: str) -> None:
    from click.testing import CliRunner
    from starlette.testclient import TestClient

    from sqla_queue.cli import main
    from sqla_queue.dashboard import create_app

    with Session(shop, expire_on_commit=False) as session, session.begin():
        order, other = Order(), Order()
        session.add_all([order, other])
        session.flush()
        job = enqueue(session, "shop.receipt", {}, about=order, flush=True)
        not_it = enqueue(session, "shop.receipt", {}, about=other, flush=True)
    runner = CliRunner()
    listed = runner.invoke(
        main,
        ["--database-url", database_url, "jobs", "list", "--about", f"orders:{order.id}", "--json"],
    )
    assert listed.exit_code == 0, listed.output
    assert [(j["id"], j["about"]) for j in json.loads(listed.output)] == [
        (job.id, f"orders:{order.id}")
    ]
    bad = runner.invoke(main, ["--database-url", database_url, "jobs", "list", "--about", "orders"])
    assert bad.exit_code != 0
    assert "'<table>:<key>'" in bad.output
    client = TestClient(create_app(shop))
    page = client.get(f"/jobs/{job.id}")
    assert f'href="/jobs?about=orders%3A{order.id}"' in page.text
    found = client.get("/jobs", params={"about": f"orders:{order.id}"})
    assert f'href="/jobs/{job.id}"' in found.text
    assert f'href="/jobs/{not_it.id}"' not in found.text
