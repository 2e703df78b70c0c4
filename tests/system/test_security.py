"""Security: values never become SQL, and the worker runs with the privileges the docs list
(docs/production.md, "Security") only.

1. Injection strings go through every CLI option and API argument; afterwards every table is
   intact and the strings are stored (or refused) as plain data.
2. A role granted exactly the privileges docs/production.md lists runs a real
   `sqla-queue worker` through every path (claim, heartbeat, reap, retry, fail,
   delete/keep/archive), each of those privileges is needed, and the role can touch nothing
   else.
"""

from __future__ import annotations

import logging
import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from helpers.fault_kit import (
    FaultDatabase,
    WorkerProcess,
    wait_until,
)
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import (
    JobContext,
    Registry,
    SqlaQueueError,
    admin,
    enqueue,
    enqueue_many,
)
from sqla_queue.cli import main
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig

INJECTIONS = [
    "x'; DROP TABLE sqla_queue.jobs; --",
    '"; DROP SCHEMA sqla_queue CASCADE; --',
    "') OR 1=1; DELETE FROM public.canary; --",
    "$$; TRUNCATE sqla_queue.queues CASCADE; $$",
    "\\'; DROP TABLE public.canary; --",
    "1; UPDATE sqla_queue.jobs SET status = 'done'",
]

TABLES_SQL = (
    "SELECT table_schema || '.' || table_name FROM information_schema.tables "
    "WHERE table_schema IN ('sqla_queue', 'public') ORDER BY 1"
)


def table_names(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text(TABLES_SQL)).scalars())


