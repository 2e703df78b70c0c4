"""Unique jobs (issue 9): one job per key among the states that block, held by the database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.multixact_support import admin_engine, count_multixacts
from helpers.statements import statuses_of
from helpers.support import count_jobs, jobs_by_id
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    Job,
    Registry,
    Unique,
    admin,
    enqueue,
    enqueue_async,
    enqueue_many,
    set_default_registry,
)
from sqla_queue.db.database import normalize_url
from sqla_queue.enqueue import COPY_MIN_ROWS
from sqla_queue.job.unique import EVERY_STATE


@pytest.fixture(autouse=True)
def _no_default_registry() -> Iterator[None]:
    yield
    set_default_registry(None)


def test_a_duplicate_returns_the_existing_job_id_and_the_transaction_goes_on(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.orders (id int PRIMARY KEY)"))
    with Session(engine) as session, session.begin():
        first = enqueue(session, "receipt", {"order_id": 7}, unique=True)
        first_id = first.id
        again = enqueue(session, "receipt", {"order_id": 7}, unique=True)
        other = enqueue(session, "receipt", {"order_id": 8}, unique=True)
        # the business write after a duplicate still commits: nothing was aborted
        session.execute(text("INSERT INTO public.orders VALUES (7)"))
        assert (first.duplicate, again.duplicate, other.duplicate) == (False, True, False)
        assert again.id == first_id
        assert first.status == "queued"  # a written job loads its server-set columns
    with Session(engine) as session, session.begin():
        later = enqueue(session, "receipt", {"order_id": 7}, unique=True)
        assert (later.duplicate, later.id) == (True, first_id)
        assert later not in session  # a duplicate is not written and not in the session
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM public.orders")) == 1
    assert count_jobs(engine) == 2


def test_the_key_is_made_of_the_chosen_args_the_queue_and_an_own_key(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "other")
    by_account = Unique(args=["account"])
    with Session(engine) as session, session.begin():
        a = enqueue(session, "sync", {"account": 1, "page": 1}, unique=by_account)
        b = enqueue(session, "sync", {"account": 1, "page": 2}, unique=by_account)
        c = enqueue(session, "sync", {"account": 1, "page": 2}, unique=True)  # all args
        d = enqueue(session, "sync", {"account": 1}, queue="other", unique=by_account)
        e = enqueue(session, "sync", {"account": 1}, queue="other", unique=Unique(by_queue=False))
        f = enqueue(session, "sync", {"account": 1}, unique=Unique(key="tenant-9"))
        g = enqueue(session, "sync", {"account": 1}, unique=Unique(key="tenant-9"))
        h = enqueue(session, "report", {"account": 1, "page": 1}, unique=by_account)
    flags = [j.duplicate for j in (a, b, c, d, e, f, g, h)]
    assert flags == [False, True, False, False, False, False, True, False]


def test_a_period_admits_one_job_per_time_slot() -> None:
    hourly = Unique(period=3600)
    start = 7200.0 * 1000
    assert hourly.key_for("t", "q", {}, now=start) == hourly.key_for("t", "q", {}, now=start + 3599)
    assert hourly.key_for("t", "q", {}, now=start) != hourly.key_for("t", "q", {}, now=start + 3600)


def test_a_finished_job_stops_blocking_unless_its_states_say_once_ever(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    once_ever = Unique(states=EVERY_STATE)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        default = enqueue(session, "a", unique=True)
        forever = enqueue(session, "b", unique=once_ever)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET status = 'done', finished_at = now()"))
    with Session(engine) as session, session.begin():
        assert enqueue(session, "a", unique=True).duplicate is False
        again = enqueue(session, "b", unique=once_ever)
        assert (again.duplicate, again.id) == (True, forever.id)
    assert default.id != forever.id


def test_enqueue_many_returns_one_result_per_row_in_order_by_insert_and_beside_copy(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        held = enqueue(session, "r", {"n": 0}, unique=True).id
    rows: list[dict[str, Any]] = [
        {"task": "r", "args": {"n": 0}, "unique": True},  # blocked by the committed job
        {"task": "r", "args": {"n": 1}, "unique": True},
        {"task": "r", "args": {"n": 1}, "unique": True},  # blocked by the row before it
        {"task": "plain"},
        *({"task": "plain", "args": {"i": i}} for i in range(COPY_MIN_ROWS)),  # by COPY
    ]
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, rows)
    assert ids.duplicates[:4] == [True, False, True, False]
    assert not any(ids.duplicates[4:])
    assert ids[0] == held
    assert ids[2] == ids[1]
    assert len(set(ids)) == len(rows) - 1  # two duplicates; one points at the held job
    assert sorted(jobs_by_id(engine)) == sorted(set(ids))


def test_a_job_added_to_the_session_is_unique_too(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = Job(task="r", args={"n": 1}, unique=True)
        session.add(first)
        session.flush()
        second = Job(task="r", args={"n": 1}, unique=True)
        session.add(second)
        session.flush()
        assert second not in session
    assert (first.duplicate, second.duplicate, second.id) == (False, True, first.id)
    assert count_jobs(engine) == 1


def test_the_task_decorator_sets_a_default_that_one_call_may_turn_off(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="receipt", unique=Unique(args=["order_id"]))
    def receipt(order_id: int, copy: int = 0) -> None: ...

    set_default_registry(registry)
    with Session(engine) as session, session.begin():
        a = receipt.enqueue(session, {"order_id": 1})
        b = enqueue(session, "receipt", {"order_id": 1, "copy": 2})
        c = enqueue(session, "receipt", {"order_id": 1}, unique=False)
        session.add(Job(task="receipt", args={"order_id": 1}))
        session.flush()
        assert [a.duplicate, b.duplicate, c.duplicate] == [False, True, False]
    assert count_jobs(engine) == 2


def test_an_async_session_enqueues_unique_jobs_with_enqueue_async(
    database_url: str, engine: Engine
) -> None:
    async def scenario() -> tuple[bool, bool]:
        async_engine = create_async_engine(normalize_url(database_url))
        try:
            async with async_sessionmaker(async_engine)() as session:
                with pytest.raises(TypeError, match="await enqueue_async"):
                    enqueue(session, "r", unique=True)
                first = await enqueue_async(session, "r", {"n": 1}, unique=True)
                second = await enqueue_async(session, "r", {"n": 1}, unique=True)
                await session.commit()
                return first.duplicate, second.duplicate
        finally:
            await async_engine.dispose()

    assert asyncio.run(scenario()) == (False, True)
    assert count_jobs(engine) == 1


def test_a_duplicate_of_an_open_transactions_job_waits_for_it_then_knows(engine: Engine) -> None:
    outcome: dict[str, Any] = {}
    with Session(engine) as first, first.begin():
        job_id = enqueue(first, "r", unique=True).id

        def second() -> None:
            with Session(engine) as session, session.begin():
                job = enqueue(session, "r", unique=True)
                outcome.update(duplicate=job.duplicate, id=job.id)

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        assert outcome == {}  # waiting on the first transaction, not guessing
    thread.join(60)
    assert outcome == {"duplicate": True, "id": job_id}


def test_a_rolled_back_holder_lets_the_waiting_duplicate_be_written(engine: Engine) -> None:
    outcome: dict[str, Any] = {}
    first = Session(engine)
    first.begin()
    enqueue(first, "r", unique=True)

    def second() -> None:
        with Session(engine) as session, session.begin():
            outcome["duplicate"] = enqueue(session, "r", unique=True).duplicate

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.3)
    first.rollback()
    first.close()
    thread.join(60)
    assert outcome == {"duplicate": False}
    assert count_jobs(engine) == 1


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: Unique(states=["queued", "finished"]), "statuses among"),
        (lambda: Unique(states="queued"), "statuses among"),
        (lambda: Unique(states=["queued"]), "must include 'queued' and 'running'"),
        (lambda: Unique(args="order_id"), "a list of arg names"),
        (lambda: Unique(period=0.5), "at least 1 second"),
        (lambda: Registry().task(name="x", unique="yes")(lambda: None), "unique= takes True"),
    ],
)
def test_bad_unique_options_are_refused_by_name(make: Any, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        make()


CONTENDER = textwrap.dedent(
    """
    import sys
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session
    from sqla_queue import enqueue

    engine = create_engine(sys.argv[1], pool_size=1)
    written = 0
    for _ in range(int(sys.argv[2])):
        with Session(engine) as session, session.begin():
            written += not enqueue(session, "receipt", {"order_id": 42}, unique=True).duplicate
    print(written)
    """
)


@pytest.mark.slow
def test_eight_processes_enqueueing_one_unique_job_1000_times_leave_one_and_mint_no_multixacts(
    private_url: str,
) -> None:
    admin = admin_engine(private_url)
    url = normalize_url(private_url)
    written: list[int] = []

    def contend() -> None:
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", CONTENDER, url, "1000"], stdout=subprocess.PIPE, text=True
            )
            for _ in range(8)
        ]
        for process in processes:
            out, _ = process.communicate(timeout=600)
            assert process.returncode == 0
            written.append(int(out))

    try:
        minted = count_multixacts(admin, contend)
        engine = create_engine(url)
        try:
            assert count_jobs(engine) == 1
        finally:
            engine.dispose()
    finally:
        admin.dispose()
    assert sum(written) == 1
    assert minted == 0


def test_retrying_a_failed_unique_job_whose_key_is_taken_leaves_it_failed(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        failed = enqueue(session, "r", unique=True)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET status = 'failed', attempts = 5"))
    with Session(engine, expire_on_commit=False) as session, session.begin():
        live = enqueue(session, "r", unique=True)  # failed does not block by default
    assert live.duplicate is False
    with engine.begin() as conn:
        assert admin.retry_jobs(conn, [failed.id]) == {}  # no index violation, no abort
        conn.execute(text("DELETE FROM sqla_queue.jobs WHERE id = :id"), {"id": live.id})
        assert admin.retry_jobs(conn, [failed.id]) == {failed.id: "failed"}


def test_a_large_batch_of_unique_rows_is_staged_by_copy_with_one_result_per_row(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        held = enqueue(session, "r", {"n": 0}, unique=True).id
    rows: list[dict[str, Any]] = [
        {"task": "r", "args": {"n": n % (COPY_MIN_ROWS // 2)}, "unique": True}
        for n in range(COPY_MIN_ROWS)
    ]  # every key twice, key 0 held by the committed job
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, rows)
        staged = session.execute(text("SELECT to_regclass('pg_temp.sqla_queue_staged_jobs')"))
        assert staged.scalar() is not None  # went through the staging table
        leftover = session.execute(text("SELECT count(*) FROM pg_temp.sqla_queue_staged_jobs"))
        assert leftover.scalar() == 0
    half = COPY_MIN_ROWS // 2
    assert ids.duplicates == [True] + [False] * (half - 1) + [True] * half
    assert ids[0] == held
    assert ids[half:] == ids[:half]
    assert count_jobs(engine) == half


def test_a_role_that_may_not_draw_ids_writes_unique_rows_one_statement_each(
    engine: Engine,
) -> None:
    role = f"sqlaq_enqueuer_{time.time_ns() % 10**9}"
    with engine.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{role}"'))
        conn.execute(text(f'GRANT USAGE ON SCHEMA sqla_queue TO "{role}"'))
        conn.execute(text(f'GRANT SELECT, INSERT ON sqla_queue.jobs TO "{role}"'))
    try:
        with Session(engine) as session, session.begin():
            session.execute(text(f'SET LOCAL ROLE "{role}"'))
            ids = enqueue_many(
                session, [{"task": "r", "args": {"n": n % 2}, "unique": True} for n in range(4)]
            )
        assert ids.duplicates == [False, False, True, True]
        assert ids[2:] == ids[:2]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))


# -- retrying failed unique jobs (issue 20, 1.1) ---------------------------------------------


def failed_unique(engine: Engine, key: str, count: int) -> list[int]:
    """`count` failed jobs sharing one unique key: with the default states (queued,
    running) a failed job frees its key, so the next one with it can be enqueued and fail."""
    ids: list[int] = []
    for _ in range(count):
        with Session(engine, expire_on_commit=False) as session, session.begin():
            job = enqueue(session, "r", {"key": key}, unique=True)
            assert job.duplicate is False
            ids.append(job.id)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE sqla_queue.jobs SET status = 'failed', attempts = 1 WHERE id = :i"),
                {"i": job.id},
            )
    return ids


def retry_aside(
    engine: Engine, ids: list[int]
) -> tuple[threading.Thread, list[admin.RetriedJobs | BaseException]]:
    """Retry `ids` in a thread of its own; after half a second, the thread and what it
    returned or raised so far."""
    result: list[admin.RetriedJobs | BaseException] = []

    def retry() -> None:
        try:
            with engine.begin() as conn:
                result.append(admin.retry_jobs(conn, ids))
        except BaseException as exc:  # the test reports it
            result.append(exc)

    thread = threading.Thread(target=retry)
    thread.start()
    thread.join(0.5)
    return thread, result


def test_retry_of_failed_jobs_sharing_a_unique_key_retries_the_lowest_and_reports_the_rest(
    engine: Engine,
) -> None:
    shared = failed_unique(engine, "a", 3)
    (alone,) = failed_unique(engine, "b", 1)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = enqueue(session, "r", {"key": "c"})
        session.flush()
        plain = job.id
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'failed' WHERE id = :i"), {"i": plain}
        )
    with engine.begin() as conn:
        retried = admin.retry_jobs(conn, all_failed=True)
    assert retried == {shared[0]: "failed", alone: "failed", plain: "failed"}
    assert {i: s.held_by for i, s in retried.skipped.items()} == {
        shared[1]: shared[0],
        shared[2]: shared[0],
    }
    assert retried.skipped[shared[1]].reason == f"its unique key is held by job {shared[0]}"
    assert statuses_of(engine, *shared, alone, plain) == [
        "queued",
        "failed",
        "failed",
        "queued",
        "queued",
    ]


def test_retry_by_ids_of_jobs_sharing_a_key_retries_one_and_names_its_holder(
    engine: Engine,
) -> None:
    first, second = failed_unique(engine, "a", 2)
    with engine.begin() as conn:
        retried = admin.retry_jobs(conn, [second, first])
    assert retried == {first: "failed"}
    assert retried.skipped[second].held_by == first
    assert retried.skipped[second].status == "failed"
    # Once the holder has failed again, the other one goes back.
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'failed' WHERE id = :i"), {"i": first}
        )
        again = admin.retry_jobs(conn, [second])
    assert (again, again.skipped) == ({second: "failed"}, {})


def test_retry_reports_a_job_whose_unique_key_is_held_by_a_queued_job(engine: Engine) -> None:
    (failed,) = failed_unique(engine, "a", 1)
    with Session(engine) as session, session.begin():
        live = enqueue(session, "r", {"key": "a"}, unique=True).id
    with engine.begin() as conn:
        retried = admin.retry_jobs(conn, all_failed=True)
    assert retried == {}
    assert retried.skipped[failed].held_by == live
    assert statuses_of(engine, failed, live) == ["failed", "queued"]


def test_a_job_that_holds_its_own_key_when_failed_wins_over_the_one_it_blocks(
    engine: Engine,
) -> None:
    # `older` (default states) failed and freed the key; `newer` holds it even failed.
    (older,) = failed_unique(engine, "a", 1)
    once = Unique(states=EVERY_STATE)
    with Session(engine) as session, session.begin():
        newer = enqueue(session, "r", {"key": "a"}, unique=once).id
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'failed' WHERE id = :i"), {"i": newer}
        )
        retried = admin.retry_jobs(conn, all_failed=True)
    assert retried == {newer: "failed"}
    assert retried.skipped[older].held_by == newer


def test_retry_racing_another_retry_of_the_same_key_reports_instead_of_failing(
    engine: Engine,
) -> None:
    first, second = failed_unique(engine, "a", 2)
    with engine.connect() as one:
        one.begin()
        assert admin.retry_jobs(one, [first]) == {first: "failed"}
        thread, result = retry_aside(engine, [second])
        assert thread.is_alive()  # waits on the unique index entry the first one wrote
        one.commit()
    thread.join(60)
    (outcome,) = result
    assert isinstance(outcome, admin.RetriedJobs), outcome
    assert (outcome, outcome.skipped[second].held_by) == ({}, first)
    assert statuses_of(engine, first, second) == ["queued", "failed"]


def test_retry_racing_an_enqueue_of_the_same_key_reports_the_new_holder(engine: Engine) -> None:
    (failed,) = failed_unique(engine, "a", 1)
    with Session(engine) as session:
        session.begin()
        live = enqueue(session, "r", {"key": "a"}, unique=True).id
        thread, result = retry_aside(engine, [failed])
        assert thread.is_alive()  # waits on the uncommitted job's index entry
        session.commit()
    thread.join(60)
    (outcome,) = result
    assert isinstance(outcome, admin.RetriedJobs), outcome
    assert outcome.skipped[failed].held_by == live
    assert statuses_of(engine, failed, live) == ["failed", "queued"]


def test_retry_in_a_session_keeps_the_callers_transaction_usable(engine: Engine) -> None:
    first, second = failed_unique(engine, "a", 2)
    with Session(engine) as session, session.begin():
        retried = admin.retry_jobs(session, [first, second])
        assert set(retried) | set(retried.skipped) == {first, second}
        enqueue(session, "r", {"key": "other"})
    assert statuses_of(engine, first, second) == ["queued", "failed"]


def test_retry_on_an_autocommit_connection_needs_no_transaction(engine: Engine) -> None:
    first, second = failed_unique(engine, "a", 2)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        retried = admin.retry_jobs(conn, [first, second])
    assert (retried, retried.skipped[second].held_by) == ({first: "failed"}, first)
    assert statuses_of(engine, first, second) == ["queued", "failed"]


def test_retry_whose_snapshot_cannot_see_the_holder_says_so_in_one_clear_error(
    engine: Engine,
) -> None:
    (failed,) = failed_unique(engine, "a", 1)
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        conn.begin()
        conn.execute(text("SELECT 1"))  # the transaction's snapshot, from before the holder
        with Session(engine) as session, session.begin():
            enqueue(session, "r", {"key": "a"}, unique=True)
        with pytest.raises(ConfigurationError, match="took the unique keys of jobs being retried"):
            admin.retry_jobs(conn, [failed])
        assert conn.execute(text("SELECT 1")).scalar() == 1  # the transaction goes on
    assert statuses_of(engine, failed) == ["failed"]
