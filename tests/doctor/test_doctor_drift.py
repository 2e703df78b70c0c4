"""`doctor`'s schema drift: the catalogue compared with what head expects, each difference
named with the statement that fixes it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from helpers.races import Race
from sqlalchemy import Engine, text

from sqla_queue.db.models import WORKER_PRIVILEGES
from sqla_queue.doctor import DoctorOptions, Severity, diagnose
from sqla_queue.doctor.checks import check_schema_drift, schema_differences


def drift(engine: Engine, worker_role: str | None = None) -> list[str]:
    with engine.connect() as conn:
        return schema_differences(conn, worker_role)


def test_a_migrated_database_has_no_drift(engine: Engine) -> None:
    with engine.connect() as conn:
        finding = check_schema_drift(conn, DoctorOptions())
    assert finding.severity is Severity.ok, finding.value
    assert drift(engine) == []


def test_a_dropped_index_is_named_with_its_create_statement(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX sqla_queue.ix_jobs_about"))
    (found,) = drift(engine)
    assert found.startswith("index sqla_queue.ix_jobs_about is missing: ")
    assert "CREATE INDEX CONCURRENTLY ix_jobs_about ON sqla_queue.jobs (about)" in found
    assert "WHERE about IS NOT NULL" in found
    by_name = {f.name: f for f in diagnose(engine, DoctorOptions(sample=0))}
    assert by_name["schema_drift"].severity is Severity.critical
    assert by_name["schema_drift"].details["differences"] == [found]


def test_an_invalid_index_is_named_with_its_drop_and_rebuild(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX sqla_queue.ix_jobs_about"))
        conn.execute(text("INSERT INTO sqla_queue.jobs (task, about) VALUES ('t', 'x:1')"))
        conn.execute(text("INSERT INTO sqla_queue.jobs (task, about) VALUES ('t', 'x:1')"))
    # a concurrent build that failed half way (a duplicate here) leaves the index INVALID
    autocommit = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    with autocommit as conn, pytest.raises(Exception, match="could not create unique index"):
        conn.execute(
            text(
                "CREATE UNIQUE INDEX CONCURRENTLY ix_jobs_about ON sqla_queue.jobs (about) "
                "WHERE about IS NOT NULL"
            )
        )
    (found,) = drift(engine)
    assert found.startswith("index sqla_queue.ix_jobs_about is INVALID")
    assert "DROP INDEX CONCURRENTLY sqla_queue.ix_jobs_about; then CREATE INDEX" in found


def test_a_missing_trigger_is_named_with_where_its_statement_is(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP TRIGGER job_revived_unique ON sqla_queue.jobs"))
    (found,) = drift(engine)
    assert found.startswith("trigger job_revived_unique on sqla_queue.jobs is missing")
    assert "sqlaq_0016_unique_revival.py (TRIGGER)" in found


@pytest.fixture
def worker_role(engine: Engine) -> Iterator[str]:
    """A role granted every privilege a worker needs."""
    role = f"sqlaq_drift_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role}"))
        conn.execute(text(f"GRANT USAGE ON SCHEMA sqla_queue TO {role}"))
        for table, privileges in WORKER_PRIVILEGES.items():
            conn.execute(text(f"GRANT {', '.join(privileges)} ON sqla_queue.{table} TO {role}"))
    yield role
    with Race(engine):  # ends this database's other sessions before the role goes
        pass
    with engine.begin() as conn:
        conn.execute(text(f"DROP OWNED BY {role}"))
        conn.execute(text(f"DROP ROLE {role}"))


def test_a_missing_grant_of_the_worker_role_is_named_with_its_grant(
    engine: Engine, worker_role: str
) -> None:
    assert drift(engine, worker_role) == []
    with engine.begin() as conn:
        conn.execute(text(f"REVOKE UPDATE ON sqla_queue.job_deps FROM {worker_role}"))
    (found,) = drift(engine, worker_role)
    assert found == (
        f"role {worker_role} lacks UPDATE on sqla_queue.job_deps: "
        f"GRANT UPDATE ON sqla_queue.job_deps TO {worker_role}"
    )
    assert drift(engine, "sqlaq_no_such_role") == [
        "role sqlaq_no_such_role does not exist: CREATE ROLE sqlaq_no_such_role LOGIN"
    ]
