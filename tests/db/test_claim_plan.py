"""The claim must use a partial index even when PostgreSQL plans it once for all calls."""

from __future__ import annotations

import importlib
import re
import threading
import time

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue_many
from sqla_queue.db import queries
from sqla_queue.doctor import Severity, diagnose
from sqla_queue.worker import Worker, WorkerConfig
from sqla_queue.worker.connection import FailureLog
from sqla_queue.worker.vacuum import SelfVacuum


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


def test_the_claim_updates_its_rows_by_id_not_by_walking_the_drained_ids(engine: Engine) -> None:
    """A drain leaves the ids it finished dead in the primary key until a VACUUM. The claim
    marks its candidates running by looking each one up (an index condition on the ids), not
    by a merge join that reads the primary key from its first entry, dead ones included, up
    to the candidates: that walk grew with every job drained (half of a 500-job claim's time
    100,000 jobs into a drain) and held a long-running worker draining bursts of 100,000 at
    0.66x the rate it has with the look-up."""
    _insert_cold(engine, 20_000)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE sqla_queue.jobs"))
        # the first 19,000 drained: deleted, not yet vacuumed (autovacuum is off above)
        conn.execute(
            text(
                "DELETE FROM sqla_queue.jobs WHERE id <= (SELECT min(id) + 18999 "
                "FROM sqla_queue.jobs)"
            )
        )
    compiled = queries.claim_jobs(None).compile(dialect=engine.dialect)
    values = {
        **compiled.params,
        "limit": 500,
        "worker_id": "w",
        "lease": 60.0,
        "task_leases": "{}",
        "task_max_attempts": "{}",
    }
    with engine.connect() as conn:
        plan = "\n".join(
            row[0]
            for row in conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + compiled.string, values
            )
        )
        conn.rollback()  # the claim's UPDATE, explained, is not kept
    claimed = plan.split("CTE claimed")[1].split("\n  CTE ")[0].split("\n  ->")[0]
    assert "rows=500 loops=1" in claimed, plan
    assert "Index Cond: (id = ANY" in claimed, plan
    assert "Merge Join" not in claimed, plan


def test_worker_refreshes_the_statistics_of_a_cold_table_on_its_upkeep_thread(
    engine: Engine,
) -> None:
    """The claim of listed queues still sorts on a never-analyzed table: the worker's upkeep
    ANALYZEs it as the worker starts, once, on a thread of its own (the claim loop never
    waits for it, issue 40), and the claim then reads the claim index in order."""
    _insert_cold(engine, 100_000)
    with engine.connect() as conn:
        assert not queries.reads_claim_index_in_order(queries.claim_plan(conn, ["default"]))
    registry = Registry()

    @registry.task(name="noop")
    def noop(**_: object) -> None:
        pass

    config = WorkerConfig(queues=["default"], poll_only=True, batch=1, concurrency=1)
    worker = Worker(engine, registry, config)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while _reltuples(engine) < 90_000 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert _reltuples(engine) >= 100_000 * 0.9
    assert worker.keeper.vacuum.analyses == 1
    assert worker.stats.claimed >= 1
    with engine.connect() as conn:
        assert queries.reads_claim_index_in_order(queries.claim_plan(conn, ["default"]))
    # fresh now: another worker's look runs no second ANALYZE
    assert SelfVacuum(engine, None, FailureLog()).run() is False


def test_doctor_warns_when_the_claim_sorts_every_due_job(engine: Engine) -> None:
    _insert_cold(engine, 100_000)
    (finding,) = [f for f in diagnose(engine) if f.name == "claim_plan"]
    assert finding.severity is Severity.warn, finding
    assert "listed queues" in finding.value
    assert "ANALYZE" in finding.fix
    assert SelfVacuum(engine, None, FailureLog()).run() is True
    (finding,) = [f for f in diagnose(engine) if f.name == "claim_plan"]
    assert finding.severity is Severity.ok, finding


def test_statistics_refresh_skips_a_table_another_session_holds(engine: Engine) -> None:
    """A VACUUM (or autovacuum, or a user's LOCK) holds the table's SHARE UPDATE EXCLUSIVE
    lock: the upkeep's ANALYZE (SKIP_LOCKED) skips it at once instead of waiting behind it
    (it waited, on the claim loop's thread: issue 40), and runs once the lock is gone."""
    _insert_cold(engine, 1_000)
    assert _reltuples(engine) < 0
    upkeep = SelfVacuum(engine, None, FailureLog())
    outcome: list[BaseException | bool] = []

    def refresh() -> None:
        try:
            outcome.append(upkeep.run())
        except BaseException as exc:  # the test looks at whatever escaped
            outcome.append(exc)

    with engine.connect() as holder:
        holder.execute(text("SET lock_timeout = '30s'"))
        holder.execute(text("LOCK TABLE sqla_queue.jobs IN SHARE UPDATE EXCLUSIVE MODE"))
        thread = threading.Thread(target=refresh)
        thread.start()
        thread.join(20)  # it never waits for the lock: a thread still alive is the defect
        alive = thread.is_alive()
        holder.rollback()
    thread.join(30)
    assert not alive, "the statistics refresh waited for the table's lock"
    assert outcome == [False]
    assert upkeep.analyses == 0
    assert _reltuples(engine) < 0
    # the lock is gone: the next look analyzes
    assert upkeep.run() is True
    assert upkeep.analyses == 1
    assert _reltuples(engine) >= 900


def test_doctor_does_not_alarm_about_a_sorted_claim_on_a_tiny_table(engine: Engine) -> None:
    # issue 38: "claim_plan warn" on an 81-row table alarmed for nothing. Jobs done and
    # deleted, the table analyzed empty, then 81 new ones: the planner sorts them, which
    # costs nothing at that size.
    _insert_cold(engine, 81)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_queue.jobs"))
        conn.execute(text("ANALYZE sqla_queue.jobs"))
    _insert_cold(engine, 81)
    with engine.connect() as conn:
        ordered, _, _ = queries.claim_plan_health(conn)
    assert not ordered
    (finding,) = [f for f in diagnose(engine) if f.name == "claim_plan"]
    assert finding.severity is Severity.ok, finding
    assert "harmless at about " in finding.value
    assert "rows (it matters past 10,000, where a worker analyzes the table)" in finding.value


def test_doctor_builds_the_claims_text_once_per_form(engine: Engine) -> None:
    """Doctor (and the dashboard's doctor page, on every load) EXPLAINs both forms of the
    claim; their text is built and compiled once, then reused: the kept texts are the same
    objects on the next call, and only the two forms are kept."""
    from sqla_queue.doctor import DoctorOptions

    # the module (the package's `claim_plan` is the function of that name)
    plans = importlib.import_module("sqla_queue.db.queries.claim_plan")
    plans._EXPLAIN_TEXTS.clear()
    diagnose(engine, DoctorOptions(sample=0))
    kept = dict(plans._EXPLAIN_TEXTS)
    assert sorted(key[2] or () for key in kept) == [(), ("default",)]
    diagnose(engine, DoctorOptions(sample=0))
    assert plans._EXPLAIN_TEXTS.keys() == kept.keys()
    assert all(plans._EXPLAIN_TEXTS[key] is texts for key, texts in kept.items())
    # the texts name the forms: the listed form binds its queues in the EXECUTE
    listed = next(texts for key, texts in kept.items() if key[2] == ("default",))
    assert "ARRAY['default']::text[]" in listed[1]
