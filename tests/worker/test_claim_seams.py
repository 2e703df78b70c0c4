"""Where the claim meets sequences, partitions and cancel (issue 33, defects 2, 3, 10, 11, 16):
each test drives the claim statement itself (`claim_jobs`, `sqla_queue.claim_turns`) and the
worker's own finishing statements, and asserts what they decided, in claims, not seconds."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from helpers.races import Race, open_transactions
from helpers.statements import claim, finish, mark_failed, status_of
from helpers.support import make_queue, received, seq_jobs
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Dependency, admin, enqueue, enqueue_many
from sqla_queue.admin import partitions
from sqla_queue.db import queries
from sqla_queue.db.models import NOTIFY_CHANNEL


def batch(rows: list[Any]) -> dict[str, list[int]]:
    return {"job_ids": [r["id"] for r in rows], "job_attempts": [r["attempts"] for r in rows]}


def cancel_running(conn: Connection, rows: list[Any]) -> None:
    """`jobs cancel` of running jobs: their handlers go on until they return."""
    assert set(admin.cancel_jobs(conn, [r["id"] for r in rows]).values()) == {"running"}
    conn.commit()


def handlers_returned(conn: Connection, rows: list[Any]) -> None:
    """The worker's finish of jobs cancelled while their handlers ran."""
    conn.execute(queries.free_cancelled_jobs(), batch(rows))
    conn.commit()


def running_head(engine: Engine, settings: dict[str, Any]) -> tuple[list[int], list[Any]]:
    """Queue `steps` made with `settings`, two jobs of sequence order-1 in it, the first
    claimed: their ids, and the claimed rows."""
    make_queue(engine, "steps", **settings)
    ids = seq_jobs(engine, "order-1", 2, "steps")
    with engine.connect() as conn:
        running = claim(conn, 10, ["steps"])
    assert [r["id"] for r in running] == ids[:1]
    return ids, running


# both claim paths: the plain claim (`sequence_free`) and a fair queue's (`claim_turns`)
QUEUES = [pytest.param({}, id="fifo"), pytest.param({"fair": True}, id="fair")]


# -- defect 2: held partitions filled the fair claim's window -----------------------------------


def test_partitions_held_behind_failed_sequences_do_not_starve_a_fair_queue(
    engine: Engine,
) -> None:
    make_queue(engine, "tenants", fair=True)
    # two tenants whose due jobs all wait behind a failed job of their sequence; names that
    # sort first, so they are the least served partitions, ahead of the third
    for tenant in ("a-held", "b-held"):
        ids = seq_jobs(engine, f"seq-{tenant}", 3, "tenants", partition=tenant)
        with engine.connect() as conn:
            mark_failed(conn, [{"id": ids[0]}])
    with Session(engine) as session, session.begin():
        enqueue_many(
            session,
            [
                {"task": "t", "args": {"n": n}, "queue": "tenants", "partition": "c-free"}
                for n in range(5)
            ],
        )
    claimed: list[int] = []
    with engine.connect() as conn:
        for _ in range(5):  # a claim of size 1, as a worker at -c 1 --max-batch 1
            got = claim(conn, 1, ["tenants"])
            claimed += [r["id"] for r in got]
            finish(conn, got)
    assert len(claimed) == 5  # every claim served the one tenant that can run


# -- defect 3: a job cancelled while its handler runs still holds what it held ----------------


@pytest.mark.parametrize("settings", QUEUES)
def test_a_job_cancelled_while_running_holds_its_sequence_until_its_handler_returns(
    engine: Engine, settings: dict[str, Any]
) -> None:
    ids, running = running_head(engine, settings)
    with engine.connect() as conn:
        cancel_running(conn, running)
        assert claim(conn, 10, ["steps"]) == []  # two of one sequence would run at once
        handlers_returned(conn, running)
        assert [r["id"] for r in claim(conn, 10, ["steps"])] == ids[1:]


@pytest.mark.parametrize("settings", [{}, {"fair": True}], ids=["limited", "fair-limited"])
def test_a_job_cancelled_while_running_keeps_its_partition_slot_until_its_handler_returns(
    engine: Engine, settings: dict[str, Any]
) -> None:
    make_queue(engine, "tenants", partition_limit=1, **settings)
    with Session(engine) as session, session.begin():
        for n in range(2):
            enqueue(session, "t", {"n": n}, queue="tenants", partition="acme")
    with engine.connect() as conn:
        running = claim(conn, 10, ["tenants"])
        assert len(running) == 1
        cancel_running(conn, running)
        assert claim(conn, 10, ["tenants"]) == []  # the partition would run 2 of its limit 1
        handlers_returned(conn, running)
        assert len(claim(conn, 10, ["tenants"])) == 1


