"""What the ORM-native jobs cost (issue 25), in a business transaction, paired.

    python -m benchmarks.orm_cost [--database-url URL] [--blocks 12] [--per-block 200]

Without `--database-url` it starts a private cluster (stock settings). It creates a
database of its own with an `orders` table and times transactions of a Session each, in
blocks that alternate A and B (A B B A ...), so each ratio compares neighbours:

1. `about`: insert an order, flush, `enqueue(..., about=order)`, commit (A) against the
   same with `enqueue(..., {"id": order.id})` and no `about` (B).
2. `on_change`: set an order paid and commit, a rule `@registry.on_change(Order.status,
   to="paid")` enqueueing the job (A), against setting it paid and calling `enqueue(...,
   about=order)` by hand (B): the same job either way.
3. `idle rule`: change an order's email and commit with the rule on `status` registered (A:
   its flush notes nothing) against no rule at all (B).

Prints one JSON object: per case, the median microseconds per transaction of A and B over
the blocks, and the median of the per-block ratios A/B (with min and max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import Registry, enqueue
from sqla_queue.db.migrate import upgrade
from sqla_queue.orm.on_change import remove_rules

from .cluster import PrivateCluster


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")
    email: Mapped[str] = mapped_column(default="ada@example.com")


def _orders(engine: Engine, count: int) -> list[int]:
    with Session(engine) as session, session.begin():
        made = [Order() for _ in range(count)]
        session.add_all(made)
        session.flush()
        return [o.id for o in made]


def _time_block(work: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        work()
    return (time.perf_counter() - start) / n * 1e6


def measure(engine: Engine, blocks: int, per_block: int) -> dict[str, Any]:
    ids = iter(_orders(engine, blocks * per_block * 4 + 10))

    def insert_about() -> None:
        with Session(engine) as session, session.begin():
            order = Order()
            session.add(order)
            session.flush()
            enqueue(session, "receipt", {"id": order.id}, about=order)

    def insert_plain() -> None:
        with Session(engine) as session, session.begin():
            order = Order()
            session.add(order)
            session.flush()
            enqueue(session, "receipt", {"id": order.id})

    def pay(by_hand: bool) -> Callable[[], None]:
        def work() -> None:
            with Session(engine) as session, session.begin():
                order = session.get_one(Order, next(ids))
                order.status = "paid"
                if by_hand:
                    enqueue(session, "receipt", {"id": order.id}, about=order)

        return work

    def touch() -> None:
        with Session(engine) as session, session.begin():
            session.get_one(Order, next(ids)).email = f"{uuid.uuid4().hex[:6]}@example.com"

    results: dict[str, Any] = {}

    def pair(name: str, a: Callable[[], None], b: Callable[[], None], rule_for_a: bool) -> None:
        a_times: list[float] = []
        b_times: list[float] = []
        counts: dict[str, set[int]] = {"a": set(), "b": set()}
        for block in range(blocks):
            order = (True, False) if block % 2 == 0 else (False, True)
            for is_a in order:
                rules = Registry()
                if rule_for_a and is_a:
                    rules.on_change(Order.status, to="paid", name="receipt")(lambda id: None)
                try:
                    (a_times if is_a else b_times).append(_time_block(a if is_a else b, per_block))
                finally:
                    remove_rules(rules)
                with engine.begin() as conn:  # each side's jobs, counted: the same work
                    jobs = conn.execute(text("SELECT count(*) FROM sqla_queue.jobs")).scalar()
                    conn.execute(text("TRUNCATE sqla_queue.jobs"))
                counts["a" if is_a else "b"].add(int(jobs or 0))
        ratios = [x / y for x, y in zip(a_times, b_times, strict=True)]
        results[name] = {
            "a_us": round(statistics.median(a_times), 1),
            "b_us": round(statistics.median(b_times), 1),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
            "jobs_per_block": {side: sorted(found) for side, found in counts.items()},
        }

    for _ in range(50):  # warm-up: connections, statement caches
        insert_plain()
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE sqla_queue.jobs"))
    pair("about", insert_about, insert_plain, rule_for_a=False)
    pair("on_change", pay(by_hand=False), pay(by_hand=True), rule_for_a=True)
    pair("idle_rule", touch, touch, rule_for_a=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--per-block", type=int, default=200)
    options = parser.parse_args()
    cluster = None
    url = options.database_url
    if url is None:
        cluster = PrivateCluster()
        url = cluster.start()
    admin = create_engine(
        url.replace("postgresql://", "postgresql+psycopg://"),
        isolation_level="AUTOCOMMIT",
        poolclass=pool.NullPool,
    )
    name = "orm_" + uuid.uuid4().hex[:8]
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        engine = create_engine(admin.url.set(database=name))
        try:
            upgrade(engine)
            Base.metadata.create_all(engine)
            print(json.dumps(measure(engine, options.blocks, options.per_block), indent=2))
        finally:
            engine.dispose()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE "{name}"'))
    finally:
        admin.dispose()
        if cluster is not None:
            cluster.stop()
            cluster.remove()


if __name__ == "__main__":
    main()
