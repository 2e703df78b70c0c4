"""Per-queue concurrency and rate limits: enforced by the claim statement, across workers."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.statements import claim
from helpers.support import WorkerThread, cli, count_where, enqueue_jobs, make_queue, wait_for
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Registry, admin, enqueue_many
from sqla_queue.db import queries
from sqla_queue.errors import ConfigurationError, UnknownQueueError
from sqla_queue.job.validation import describe_rate, parse_rate


def running(engine: Engine, queue: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM sqla_queue.jobs WHERE queue = :q AND status = 'running'"
                ),
                {"q": queue},
            )
        )


# -- concurrency ------------------------------------------------------------------------------


def test_claims_take_no_more_than_the_queue_concurrency_until_jobs_finish(engine: Engine) -> None:
    make_queue(engine, "emails", concurrency=3)
    enqueue_jobs(engine, "t", 10, queue="emails")
    with engine.connect() as conn:
        first = claim(conn, 10)
        second = claim(conn, 10)
        assert (len(first), len(second)) == (3, 0)
        done = first[0]
        conn.execute(
            queries.complete_jobs(), {"job_ids": [done["id"]], "job_attempts": [done["attempts"]]}
        )
        conn.commit()
        third = claim(conn, 10)
    assert len(third) == 1
    assert running(engine, "emails") == 3


def test_a_queue_limited_while_a_worker_runs_is_never_claimed_past_its_limit(
    engine: Engine,
) -> None:
    """A worker claims with the statement without the limited-queue branch while no queue
    has a limit; a queue limited meanwhile is held back until the worker's next heartbeat
    says so, then claimed within its limit, never past it."""
    registry = Registry()
    release = threading.Event()
    registry.task(name="slow")(lambda: release.wait(60))
    with WorkerThread(engine, registry, concurrency=4, heartbeat=0.3, poll_interval=0.05) as w:
        wait_for(lambda: w.worker.keeper.limits is False)  # the lean claim is in use
        with Session(engine) as session, session.begin():  # limited before its first job
            admin.create_queue(session, "emails")
            admin.set_max_running(session, "emails", 1)
            enqueue_many(session, [{"task": "slow", "queue": "emails"}] * 4)
        seen = []
        # sampled for 3 s, and on until a job of the queue has run (however late a loaded
        # worker's beat and claim come): the limit is watched while it is being claimed
        window, deadline = time.monotonic() + 3, time.monotonic() + 60
        while time.monotonic() < window or (max(seen) < 1 and time.monotonic() < deadline):
            seen.append(running(engine, "emails"))
            time.sleep(0.05)
        release.set()
        wait_for(lambda: count_where(engine, "status IN ('queued', 'running')") == 0)
    assert max(seen) == 1  # claimed once the beat told the worker, and one at a time
    assert w.worker.keeper.limits is True


def test_a_limited_queue_does_not_hold_back_jobs_of_other_queues(engine: Engine) -> None:
    make_queue(engine, "emails", concurrency=2)
    enqueue_jobs(engine, "t", 5, queue="emails", priority=0)
    enqueue_jobs(engine, "t", 5, priority=9)  # default queue, unlimited, after by priority
    with engine.connect() as conn:
        rows = claim(conn, 6)
    assert [row["queue"] for row in rows] == ["emails", "emails", "default", "default"] + [
        "default"
    ] * 2
    assert [row["id"] for row in rows] == sorted(row["id"] for row in rows)


def test_finishing_and_claiming_in_one_statement_reuses_the_freed_slots(engine: Engine) -> None:
    make_queue(engine, "emails", concurrency=2)
    enqueue_jobs(engine, "t", 6, queue="emails")
    with engine.connect() as conn:
        held = claim(conn, 10)
        params = {
            "limit": 10,
            "worker_id": "w",
            "job_ids": [row["id"] for row in held],
            "job_attempts": [row["attempts"] for row in held],
        }
        rows = conn.execute(queries.complete_and_claim(None), params).mappings().all()
        conn.commit()
    assert len(held) == 2
    assert len(rows) == 2
    assert [row["finished"] for row in rows] == [len(held)] * len(rows)  # how many it deleted
    assert running(engine, "emails") == 2


def test_a_queue_that_keeps_jobs_frees_its_slots_only_once_they_are_done(engine: Engine) -> None:
    make_queue(engine, "emails", concurrency=1)
    with engine.begin() as conn:
        admin.set_retention(conn, "emails", "keep")
    enqueue_jobs(engine, "t", 3, queue="emails")
    with engine.connect() as conn:
        (held,) = claim(conn, 10)
        fence = {"job_ids": [held["id"]], "job_attempts": [held["attempts"]]}
        rows = conn.execute(
            queries.complete_and_claim(None), {**fence, "limit": 5, "worker_id": "w"}
        )
        assert rows.all() == []  # the kept job is finished by complete_jobs, not here
        conn.execute(queries.complete_jobs(), fence)
        conn.commit()
        assert len(claim(conn, 5)) == 1


def register_worker(conn: Connection, worker_id: str) -> None:
    registration = {
        "worker_id": worker_id,
        "hostname": "h",
        "pid": 1,
        "queues": None,
        "concurrency": 1,
        "stale_after": 60.0,
        "loop_blocked_for": None,
        "overruns": None,
    }
    conn.execute(queries.beat_worker(), registration)
    conn.commit()


def test_a_job_cancelled_while_running_holds_its_slot_until_its_worker_frees_it(
    engine: Engine,
) -> None:
    """Issue 20, 1.5: its handler runs on until it returns; the worker says when."""
    make_queue(engine, "emails", concurrency=1)
    enqueue_jobs(engine, "t", 2, queue="emails")
    with engine.connect() as conn:
        register_worker(conn, "w")
        (held,) = claim(conn, 10)
        fence = {"job_ids": [held["id"]], "job_attempts": [held["attempts"]]}
        assert admin.cancel_jobs(conn, [held["id"]]) == {held["id"]: "running"}
        conn.commit()
        assert claim(conn, 10) == []  # the cancelled handler still runs: its slot is taken
        beaten = conn.execute(
            queries.heartbeat_jobs(), {**fence, "job_leases": [30.0], "job_started": [True]}
        )
        assert beaten.all() == [(held["id"], "cancelled")]  # extended, and told it is cancelled
        conn.execute(queries.free_cancelled_jobs(), fence)  # the handler returned
        conn.commit()
        assert len(claim(conn, 10)) == 1


def test_a_cancelled_job_holds_no_slot_once_its_worker_is_gone_or_no_longer_holds_it(
    engine: Engine,
) -> None:
    make_queue(engine, "emails", concurrency=1)
    enqueue_jobs(engine, "t", 3, queue="emails")
    with engine.connect() as conn:
        register_worker(conn, "w")
        (held,) = claim(conn, 10)
        admin.cancel_jobs(conn, [held["id"]])
        conn.commit()
        free = queries.free_unheld_cancelled_jobs()
        conn.execute(text("UPDATE sqla_queue.jobs SET locked_at = now() - interval '1 minute'"))
        conn.execute(free, {"worker_id": "w", "job_ids": [held["id"]]})  # still held: kept
        conn.commit()
        assert claim(conn, 10) == []
        conn.execute(free, {"worker_id": "w", "job_ids": []})  # the reaper round: not held
        conn.commit()
        (second,) = claim(conn, 10)
        admin.cancel_jobs(conn, [second["id"]])
        conn.execute(queries.deregister_worker(), {"worker_id": "w"})  # stopped or expired
        conn.commit()
        assert len(claim(conn, 10)) == 1


def test_many_connections_claiming_at_once_never_exceed_the_limit(engine: Engine) -> None:
    make_queue(engine, "emails", concurrency=3)
    enqueue_jobs(engine, "t", 40, queue="emails")
    barrier = threading.Barrier(8)
    claimed: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with engine.connect() as conn:
                barrier.wait(60)
                claimed.extend(row["id"] for row in claim(conn, 5))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(claimed) == 3
    assert running(engine, "emails") == 3


def test_a_paused_limited_queue_is_not_claimed(engine: Engine) -> None:
    make_queue(engine, "emails", concurrency=3)
    enqueue_jobs(engine, "t", 2, queue="emails")
    with engine.begin() as conn:
        admin.set_paused(conn, "emails", True)
    with engine.connect() as conn:
        assert claim(conn, 5) == []
        assert claim(conn, 5, ["emails"]) == []


def test_lifting_the_limit_lets_the_claim_take_everything(engine: Engine) -> None:
    make_queue(engine, "emails", concurrency=1)
    enqueue_jobs(engine, "t", 4, queue="emails")
    with engine.connect() as conn:
        assert len(claim(conn, 10, ["emails"])) == 1
        admin.set_max_running(conn, "emails", None)
        conn.commit()
        assert len(claim(conn, 10, ["emails"])) == 3


# -- rate ---------------------------------------------------------------------------------------


def test_rate_limit_caps_the_starts_in_a_window(engine: Engine) -> None:
    make_queue(engine, "api", rate="4/h")
    enqueue_jobs(engine, "t", 10, queue="api")
    with engine.connect() as conn:
        first = claim(conn, 3)
        conn.execute(
            queries.complete_jobs(),
            {"job_ids": [r["id"] for r in first], "job_attempts": [r["attempts"] for r in first]},
        )
        conn.commit()
        second = claim(conn, 10)
        third = claim(conn, 10)
    # finished jobs still count: the limit is on starts, not on running jobs
    assert (len(first), len(second), len(third)) == (3, 1, 0)
    with engine.connect() as conn:
        recorded = conn.scalar(text("SELECT sum(jobs) FROM sqla_queue.queue_starts"))
    assert recorded == 4


def test_starts_older_than_the_window_no_longer_count(engine: Engine) -> None:
    # an hour's window, passed by ageing the stored starts (not by sleeping through a short
    # one: under load two back-to-back claims came more than 3 s apart)
    make_queue(engine, "api", rate=(2, 3600.0))
    enqueue_jobs(engine, "t", 5, queue="api")
    with engine.connect() as conn:
        assert len(claim(conn, 10)) == 2
        assert claim(conn, 10) == []
        conn.execute(
            text("UPDATE sqla_queue.queue_starts SET started_at = started_at - interval '3601 s'")
        )
        conn.commit()
        assert len(claim(conn, 10)) == 2
    with engine.connect() as conn:  # the claim pruned the starts of the window that passed
        assert conn.scalar(text("SELECT sum(jobs) FROM sqla_queue.queue_starts")) == 2


def test_concurrency_and_rate_together_take_the_smaller(engine: Engine) -> None:
    make_queue(engine, "api", concurrency=5, rate=(2, 3600.0))
    enqueue_jobs(engine, "t", 8, queue="api")
    with engine.connect() as conn:
        assert len(claim(conn, 10)) == 2


# -- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text_", "expected", "shown"),
    [
        ("100/s", (100, 1.0), "100/s"),
        ("10/min", (10, 60.0), "10/min"),
        ("500/h", (500, 3600.0), "500/h"),
        ("20/30s", (20, 30.0), "20/30s"),
        ("3/hours", (3, 3600.0), "3/h"),
    ],
)
def test_rates_read_and_print_back(text_: str, expected: tuple[int, float], shown: str) -> None:
    assert parse_rate(text_) == expected
    assert describe_rate(*expected) == shown


@pytest.mark.parametrize("bad", ["0/s", "1.5/s", "10/0s", "10/y", "100", "/s", "-1/s"])
def test_bad_rates_are_refused_naming_the_accepted_forms(bad: str) -> None:
    with pytest.raises(ValueError, match="100/s, 10/min"):
        parse_rate(bad)


def test_admin_refuses_a_bad_limit_and_an_unknown_queue(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(
            ConfigurationError,
            match="max_running must be a whole number from 1 to 2147483647, got 0",
        ):
            admin.set_max_running(conn, "default", 0)
        with pytest.raises(ConfigurationError, match="100/s"):
            admin.set_rate(conn, "default", "lots")
        with pytest.raises(UnknownQueueError, match="queues create ghost"):
            admin.set_max_running(conn, "ghost", 3)


def test_cli_creates_sets_lists_and_lifts_limits(database_url: str, engine: Engine) -> None:
    created = cli(
        "queues", "create", "emails", "--max-running", "5", "--rate", "100/s", url=database_url
    )
    assert created.exit_code == 0, created.output
    assert "max-running 5, rate 100/s" in created.stdout

    changed = cli(
        "queues", "set", "emails", "--max-running", "2", "--rate", "10/min", url=database_url
    )
    assert changed.exit_code == 0, changed.output
    listed = cli("queues", "list", url=database_url)
    assert "emails\tactive\tretention=delete\tmax-running=2\trate=10/min" in listed.stdout

    lifted = cli("queues", "set", "emails", "--no-max-running", "--no-rate", url=database_url)
    assert lifted.exit_code == 0, lifted.output
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT concurrency, rate_limit, rate_window FROM sqla_queue.queues "
                "WHERE name = 'emails'"
            )
        ).one()
    assert tuple(row) == (None, None, None)


def test_cli_refuses_a_limit_and_its_lifting_together(database_url: str) -> None:
    created = cli("queues", "create", "emails", "--max-running", "5", url=database_url)
    both = cli(
        "queues", "set", "emails", "--max-running", "3", "--no-max-running", url=database_url
    )

    assert created.exit_code == 0, created.output
    assert both.exit_code == 2
    assert "pass --max-running or --no-max-running, not both" in both.stderr


def test_cli_refuses_a_bad_rate_in_one_line(database_url: str) -> None:
    result = cli("queues", "create", "emails", "--rate", "fast", url=database_url)
    assert result.exit_code == 2
    assert "'fast' is not a rate" in result.output
    assert "100/s" in result.output
    both = cli("queues", "set", "emails", "--rate", "1/s", "--no-rate", url=database_url)
    assert both.exit_code == 2
    assert "--rate or --no-rate" in both.output