def test_the_run_anyway_dependents_of_a_job_cancelled_while_running_wait_for_its_handler(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t", {})
        session.flush()
        child = enqueue(session, "t", {"n": 1}, depends_on=[Dependency(parent, on_failure="run")])
        session.flush()
        parent_id, child_id = parent.id, child.id
    with engine.connect() as conn:
        running = claim(conn, 10)
        assert [r["id"] for r in running] == [parent_id]
        cancel_running(conn, running)
        assert status_of(engine, child_id) == "waiting"  # the parent's handler still runs
        assert claim(conn, 10) == []
        handlers_returned(conn, running)
        assert status_of(engine, child_id) == "queued"
        assert [r["id"] for r in claim(conn, 10)] == [child_id]


@pytest.mark.parametrize("on_failure", ["cancel", "run"])
def test_a_dependent_enqueued_on_a_job_cancelled_while_running_waits_for_its_handler(
    engine: Engine, on_failure: str
) -> None:
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t", {})
        session.flush()
        parent_id = parent.id
    with engine.connect() as conn:
        running = claim(conn, 10)
        cancel_running(conn, running)
        with Session(engine) as session, session.begin():
            child = enqueue(
                session, "t", {}, depends_on=[Dependency(parent_id, on_failure=on_failure)]
            )
            session.flush()
            child_id = child.id
        assert status_of(engine, child_id) == "waiting"
        handlers_returned(conn, running)
    assert status_of(engine, child_id) == {"cancel": "cancelled", "run": "queued"}[on_failure]


def test_the_reaper_ends_a_cancelled_job_whose_worker_is_gone_and_frees_what_it_held(
    engine: Engine,
) -> None:
    ids = seq_jobs(engine, "order-1", 2, "default")
    with Session(engine) as session, session.begin():
        child = enqueue(session, "t", {}, depends_on=[Dependency(ids[0], on_failure="run")])
        session.flush()
        child_id = child.id
    with engine.connect() as conn:
        running = claim(conn, 10)
        cancel_running(conn, running)
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = :i"
            ),
            {"i": ids[0]},
        )
        conn.commit()
        conn.execute(queries.free_unheld_cancelled_jobs(), {"worker_id": "w", "job_ids": []})
        conn.commit()
        got = sorted(r["id"] for r in claim(conn, 10))
    assert got == sorted([ids[1], child_id])


# -- defect 10: a clean-up in the sequence of the job it cleans up after ------------------------


@pytest.mark.parametrize("settings", QUEUES)
def test_a_clean_up_in_the_sequence_of_the_failed_job_it_depends_on_runs(
    engine: Engine, settings: dict[str, Any]
) -> None:
    make_queue(engine, "steps", **settings)
    with Session(engine) as session, session.begin():
        step = enqueue(session, "t", {"n": 1}, queue="steps", sequence="order-1")
        after = enqueue(session, "t", {"n": 2}, queue="steps", sequence="order-1")
        session.flush()
        cleanup = enqueue(
            session,
            "t",
            {"clean": True},
            queue="steps",
            sequence="order-1",
            depends_on=[Dependency(step, on_failure="run")],
        )
        session.flush()
        step_id, after_id, cleanup_id = step.id, after.id, cleanup.id
    with engine.connect() as conn:
        assert [r["id"] for r in claim(conn, 10, ["steps"])] == [step_id]
        mark_failed(conn, [{"id": step_id}])
        assert status_of(engine, cleanup_id) == "queued"
        # the clean-up runs in the failed job's place; the job between them stays held
        running = claim(conn, 10, ["steps"])
        assert [r["id"] for r in running] == [cleanup_id]
        finish(conn, running)
        assert claim(conn, 10, ["steps"]) == []
        admin.retry_jobs(conn, [step_id])
        conn.commit()
        assert [r["id"] for r in claim(conn, 10, ["steps"])] == [step_id]
    assert status_of(engine, after_id) == "queued"


def test_a_clean_up_still_waits_for_the_jobs_before_the_one_it_cleans_up_after(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        first = enqueue(session, "t", {"n": 0}, sequence="order-1", delay=3600)
        step = enqueue(session, "t", {"n": 1}, sequence="order-1")
        session.flush()
        cleanup = enqueue(
            session, "t", {}, sequence="order-1", depends_on=[Dependency(step, on_failure="run")]
        )
        session.flush()
        first_id, step_id, cleanup_id = first.id, step.id, cleanup.id
    with engine.connect() as conn:
        mark_failed(
            conn, [{"id": step_id}]
        )  # as if it had run out of turn (a retry of the first, say)
        assert status_of(engine, cleanup_id) == "queued"
        assert claim(conn, 10) == []  # the first, queued, is still ahead of both
        conn.execute(
            text("UPDATE sqla_queue.jobs SET run_at = now() WHERE id = :i"), {"i": first_id}
        )
        conn.commit()
        assert [r["id"] for r in claim(conn, 10)] == [first_id]


# -- defect 11: the end of a sequence's holder wakes the workers --------------------------------


def notifications(database_url: str) -> psycopg.Connection[Any]:
    listener = psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True)
    listener.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
    return listener