@pytest.fixture
def canary(engine: Engine) -> Callable[[], list[Any]]:
    """A table of the 'application' that injected SQL would like to drop or empty."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.canary (id int PRIMARY KEY, note text)"))
        conn.execute(text("INSERT INTO public.canary VALUES (1, 'still here')"))

    def rows() -> list[Any]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT * FROM public.canary"))]

    return rows


def test_injection_strings_through_every_cli_option_stay_data(
    database_url: str, engine: Engine, canary: Callable[[], list[Any]]
) -> None:
    tables = table_names(engine)
    runner = CliRunner()

    def cli(*args: str, url: str = database_url) -> Any:
        return runner.invoke(main, list(args), env={"SQLA_QUEUE_DATABASE_URL": url})

    for evil in INJECTIONS:
        assert cli("queues", "create", evil, "--retention", "keep").exit_code == 0
        result = cli(
            "enqueue", evil, "--queue", evil, "--args", '{"k": "v"}',
            "--priority", "1", "--delay", "0", "--max-attempts", "2",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        job_id = result.output.strip()
        for command in ("pause", "resume"):
            assert cli("queues", command, evil).exit_code == 0
        assert evil in cli("queues", "list").output
        assert evil in cli("stats", "--json").output
        assert cli("stats").exit_code == 0
        assert cli("jobs", "cancel", job_id).exit_code == 0
        # Options that are validated refuse the string; none reaches SQL as text.
        for refused in (
            ["queues", "create", "q", "--retention", evil],
            ["prune", "--older-than", evil],
            ["prune", "--older-than", "0", "--status", evil],
            ["jobs", "cancel", evil],
            ["enqueue", "t", "--args", evil],
            ["enqueue", "t", "--priority", evil],
            ["migrate", "--revision", evil],
        ):
            assert cli(*refused).exit_code != 0, refused
        result = cli("stats", url=make_url(database_url).set(database=evil).render_as_string(False))
        assert result.exit_code == 1
        assert "does not exist" in result.output
        assert cli("prune", "--older-than", "0", "--status", "cancelled").exit_code == 0
        assert cli("queues", "delete", evil, "--force").exit_code == 0

    assert canary() == [(1, "still here")]
    assert table_names(engine) == tables
    with engine.connect() as conn:
        queues = conn.execute(text("SELECT name FROM sqla_queue.queues")).scalars().all()
        assert queues == ["default"]


def test_injection_strings_through_every_api_argument_stay_data(
    engine: Engine, canary: Callable[[], list[Any]]
) -> None:
    tables = table_names(engine)
    for evil in INJECTIONS:
        registry = Registry()
        seen: list[dict[str, Any]] = []
        registry.task(name=evil)(lambda seen=seen, **kwargs: seen.append(kwargs))

        with Session(engine) as session, session.begin():
            assert admin.create_queue(session, evil, "archive")
            admin.set_paused(session, evil, True)
            admin.set_paused(session, evil, False)
            admin.set_retention(session, evil, "keep")
            with pytest.raises(SqlaQueueError):
                admin.set_retention(session, evil, evil)
            enqueue(session, evil, {evil: evil}, queue=evil)
            enqueue_many(session, [{"task": evil, "queue": evil, "args": {"k": [evil]}}])
        config = WorkerConfig(queues=[evil], worker_id=evil, concurrency=1, poll_only=True)
        assert run_until_empty(engine, registry, config).succeeded == 2
        assert sorted(map(str, seen)) == sorted(map(str, [{evil: evil}, {"k": [evil]}]))
        with Session(engine) as session, session.begin():
            assert any(row.queue == evil for row in admin.stats(session))
            with pytest.raises(SqlaQueueError):
                admin.prune(session, 0, [evil])
            assert admin.prune(session, 0, ["done"]) == 2
            assert admin.delete_queue(session, evil) == 0
            with pytest.raises(SqlaQueueError):
                admin.delete_queue(session, evil)

    assert canary() == [(1, "still here")]
    assert table_names(engine) == tables


# -- least privilege ---------------------------------------------------------------------------

WORKER_GRANTS = [
    "GRANT CONNECT ON DATABASE {database} TO {role}",
    "GRANT USAGE ON SCHEMA sqla_queue TO {role}",
    "GRANT SELECT ON sqla_queue.queues TO {role}",
    "GRANT SELECT ON sqla_queue.jobs TO {role}",
    "GRANT UPDATE ON sqla_queue.jobs TO {role}",
    "GRANT DELETE ON sqla_queue.jobs TO {role}",
    "GRANT SELECT, INSERT, UPDATE ON sqla_queue.jobs_history TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.workers TO {role}",
    "GRANT SELECT, INSERT, DELETE ON sqla_queue.queue_starts TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.job_counts TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.stopped_workers TO {role}",
    "GRANT SELECT ON sqla_queue.partition_weights TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.partition_turns TO {role}",
    "GRANT SELECT, UPDATE ON sqla_queue.job_deps TO {role}",
    "GRANT SELECT ON sqla_queue.schema_revisions TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.job_steps TO {role}",
    "GRANT SELECT, UPDATE, DELETE ON sqla_queue.signals TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.signal_waits TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.job_progress TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON sqla_queue.job_logs TO {role}",
]
"""Exactly what docs/production.md ("Security") lists for the worker's role."""


class WorkerRole:
    """A login role of the test's own, granted `WORKER_GRANTS` on the test database."""

    def __init__(self, db: FaultDatabase) -> None:
        self.db = db
        self.name = f"sqlaq_worker_{uuid.uuid4().hex[:8]}"
        self.url = make_url(db.url).set(username=self.name).render_as_string(False)
        self.dsn = make_url(self.url).set(drivername="postgresql").render_as_string(False)
        db.conn.execute(f'CREATE ROLE "{self.name}" LOGIN')
        # Nothing through PUBLIC: the role has the grants below and nothing else.
        db.conn.execute(f'REVOKE ALL ON DATABASE "{db.name}" FROM PUBLIC')
        db.conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        for grant in WORKER_GRANTS:
            db.conn.execute(self.sql(grant))

    def sql(self, statement: str) -> str:
        return statement.format(database=f'"{self.db.name}"', role=f'"{self.name}"')

    def revoke(self, grant: str) -> str:
        return self.sql(grant).replace("GRANT", "REVOKE", 1).replace(" TO ", " FROM ")

    def drop(self) -> None:
        self.db.conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
            (self.name,),
        )
        self.db.conn.execute(f'DROP OWNED BY "{self.name}"')
        self.db.conn.execute(f'DROP ROLE "{self.name}"')


@pytest.fixture
def worker_role(fault_db: FaultDatabase) -> Iterator[WorkerRole]:
    role = WorkerRole(fault_db)
    yield role
    role.drop()


