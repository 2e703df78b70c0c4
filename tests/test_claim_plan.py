"""The claim must use a partial index even when PostgreSQL plans it once for all calls."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import enqueue_many, queries


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]::text[]"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


@pytest.mark.parametrize("queue_names", [None, ["default"]], ids=["any-queue", "one-queue"])
def test_generic_plan_of_the_claim_uses_a_partial_index(
    engine: Engine, queue_names: list[str] | None
) -> None:
    with Session(engine) as session, session.begin():
        enqueue_many(session, [{"task": "t", "args": {"n": n}} for n in range(2_000)])
    compiled = queries.claim_jobs(queue_names).compile(dialect=engine.dialect)
    values = {**compiled.params, "limit": 10, "worker_id": "w", "queues": queue_names}
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    sql = re.sub(r"%\((\w+)\)s", positional, compiled.string)
    arguments = ", ".join(_literal(values[name]) for name in names)
    with engine.connect() as conn:
        conn.execute(text("ANALYZE sqla_queue.jobs"))
        # A prepared statement's generic plan cannot see bound values: status must be a literal.
        conn.execute(text("SET plan_cache_mode = force_generic_plan"))
        conn.exec_driver_sql(f"PREPARE claim AS {sql}".replace("%", "%%"))
        plan = "\n".join(
            row[0] for row in conn.exec_driver_sql(f"EXPLAIN EXECUTE claim({arguments})")
        )
        conn.rollback()
    # the locking subquery: the candidates CTE, up to the next CTE of the statement
    candidates = plan.split("CTE candidates")[1].split("\n  CTE ")[0]
    assert "using ix_jobs_claim" in candidates, plan