@pytest.mark.parametrize("how", ["complete", "complete_and_claim", "fail_skip", "cancelled"])
def test_the_end_of_a_sequences_holder_notifies_the_next_jobs_queue(
    engine: Engine, database_url: str, how: str
) -> None:
    make_queue(engine, "steps")
    if how == "fail_skip":
        with engine.begin() as conn:
            partitions.set_sequence_on_failure(conn, "steps", "skip")
    ids = seq_jobs(engine, "order-1", 2, "steps")
    with engine.connect() as conn:
        running = claim(conn, 10, ["steps"])
        assert [r["id"] for r in running] == ids[:1]
        with notifications(database_url) as listener:
            if how == "complete":
                finish(conn, running)
            elif how == "complete_and_claim":
                params = {**batch(running), "limit": 10, "worker_id": "w", "queues": ["steps"]}
                rows = conn.execute(queries.complete_and_claim(["steps"]), params).all()
                conn.commit()
                assert rows == []  # its own claim still saw the holder
            elif how == "fail_skip":
                conn.execute(queries.fail_jobs(), {**batch(running), "job_errors": ["boom"]})
                conn.commit()
            else:
                cancel_running(conn, running)
                handlers_returned(conn, running)
            assert "steps" in received(listener, 0.2, first_within=60.0)
        assert [r["id"] for r in claim(conn, 10, ["steps"])] == ids[1:]


def test_the_end_of_a_job_without_a_successor_notifies_nobody(
    engine: Engine, database_url: str
) -> None:
    make_queue(engine, "steps")
    seq_jobs(engine, "order-1", 1, "steps")
    with engine.connect() as conn:
        running = claim(conn, 10, ["steps"])
        with notifications(database_url) as listener:
            finish(conn, running)
            assert [n.payload for n in listener.notifies(timeout=0.5)] == []


# -- defect 16: what the fairness promise is, on a real claim order -----------------------------


def test_a_tenants_first_job_waits_only_behind_what_was_claimed_before_it_was_due(
    engine: Engine,
) -> None:
    """docs/fairness.md: a tenant's first job waits behind at most the jobs of others claimed
    before it was due (running, or in a worker's buffer: at most one claim per worker), and
    is the first of the next claim."""
    make_queue(engine, "tenants", fair=True)
    with Session(engine) as session, session.begin():
        enqueue_many(
            session,
            [
                {"task": "t", "args": {"n": n}, "queue": "tenants", "partition": "a"}
                for n in range(100)
            ],
        )
    with engine.connect() as conn:
        buffered = claim(conn, 16, ["tenants"])  # a -c 4 worker's claim of quick jobs
        assert len(buffered) == 16
        with Session(engine) as session, session.begin():
            b_job = enqueue(session, "t", {}, queue="tenants", partition="b")
            session.flush()
            b_id = b_job.id
        after = claim(conn, 16, ["tenants"])
    assert after[0]["id"] == b_id  # the first job of the first claim after it was due


# -- the races: a cancel, and the handler's return, held open while a claim runs --------------


@pytest.mark.parametrize("settings", QUEUES)
def test_a_claim_beside_an_open_cancel_and_an_open_release_never_takes_the_next_of_the_sequence(
    engine: Engine, settings: dict[str, Any]
) -> None:
    ids, running = running_head(engine, settings)

    def claim_beside() -> list[Any]:
        with engine.connect() as conn:
            return claim(conn, 10, ["steps"])

    with Race(engine) as race:
        cancel = race.hold(lambda conn: admin.cancel_jobs(conn, ids[:1]))
        assert cancel.value == {ids[0]: "running"}
        beside = race.beside(claim_beside, "claim beside the open cancel")
        assert beside.result() == []  # it neither waits for the cancel nor takes the next
        cancel.commit()
        assert race.beside(claim_beside, "claim after the cancel").result() == []
        release = race.hold(
            lambda conn: conn.execute(queries.free_cancelled_jobs(), batch(running))
        )
        assert race.beside(claim_beside, "claim beside the open release").result() == []
        release.commit()
        after = race.beside(claim_beside, "claim after the handler returned").result()
    assert [r["id"] for r in after] == ids[1:]
    assert open_transactions(engine) == []