def test_worker_runs_every_path_with_only_the_documented_privileges(
    fault_db: FaultDatabase, worker_role: WorkerRole, workers: Callable[..., WorkerProcess]
) -> None:
    engine = create_engine(fault_db.url)
    try:
        with Session(engine) as session, session.begin():
            for retention in ("delete", "keep", "archive"):
                admin.create_queue(session, retention, retention)
                enqueue(session, "record", {"n": 1}, queue=retention)
            enqueue(session, "sync_overrun", {"seconds": 1, "succeed_on_attempt": 2})
            enqueue(session, "no.such.task")
            stale = enqueue(session, "record", {"n": 2})
            session.flush()
            stale_id = stale.id
        # A job whose worker died an hour ago, for the reaper.
        fault_db.conn.execute(
            "UPDATE sqla_queue.jobs SET status = 'running', attempts = 1, locked_by = 'dead', "
            "heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            (stale_id,),
        )
    finally:
        engine.dispose()

    # The handlers (application code) record through the application's own connection.
    # -q "*": its jobs are in queues the app's tasks do not name (delete, keep, archive)
    worker = workers(worker_role.url, "--lease", "1", "-c", "2", "-q", "*", app_dsn=fault_db.dsn)
    # the unknown task's job is put back for a worker that knows it (status queued)
    wait_until(lambda: fault_db.unfinished() == 1, 120, what="every other job to finish")
    wait_until(
        lambda: fault_db.value(
            "SELECT count(*) FROM sqla_queue.jobs WHERE status = 'queued' AND attempts = 0 "
            "AND last_error LIKE 'deferred %% time(s): unknown task %%'"
        ),
        60,
        what="the unknown task's job to be deferred",
    )
    worker.wait_started()
    worker.signal(signal.SIGTERM)
    assert worker.proc is not None
    assert worker.proc.wait(60) == 0
    assert "permission denied" not in worker.log()
    assert "requeued 1 job(s)" in worker.log()

    # keep's job and archive's (both in the history), and the unknown task's job, left for
    # a worker that knows it
    assert fault_db.status_counts() == {"done": 2, "queued": 1}
    assert fault_db.value("SELECT count(*) FROM sqla_queue.jobs_history") == 2
    assert fault_db.value("SELECT count(DISTINCT job_id) FROM public.fault_runs") == 5


FORBIDDEN = [
    "SELECT * FROM public.fault_runs",
    "DELETE FROM public.fault_ledger",
    "CREATE TABLE public.mine (id int)",
    "CREATE TABLE sqla_queue.mine (id int)",
    "INSERT INTO sqla_queue.jobs (task) VALUES ('forged')",
    "INSERT INTO sqla_queue.queues (name) VALUES ('forged')",
    "UPDATE sqla_queue.queues SET paused = true",
    "DELETE FROM sqla_queue.queues",
    "SELECT * FROM sqla_queue.jobs_archive",
    "TRUNCATE sqla_queue.jobs",
    "DROP TABLE sqla_queue.jobs",
    "ALTER TABLE sqla_queue.jobs ADD COLUMN mine int",
    "SELECT * FROM sqla_queue.alembic_version_sqla_queue",
]


def test_worker_role_cannot_touch_anything_else(worker_role: WorkerRole) -> None:
    with psycopg.connect(worker_role.dsn, autocommit=True) as conn:
        for statement in FORBIDDEN:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


