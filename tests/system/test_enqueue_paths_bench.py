"""benchmarks/enqueue_paths.py runs at tiny sizes and returns the documented figures."""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import enqueue_paths


def test_each_measurement_returns_its_documented_keys(database_url: str) -> None:
    business = enqueue_paths.business_tx(database_url, transactions=3, repeats=2)
    assert set(enqueue_paths.BUSINESS_SIDES) <= business.keys()
    assert len(business["with"]["runs"]) == 2
    assert business["job_cost"] == 1 - business["ratio"]
    core = enqueue_paths.core_enqueue(database_url, transactions=3, repeats=1)
    assert core["core"]["median"] > 0
    assert core["raw"]["median"] > 0
    bulk = enqueue_paths.bulk(database_url, rows=150, repeats=1, queue_fk=False)
    assert (bulk["rows"], bulk["queue_fk"]) == (150, False)
    assert bulk["ratio_range"][0] <= bulk["ratio_of_pairs"] <= bulk["ratio_range"][1]
    engine = create_engine(database_url)
    with engine.connect() as conn:  # the queue check is back, the scratch table gone
        names = conn.execute(
            text("SELECT tgname FROM pg_trigger WHERE tgname = 'jobs_queue_known'")
        ).all()
        orders = conn.execute(text("SELECT to_regclass('enqueue_paths_orders')")).scalar()
    engine.dispose()
    assert (len(names), orders) == (1, None)
