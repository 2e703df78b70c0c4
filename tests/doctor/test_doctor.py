"""`sqla-queue doctor`: each bad condition is created for real, and doctor reports it.

These run on the private cluster of `multixact_support`: doctor's MultiXact checks are
cluster-wide, and the shared test server runs with autovacuum off.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from helpers.multixact_support import (
    add_queue_fk,
    private_databases,
    run_naive_savepoint_worker,
    tagged_engine,
)
from helpers.support import count_where, enqueue_jobs, wait_for
from helpers.turns_kit import HELD_SEQUENCE, turns_backlog
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from sqla_queue import (
    enqueue,
)
from sqla_queue.admin import create_queue, set_paused
from sqla_queue.cli import main
from sqla_queue.db.migrate import drop_queue_fk
from sqla_queue.doctor import DoctorOptions, Finding, Severity, diagnose

QUICK = DoctorOptions(sample=0)

EVERY_CHECK = {
    "schema",
    "server_version",
    "multixact_waits",
    "multixact_rate",
    "oldest_transaction",
    "oldest_xmin",
    "vacuum_horizon",
    "subtransactions",
    "multixact_age",
    "queue_foreign_key",
    "schema_drift",
    "tables",
    "autovacuum_settings",
    "jobs_vacuum",
    "jobs_truncatable",
    "claim_plan",
    "stuck_jobs",
    "waiting_jobs",
    "signals",
    "workers",
    "backlog",
    "failed_jobs",
    "held_sequences",
    "history",
    "unknown_tasks",
}


@pytest.fixture
def engine(private_url: str) -> Iterator[Engine]:
    eng = create_engine(private_url, pool_size=10, max_overflow=10)
    yield eng
    eng.dispose()


def _by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {finding.name: finding for finding in findings}


def _insert_job(engine: Engine, status: str, **times: str) -> None:
    columns = ", ".join(["task", "status", *times])
    values = ", ".join(["'t'", f"'{status}'", *(f"now() - interval '{v}'" for v in times.values())])
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO sqla_queue.jobs ({columns}) VALUES ({values})"))


def test_healthy_database_reports_every_check_ok(engine: Engine) -> None:
    findings = diagnose(engine, DoctorOptions(sample=0.5))

    assert {f.name for f in findings} == EVERY_CHECK
    assert {f.name: f.severity for f in findings} == dict.fromkeys(EVERY_CHECK, Severity.ok)
    found = _by_name(findings)
    assert found["queue_foreign_key"].details["present"] is False  # sqlaq_0031: triggers
    assert found["queue_foreign_key"].details["checked_by_triggers"] is True
    assert found["multixact_rate"].details["minted"] == 0
    assert all(f.fix for f in findings)


def test_transactions_held_open_elsewhere_are_named_with_their_age(private_url: str) -> None:
    holder, app_name = tagged_engine(private_url)
    try:
        with holder.connect() as xid_conn, holder.connect() as snapshot_conn:
            xid_conn.begin()
            xid_pid = xid_conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            xid_conn.execute(text("SELECT pg_current_xact_id()"))
            snapshot_conn.execution_options(isolation_level="REPEATABLE READ").begin()
            snapshot_pid = snapshot_conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            time.sleep(1.2)

            doctor = create_engine(private_url)
            found = _by_name(diagnose(doctor, DoctorOptions(sample=0, long_transaction=1.0)))
            doctor.dispose()
    finally:
        holder.dispose()

    oldest = found["oldest_transaction"]
    assert oldest.severity is Severity.warn
    assert oldest.details["pid"] == xid_pid
    assert oldest.details["application_name"] == app_name
    assert oldest.details["state"] == "idle in transaction"
    assert oldest.details["seconds"] >= 1.0
    assert f"pid {xid_pid}" in oldest.value
    xmin = found["oldest_xmin"]
    assert xmin.severity is Severity.warn
    assert xmin.details["pid"] == snapshot_pid
    assert "vacuum cannot remove" in xmin.fix


def test_savepoint_load_minting_multixacts_is_reported(engine: Engine) -> None:
    enqueue_jobs(engine, "noop", 3000)
    stop = threading.Event()
    naive = threading.Thread(target=run_naive_savepoint_worker, args=(engine, stop))
    naive.start()
    try:
        # the anti-pattern is under way (not a guess that 0.2 s was enough to start it)
        wait_for(lambda: count_where(engine, "status = 'done'") > 0)
        # warn above 1/s (the default 10/s is a rate a loaded machine's naive loop misses)
        found = _by_name(diagnose(engine, DoctorOptions(sample=1.0, multixact_rate=1.0)))
    finally:
        stop.set()
        naive.join(30)

    rate = found["multixact_rate"]
    assert rate.severity is Severity.warn
    assert rate.details["minted"] > 0
    assert "savepoint" in rate.fix or "subtransactions" in rate.fix.lower()


def test_stale_running_job_is_critical_and_the_command_exits_1(
    engine: Engine, private_url: str
) -> None:
    _insert_job(engine, "running", heartbeat_at="1 hour", locked_at="1 hour")

    found = _by_name(diagnose(engine, DoctorOptions(sample=0, stuck_after=60)))
    result = CliRunner().invoke(
        main, ["doctor", "--json", "--sample", "0", "--database-url", private_url]
    )
    patient = CliRunner().invoke(
        main, ["doctor", "--sample", "0", "--stuck-after", "2h", "--database-url", private_url]
    )

    assert found["stuck_jobs"].severity is Severity.critical
    assert found["stuck_jobs"].details["count"] == 1
    assert found["stuck_jobs"].details["oldest_seconds"] >= 3600
    assert result.exit_code == 1
    stuck = next(f for f in json.loads(result.output) if f["name"] == "stuck_jobs")
    assert stuck["severity"] == "critical"
    assert patient.exit_code == 0, patient.output
    assert "stuck_jobs" in patient.output


def test_fk_with_concurrent_enqueuers_warns_and_is_absent_after_the_drop(engine: Engine) -> None:
    add_queue_fk(engine)  # as a schema before sqlaq_0031 had it
    sessions = 8
    inserted = threading.Barrier(sessions + 1)
    checked = threading.Event()

    def enqueuer() -> None:
        with Session(engine) as session, session.begin():
            enqueue(session, "t", {})
            session.flush()
            inserted.wait(30)
            checked.wait(30)

    threads = [threading.Thread(target=enqueuer) for _ in range(sessions)]
    for thread in threads:
        thread.start()
    try:
        inserted.wait(30)
        with_fk = _by_name(diagnose(engine, QUICK))["queue_foreign_key"]
    finally:
        checked.set()
        for thread in threads:
            thread.join(30)
    drop_queue_fk(engine)
    without_fk = _by_name(diagnose(engine, QUICK))["queue_foreign_key"]

    assert with_fk.severity is Severity.warn
    assert with_fk.details == {
        "present": True,
        "checked_by_triggers": True,
        "recent_enqueuers": sessions,
    }
    assert "present (fk_jobs_queue_queues)" in with_fk.value
    assert "`sqla-queue migrate`" in with_fk.fix
    assert without_fk.severity is Severity.ok
    assert without_fk.details["present"] is False
    assert without_fk.details["checked_by_triggers"] is False
    assert "jobs may name unknown queues" in without_fk.value


def test_jobs_of_missing_queues_are_named_once_the_fk_is_dropped(engine: Engine) -> None:
    drop_queue_fk(engine)
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {}, queue="typo")

    finding = _by_name(diagnose(engine, QUICK))["queue_foreign_key"]

    assert finding.severity is Severity.warn
    assert finding.details["orphan_queues"] == {"typo": 1}
    assert "'typo' (1 jobs)" in finding.value


def test_backlog_and_failed_jobs_are_reported_except_for_paused_queues(engine: Engine) -> None:
    _insert_job(engine, "queued", run_at="1 hour")
    _insert_job(engine, "failed", finished_at="5 minutes")

    found = _by_name(diagnose(engine, DoctorOptions(sample=0, backlog_threshold=300)))
    with engine.begin() as conn:
        set_paused(conn, "default", True)
    paused = _by_name(diagnose(engine, QUICK))["backlog"]

    assert found["backlog"].severity is Severity.warn
    assert found["backlog"].details["default"]["count"] == 1
    assert found["backlog"].details["default"]["oldest_seconds"] >= 3600
    assert found["failed_jobs"].severity is Severity.warn
    assert found["failed_jobs"].details["default"]["count"] == 1
    assert found["failed_jobs"].details["default"]["latest_seconds_ago"] >= 300
    assert paused.severity is Severity.ok
    assert "paused" in paused.value


def test_removed_autovacuum_settings_warn(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_queue.jobs RESET (autovacuum_vacuum_scale_factor)"))

    finding = _by_name(diagnose(engine, QUICK))["autovacuum_settings"]

    assert finding.severity is Severity.warn
    assert "autovacuum_vacuum_scale_factor=default" in finding.value


def test_database_without_schema_is_critical() -> None:
    dbs = private_databases()
    url = dbs.create_empty()
    engine = create_engine(url)
    try:
        findings = diagnose(engine, QUICK)
    finally:
        engine.dispose()
        dbs.drop(url)

    assert findings[0].name == "schema"
    assert findings[0].severity is Severity.critical
    assert "sqla-queue migrate" in findings[0].fix
    assert "queue_foreign_key" not in {f.name for f in findings}


def test_doctor_runs_inside_the_callers_transaction(engine: Engine) -> None:
    with engine.begin() as conn:
        create_queue(conn, "reports")
        findings = diagnose(conn, QUICK)

    assert {f.name for f in findings} == EVERY_CHECK
    assert not [f for f in findings if f.value.startswith("could not check")]


def test_command_prints_a_table_of_every_check(private_url: str) -> None:
    result = CliRunner().invoke(main, ["doctor", "--sample", "0", "--database-url", private_url])

    assert result.exit_code == 0, result.output
    for name in EVERY_CHECK:
        assert name in result.output


def test_json_output_is_valid_with_every_kind_of_figure(engine: Engine, private_url: str) -> None:
    _insert_job(engine, "failed", finished_at="1 minute")
    _insert_job(engine, "queued", run_at="1 hour")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM sqla_queue.jobs"))

    result = CliRunner().invoke(
        main, ["doctor", "--json", "--sample", "0.2", "--database-url", private_url]
    )

    assert result.exit_code == 0, result.output
    found = {f["name"]: f for f in json.loads(result.output)}
    assert set(found) == EVERY_CHECK
    assert found["tables"]["details"]["jobs"]["last_vacuum_seconds_ago"] >= 0
    assert found["failed_jobs"]["details"]["default"]["latest_seconds_ago"] >= 60
    assert found["backlog"]["severity"] == "warn"


def test_doctor_json_hides_other_sessions_sql_unless_asked(database_url: str) -> None:
    other = create_engine(database_url)
    try:
        with other.connect() as conn:
            conn.execute(text("SELECT pg_current_xact_id()"))
            conn.execute(text("SELECT 'hunter2-secret-token' AS password"))
            args = ["doctor", "--json", "--sample", "0", "--database-url", database_url]
            default = CliRunner().invoke(main, args)
            opted_in = CliRunner().invoke(main, [*args, "--show-queries"])
            conn.rollback()
    finally:
        other.dispose()
    assert default.exit_code == 0, default.output
    assert "hunter2-secret-token" not in default.output
    found = {f["name"]: f for f in json.loads(default.output)}
    assert found["oldest_transaction"]["details"]["command"] == "SELECT"
    assert found["oldest_transaction"]["details"]["query"] is None
    assert "hunter2-secret-token" in opted_in.output


def test_doctor_names_no_command_for_text_that_does_not_start_with_one() -> None:
    from sqla_queue.doctor.checks import _command

    assert _command("  update sqla_queue.jobs SET x = 'secret'") == "UPDATE"
    assert _command("hunter2 oops") is None
    assert _command("/* secret */ SELECT 1") is None
    assert _command(None) is None


def test_a_sequence_held_by_a_failed_job_for_long_is_named_with_its_fix(engine: Engine) -> None:
    failed_id = turns_backlog(engine, held_minutes=20)

    held = _by_name(diagnose(engine, QUICK))["held_sequences"]

    assert held.severity is Severity.warn
    assert repr(HELD_SEQUENCE) in held.value
    assert f"failed job {failed_id} for 20 min, 2 job(s) waiting behind it" in held.value
    assert f"sqla-queue jobs retry {failed_id}" in held.fix
    assert f"sqla-queue jobs delete {failed_id}" in held.fix
    assert "sqla-queue queues set default --sequence-on-failure skip" in held.fix
    assert held.details["held"][0]["behind"] == 2


def test_a_sequence_held_briefly_or_with_nothing_behind_is_ok(engine: Engine) -> None:
    failed_id = turns_backlog(engine, held_minutes=5)
    assert _by_name(diagnose(engine, QUICK))["held_sequences"].severity is Severity.ok
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET finished_at = now() - interval '1 h' WHERE id = :i"),
            {"i": failed_id},
        )
        conn.execute(
            text("DELETE FROM sqla_queue.jobs WHERE sequence = :s AND id > :i"),
            {"s": HELD_SEQUENCE, "i": failed_id},
        )
    assert _by_name(diagnose(engine, QUICK))["held_sequences"].severity is Severity.ok
    with engine.begin() as conn:  # the queue skips failures: the sequence is not held
        conn.execute(text("UPDATE sqla_queue.queues SET sequence_on_failure = 'skip'"))
    turns_backlog(engine, held_minutes=30)
    assert _by_name(diagnose(engine, QUICK))["held_sequences"].severity is Severity.ok
