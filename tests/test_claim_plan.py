"""The claim must use a partial index even when PostgreSQL plans it once for all calls."""

from __future__ import annotations

import re
import threading
import time

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue_many, queries
from sqla_queue.doctor import Severity, diagnose
from sqla_queue.worker import Worker, WorkerConfig


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


def _insert_cold(engine: Engine, count: int) -> None:
    """`count` due no-op jobs in a table PostgreSQL has never analyzed (as after a burst)."""
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_queue.jobs SET (autovacuum_enabled = off)"))
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs (task, args) "
                "SELECT 'noop', jsonb_build_object('n', g) FROM generate_series(1, :n) g"
            ),
            {"n": count},
        )
        # PostgreSQL 15+ keeps a backend's row counts until it has been idle a while (up to
        # 10 s): had they reached pg_stat_user_tables after the worker's ANALYZE, the table
        # would look 100,000 changes stale again. Flushed at this commit instead.
        if (conn.dialect.server_version_info or (0,)) >= (15,):
            conn.execute(text("SELECT pg_stat_force_next_flush()"))


def _reltuples(engine: Engine) -> float:
    with engine.connect() as conn:
        return float(
            conn.execute(
                text("SELECT reltuples FROM pg_class WHERE oid = 'sqla_queue.jobs'::regclass")
            ).scalar_one()
        )


def test_claim_of_any_queue_reads_the_claim_index_in_order_on_a_never_analyzed_table(
    engine: Engine,
) -> None:
    _insert_cold(engine, 100_000)
    assert _reltuples(engine) < 0  # never analyzed: the planner guesses a few dozen due rows
    with engine.connect() as conn:
        plan = queries.claim_plan(conn, None, 50)
    assert queries.reads_claim_index_in_order(plan), plan
    assert "Sort Key: c.priority" not in plan, plan


def test_worker_restores_fresh_statistics_before_its_first_claim(engine: Engine) -> None:
    """The claim of listed queues still sorts on a never-analyzed table: the worker
    ANALYZEs it first, once, and its claim then reads the claim index in order."""
    _insert_cold(engine, 100_000)
    with engine.connect() as conn:
        assert not queries.reads_claim_index_in_order(queries.claim_plan(conn, ["default"]))
    registry = Registry()
    seen: list[float] = []
    worker: Worker

    @registry.task(name="noop")
    def noop(**_: object) -> None:
        # the first job was claimed by a plan made with what the table's statistics are now
        seen.append(_reltuples(engine))
        worker.stop()

    config = WorkerConfig(queues=["default"], burst=True, poll_only=True, batch=1, concurrency=1)
    worker = Worker(engine, registry, config)
    worker.run(install_signal_handlers=False)
    assert len(seen) == 1, seen
    assert seen[0] >= 100_000 * 0.9, seen
    with engine.connect() as conn:
        assert queries.reads_claim_index_in_order(queries.claim_plan(conn, ["default"]))
    # fresh now: another worker's look runs no second ANALYZE
    assert queries.refresh_jobs_statistics(engine) is False


def test_doctor_warns_when_the_claim_sorts_every_due_job(engine: Engine) -> None:
    _insert_cold(engine, 100_000)
    (finding,) = [f for f in diagnose(engine) if f.name == "claim_plan"]
    assert finding.severity is Severity.warn, finding
    assert "listed queues" in finding.value
    assert "ANALYZE" in finding.fix
    assert queries.refresh_jobs_statistics(engine) is True
    (finding,) = [f for f in diagnose(engine) if f.name == "claim_plan"]
    assert finding.severity is Severity.ok, finding


def test_connection_lost_during_the_statistics_refresh_is_a_database_error(
    engine: Engine,
) -> None:
    """A worker whose connection dies while it ANALYZEs the table (a failover, an admin's
    pg_terminate_backend) gets a DBAPIError, which its producer logs and goes on from: the
    advisory unlock must not be tried on the dead connection (it raised PendingRollbackError,
    which no handler caught, and the worker stopped). The lock went with the session."""
    _insert_cold(engine, 1_000)
    assert _reltuples(engine) < 0
    outcome: list[BaseException | bool] = []

    def refresh() -> None:
        try:
            outcome.append(queries.refresh_jobs_statistics(engine))
        except BaseException as exc:  # the test looks at whatever escaped
            outcome.append(exc)

    with engine.connect() as holder:
        # ANALYZE takes SHARE UPDATE EXCLUSIVE: the refresh waits here, inside ANALYZE
        holder.execute(text("LOCK TABLE sqla_queue.jobs IN SHARE UPDATE EXCLUSIVE MODE"))
        thread = threading.Thread(target=refresh)
        thread.start()
        pid = None
        deadline = time.monotonic() + 30
        while pid is None and time.monotonic() < deadline:
            with engine.connect() as probe:
                pid = probe.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND query ILIKE 'ANALYZE%' AND wait_event_type = 'Lock'"
                    )
                ).scalar()
            time.sleep(0.05)
        assert pid is not None, "the refresh never waited inside ANALYZE"
        with engine.connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        thread.join(30)
        holder.rollback()
    assert not thread.is_alive()
    (raised,) = outcome
    assert isinstance(raised, DBAPIError), repr(raised)
    # the dead session's lock is gone: the next refresh takes it and analyzes
    assert queries.refresh_jobs_statistics(engine) is True
    assert _reltuples(engine) >= 900
