"""doctor and signals: waits past their deadline that nothing woke, mailboxes nobody reads,
and a parked job never taken for a workflow job that lost its dependencies."""

from __future__ import annotations

from helpers.signal_kit import park_jobs
from sqlalchemy import Engine, text

import sqla_queue
from sqla_queue.doctor import Finding, Severity, diagnose
from sqla_queue.doctor.checks import MAILBOX_WARN


def finding(engine: Engine, name: str) -> Finding:
    return next(f for f in diagnose(engine) if f.name == name)


def test_a_parked_job_is_not_a_waiting_job_without_dependencies(engine: Engine) -> None:
    park_jobs(engine, "approval:1")
    waiting = finding(engine, "waiting_jobs")
    assert waiting.severity is Severity.ok
    assert waiting.details["orphaned"] == 0
    assert finding(engine, "signals").severity is Severity.ok


def test_a_wait_long_past_its_deadline_is_named_with_its_key(engine: Engine) -> None:
    park_jobs(engine, "approval:2")
    with engine.begin() as conn:  # no keeper ran for a day
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET run_at = now() - interval '1 day' "
                "WHERE status = 'waiting'"
            )
        )
    found = finding(engine, "signals")
    assert found.severity is Severity.warn
    assert found.details["overdue_waits"] == 1
    assert "'approval:2'" in found.value
    assert "past their deadline" in found.value


def test_a_mailbox_that_grows_without_a_reader_is_named(engine: Engine) -> None:
    with engine.begin() as conn:
        for n in range(MAILBOX_WARN):
            sqla_queue.signal(conn, "typo:key", n)
        sqla_queue.signal(conn, "few", 1)
    found = finding(engine, "signals")
    assert found.severity is Severity.warn
    assert found.details["unread_mailboxes"] == {"typo:key": MAILBOX_WARN}
    assert f"'typo:key' ({MAILBOX_WARN})" in found.value
