"""The workflow example's tests: its function and its `main`, on a database of the test's own."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from .workflow_example import LINES, main, run_order

EXPECTED = round(sum(quantity * price for _, quantity, price in LINES), 2)


def test_the_order_workflow_prices_totals_and_invoices_in_order(sqla_queue_engine: Engine) -> None:
    handle, line = run_order(sqla_queue_engine, 7)
    assert line == f"invoice for order 7: {EXPECTED:.2f}"
    assert len(handle.job_ids) == len(LINES) + 2
    with sqla_queue_engine.connect() as conn:
        workflows = conn.execute(
            text("SELECT count(*) FROM sqla_queue.jobs WHERE workflow_id = :w"),
            {"w": handle.workflow_id},
        ).scalar_one()
    assert workflows == len(handle.job_ids)  # each keeps its result (for the queue's result_ttl)


def test_main_prints_the_workflow_and_its_invoice(
    sqla_queue_engine: Engine, sqla_queue_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", sqla_queue_database_url, "--order-id", "3"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("workflow ")
    assert out.endswith(f": 5 jobs; invoice for order 3: {EXPECTED:.2f}")
