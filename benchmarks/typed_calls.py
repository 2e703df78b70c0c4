"""The typed call against the dict form, side by side in one run (issue 37).

    python -m benchmarks.typed_calls (--database-url URL | --cluster) [--rows] [--builtin]
        [--repeats 5] [--quick] [--json OUT]

URL names a server: a scratch database is created, migrated, measured in and dropped
(`enqueue_paths.scratch_database`). One transaction per enqueue (a web request's shape), on
one `Session`, for `transactions` calls a side:

- `dict`: today's form, `task.enqueue(session, {...})` of a task whose parameters are JSON
  types (`when: str`, `line: dict`), the caller converting by hand (the `datetime` as ISO
  text, the dataclass as a dict of JSON values): nothing for the adapter to do;
- `typed`: `task.defer(session, when=datetime, line=Line(...))`, the values converted by the
  task's adapter (`sqla_queue.job.arguments`: Pydantic's `TypeAdapter` when installed).

`typed_calls(url)` returns `{"dict": {"median", "runs"}, "typed": {...}, "ratio"` (typed /
dict, target >= 0.9), `"ratio_of_pairs"`, `"ratio_range"`, `"transactions"`,
`"converters"` ("pydantic" or "builtin")}; rounds alternate as in `enqueue_paths`.

`row_handlers(url)` measures a worker's jobs/s (one process, `run_until_empty`, concurrency
1, batch 50) for a handler taking an ORM row (`order: Order`: the runner loads it in the
session `ctx.session()` returns) against one taking its id and calling `session.get` in
`ctx.session()`, as handlers did before; `jobs` jobs a side, enqueued before the clock
starts, rounds alternating. `--cluster` runs both on a private stock cluster
(`benchmarks/cluster.py`); the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import decimal
import json
import os
import time
from functools import partial
from typing import Any

from sqlalchemy import String, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks.enqueue_paths import _alternate, _compare, _engine, _truncate, scratch_database
from sqla_queue import JobContext, Registry, enqueue_many
from sqla_queue.job import arguments
from sqla_queue.testing import run_until_empty

WHEN = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone.utc)


@dataclasses.dataclass
class Line:
    sku: str
    price: decimal.Decimal
    quantity: int


registry = Registry()


@registry.task(name="bench.ship")
def ship(order_id: int, when: dt.datetime, line: Line) -> None:
    """The typed side's task (never run here)."""


@registry.task(name="bench.ship_json")
def ship_json(order_id: int, when: str, line: dict[str, Any]) -> None:
    """The dict side's task, as today: JSON parameters, converted by hand by the caller."""


class _Base(DeclarativeBase):
    pass


class Order(_Base):
    __tablename__ = "bench_row_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(20))


rows = Registry()


@rows.task(name="bench.ship_row")
def ship_row(order: Order) -> None:
    """Takes the row: loaded by the runner before it is called."""
    assert order.status == "new"


@rows.task(name="bench.ship_id", pass_context=True)
def ship_id(ctx: JobContext, order_id: int) -> None:
    """Takes the id and loads the row itself, as handlers did before rows as arguments."""
    with ctx.session() as session:
        order = session.get(Order, order_id)
        assert order is not None
        assert order.status == "new"


def row_handlers(url: str, jobs: int = 500, repeats: int = 5) -> dict[str, Any]:
    """A handler taking an ORM row against one taking its id (see the module doc)."""
    with _engine(url) as engine:
        _Base.metadata.drop_all(engine)
        _Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            session.add_all(Order(id=n, status="new") for n in range(1, jobs + 1))
        with Session(engine, expire_on_commit=False) as session:
            orders = list(session.scalars(select(Order).order_by(Order.id)))

        def loop(side: str) -> float:
            with Session(engine) as session, session.begin():
                if side == "row":
                    enqueue_many(session, [ship_row.row(order) for order in orders])
                else:
                    enqueue_many(session, [ship_id.row(order_id=o.id) for o in orders])
            started = time.perf_counter()
            stats = run_until_empty(engine, rows)
            elapsed = time.perf_counter() - started
            if stats.succeeded != jobs:
                raise RuntimeError(f"{side}: {stats.succeeded} of {jobs} jobs succeeded")
            return jobs / elapsed

        load_before = os.getloadavg()
        runs = _alternate(
            {side: partial(loop, side) for side in ("id", "row")},
            repeats,
            lambda: _truncate(engine),
        )
        load_after = os.getloadavg()
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE bench_row_orders"))
    result = _compare(runs, "row", "id")
    result["jobs"] = jobs
    result["load_average"] = [list(load_before), list(load_after)]
    return result