@pytest.mark.parametrize("grant", WORKER_GRANTS)
def test_each_documented_privilege_is_needed(
    fault_db: FaultDatabase, worker_role: WorkerRole, grant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without any one grant, a job in a rate-limited, fair archive queue cannot be claimed
    and finished (the limit makes the claim record its start in queue_starts, and the fair
    claim reads the partition weights and records its turn); without the one
    on stopped_workers, the job runs but the worker cannot deregister (its stop is recorded
    there in the same statement): it says so, and its registration is left to expire; without
    the one on schema_revisions, a worker cannot tell a newer expand revision (which it may
    run on) from a contract one, and refuses; without one on the signals' tables, a
    handler's wait cannot take its signal (its attempt fails, retried once granted); without
    the one on job_steps, an archived job's steps cannot be removed with it."""
    registry = Registry()
    registry.task(name="noop")(lambda: None)

    @registry.task(name="waits", pass_context=True)
    def waits(ctx: JobContext) -> None:
        assert ctx.wait_for_signal("security:1", timeout=60) == {"ok": True}

    admin_engine = create_engine(fault_db.url)
    role_engine = create_engine(worker_role.url)
    config = WorkerConfig(concurrency=1, poll_only=True)
    try:
        with Session(admin_engine) as session, session.begin():
            admin.create_queue(session, "archived", "archive")
            admin.set_rate(session, "archived", "1000/s")
            admin.set_fair(session, "archived")  # its claim reads weights and writes turns
            enqueue(session, "noop", queue="archived")
        fault_db.conn.execute(worker_role.revoke(grant))
        if "job_counts" in grant:  # the rollup's write fails alone, logged: the job is done
            with caplog.at_level(logging.WARNING, "sqla_queue.worker"):
                assert run_until_empty(role_engine, registry, config).succeeded == 1
            assert "permission denied for table job_counts" in caplog.text
            assert fault_db.value("SELECT count(*) FROM sqla_queue.job_counts") == 0
            with Session(admin_engine) as session, session.begin():
                enqueue(session, "noop", queue="archived")
        elif "stopped_workers" in grant:
            with caplog.at_level(logging.WARNING, logger="sqla_queue.worker"):
                assert run_until_empty(role_engine, registry, config).succeeded == 1
            assert "could not remove this worker's registration" in caplog.text
            assert "permission denied" in caplog.text
            assert fault_db.value("SELECT count(*) FROM sqla_queue.workers") == 1
            fault_db.conn.execute("DELETE FROM sqla_queue.workers")
            with Session(admin_engine) as session, session.begin():
                enqueue(session, "noop", queue="archived")
        elif "signal" in grant:
            # a handler's wait takes its signal from the mailbox and records its answer
            fault_db.conn.execute("DELETE FROM sqla_queue.jobs")
            with Session(admin_engine) as session, session.begin():
                sqla_queue.signal(session, "security:1", {"ok": True})
                enqueue(session, "waits", queue="archived")
            assert run_until_empty(role_engine, registry, config).retried == 1
            assert "permission denied" in fault_db.value("SELECT last_error FROM sqla_queue.jobs")
            fault_db.conn.execute("UPDATE sqla_queue.jobs SET run_at = now()")
        elif "schema_revisions" in grant:
            # a newer sqla-queue applied an expand revision: its kind is read there
            fault_db.conn.execute(
                "COMMENT ON SCHEMA sqla_queue IS 'sqla_queue revision sqlaq_9998_future'"
            )
            fault_db.conn.execute(
                "INSERT INTO sqla_queue.schema_revisions VALUES ('sqlaq_9998_future', 'expand')"
            )
            with pytest.raises(Exception, match="sqlaq_9998_future"):
                run_until_empty(role_engine, registry, config)
        else:
            with pytest.raises(Exception, match="permission denied"):
                run_until_empty(role_engine, registry, config)
        role_engine.dispose()
        fault_db.conn.execute(worker_role.sql(grant))
        fault_db.conn.execute(
            "UPDATE sqla_queue.jobs SET status = 'queued' WHERE status = 'running'"
        )
        assert run_until_empty(role_engine, registry, config).succeeded == 1, fault_db.rows(
            "SELECT status, last_error FROM sqla_queue.jobs"
        )
        one_more = "job_counts" in grant or "stopped_workers" in grant  # ran above
        archived = 2 if one_more else 1
        assert fault_db.value("SELECT count(*) FROM sqla_queue.jobs_history") == archived
        assert fault_db.value("SELECT how FROM sqla_queue.stopped_workers") == "graceful"
        # >= 1: without e.g. the archive's INSERT the handler ran (and was counted) before
        # its finish was refused; the rollup counts attempts as their handlers end
        assert fault_db.value("SELECT sum(succeeded) FROM sqla_queue.job_counts") >= 1
    finally:
        role_engine.dispose()
        admin_engine.dispose()
