"""A workflow: price each line of an order side by side, total them, then send the invoice.

python -m examples.workflow_example --database-url postgresql://...

    chain(
        chord(group(price_line.s(...) for each line), total.s(order_id=...)),
        send_invoice.s(order_id=...),
    )

It migrates the database (idempotent), enqueues the whole workflow in one transaction (one
`enqueue_many` and one `link_jobs`, however wide the group), runs a burst-mode worker
in-process, and prints the invoice's total. `total` reads its group's results, in order,
with `ctx.parent_results()`; `send_invoice` runs only once `total` has succeeded.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from sqla_queue import JobContext, Registry, WorkflowHandle, chain, chord, group, wait_for
from sqla_queue.db.database import normalize_url
from sqla_queue.db.migrate import upgrade
from sqla_queue.worker import Worker, WorkerConfig

LINES = [("tea", 2, 4.5), ("cups", 6, 3.0), ("teapot", 1, 28.0)]
"""The order's lines: (item, quantity, unit price)."""

registry = Registry()


@registry.task(name="workflow_example.price_line", keep_result=True)
def price_line(item: str, quantity: int, unit_price: float) -> float:
    """One line's amount (a real one would ask a pricing service)."""
    return round(quantity * unit_price, 2)


@registry.task(name="workflow_example.total", keep_result=True, pass_context=True)
def total(ctx: JobContext, order_id: int) -> dict[str, Any]:
    """The chord's callback: its group's results, in the group's order."""
    amounts = ctx.parent_results()
    return {"order_id": order_id, "lines": amounts, "total": round(sum(amounts), 2)}


@registry.task(name="workflow_example.send_invoice", keep_result=True, pass_context=True)
def send_invoice(ctx: JobContext, order_id: int) -> str:
    """The last step: runs once `total` succeeded, and reads its result."""
    (invoice,) = ctx.parent_results()
    return f"invoice for order {order_id}: {invoice['total']:.2f}"  # a real one would mail it


def order_workflow(order_id: int) -> chain:
    """The canvas for one order (nothing is written until `.enqueue(session)`)."""
    lines = group(
        price_line.s(item=item, quantity=quantity, unit_price=price)
        for item, quantity, price in LINES
    )
    return chain(chord(lines, total.s(order_id=order_id)), send_invoice.s(order_id=order_id))


def run_order(engine: Engine, order_id: int) -> tuple[WorkflowHandle, str]:
    """Enqueue the order's workflow in one transaction, run it, return its handle and line."""
    upgrade(engine)
    with Session(engine) as session, session.begin():
        handle = order_workflow(order_id).enqueue(session)
    config = WorkerConfig(concurrency=2, burst=True, poll_only=True)
    Worker(engine, registry, config).run(install_signal_handlers=False)
    return handle, wait_for(engine, handle.last_id, timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("SQLA_QUEUE_DATABASE_URL"))
    parser.add_argument("--order-id", type=int, default=1)
    options = parser.parse_args(argv)
    if not options.database_url:
        parser.error("pass --database-url or set SQLA_QUEUE_DATABASE_URL")
    engine = create_engine(normalize_url(options.database_url))
    try:
        handle, line = run_order(engine, options.order_id)
    finally:
        engine.dispose()
    print(f"workflow {handle.workflow_id}: {len(handle.job_ids)} jobs; {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