def typed_calls(url: str, transactions: int = 1000, repeats: int = 5) -> dict[str, Any]:
    """The typed call and the dict form, `transactions` enqueues each (see the module doc)."""
    line = Line("A-1", decimal.Decimal("9.90"), 2)
    by_hand = {"sku": line.sku, "price": str(line.price), "quantity": line.quantity}
    with _engine(url) as engine:

        def loop(side: str) -> float:
            started = time.perf_counter()
            with Session(engine) as session:
                for n in range(transactions):
                    with session.begin():
                        if side == "typed":
                            ship.defer(session, order_id=n, when=WHEN, line=line)
                        else:
                            args = {"order_id": n, "when": WHEN.isoformat(), "line": by_hand}
                            ship_json.enqueue(session, args)
            return transactions / (time.perf_counter() - started)

        runs = _alternate(
            {side: partial(loop, side) for side in ("dict", "typed")},
            repeats,
            lambda: _truncate(engine),
        )
    result = _compare(runs, "typed", "dict")
    result["transactions"] = transactions
    pydantic_on = arguments.use_pydantic and _has_pydantic()
    result["converters"] = "pydantic" if pydantic_on else "builtin"
    return result


def _has_pydantic() -> bool:
    try:
        import pydantic  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.typed_calls")
    parser.add_argument("--database-url", help="a server; a scratch db is made")
    parser.add_argument("--cluster", action="store_true", help="a private stock cluster")
    parser.add_argument("--rows", action="store_true", help="the row handler against the id")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a quarter of the size")
    parser.add_argument("--builtin", action="store_true", help="without Pydantic's adapters")
    parser.add_argument("--json", help="append the result as one JSON line to this file")
    args = parser.parse_args(argv)
    arguments.use_pydantic = not args.builtin
    if args.cluster:
        from benchmarks.cluster import PrivateCluster

        with PrivateCluster() as cluster:
            result = _measure(cluster.url, args)
    elif args.database_url:
        result = _measure(args.database_url, args)
    else:
        parser.error("give --database-url URL or --cluster")
    result["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps(result) + "\n")
    low, high = result["ratio_range"]
    if args.rows:
        print(
            f"row_handlers: id + session.get {result['id']['median']:,.0f} jobs/s, row "
            f"{result['row']['median']:,.0f} jobs/s; row/id {result['ratio']:.2f}x (pairs: "
            f"median {result['ratio_of_pairs']:.2f}x, {low:.2f}-{high:.2f}); load average "
            f"{result['load_average']}"
        )
        return
    _say_typed(result)


def _measure(server: str, args: argparse.Namespace) -> dict[str, Any]:
    with scratch_database(server) as url:
        if args.rows:
            return row_handlers(url, 125 if args.quick else 500, args.repeats)
        load_before = os.getloadavg()
        result = typed_calls(url, 250 if args.quick else 1000, args.repeats)
        result["load_average"] = [list(load_before), list(os.getloadavg())]
        return result


def _say_typed(result: dict[str, Any]) -> None:
    low, high = result["ratio_range"]
    print(
        f"typed_calls ({result['converters']}): dict {result['dict']['median']:,.0f} tx/s, "
        f"typed {result['typed']['median']:,.0f} tx/s; typed/dict {result['ratio']:.2f}x "
        f"(pairs: median {result['ratio_of_pairs']:.2f}x, {low:.2f}-{high:.2f})"
    )


if __name__ == "__main__":
    main()
