"""`ctx.wait_for_signal`: a job parks (no slot, no attempt) until `sqla_queue.signal` commits
or its timeout passes; the wake happens in the sender's transaction; a signal is kept in
a mailbox until consumed, each answer recorded so a later run gets the same one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from helpers.races import Race
from helpers.signal_kit import mailbox
from helpers.support import (
    WorkerThread,
    database_clock,
    delay_chosen,
    enqueue_jobs,
    jobs_by_id,
    make_due,
    signal_now,
    statuses,
    wait_for,
)
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import JobContext, Registry, SignalTimeout, WorkerConfig, admin
from sqla_queue.db.queries import signals as signal_queries
from sqla_queue.enqueue.signals import engine_transaction, receive_signal
from sqla_queue.testing import drain, run_until_empty

BURST = WorkerConfig(concurrency=1, batch=1, poll_only=True)


def payment_registry(got: list[Any], timeout: float = 3 * 86400) -> Registry:
    registry = Registry()

    @registry.task(name="await_payment", pass_context=True)
    def await_payment(ctx: JobContext, order_id: int) -> None:
        try:
            got.append(ctx.wait_for_signal(f"payment:{order_id}", timeout=timeout))
        except SignalTimeout as exc:
            got.append(("timed out", exc.key))

    return registry


def pass_deadlines(engine: Engine) -> None:
    """Pretend the waits' timeouts have passed (the database's clock decides, not ours)."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.signal_waits SET deadline = now() - interval '1 second'")
        )
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET run_at = now() - interval '1 second' "
                "WHERE status = 'waiting' AND signal_key IS NOT NULL"
            )
        )


def test_a_signal_sent_before_the_wait_is_returned_at_once(engine: Engine) -> None:
    got: list[Any] = []
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 42})
    assert signal_now(engine, "payment:42", {"amount": 990}) == 0  # nobody waits yet
    result = drain(engine, payment_registry(got))
    assert (result.succeeded, result.waiting) == (1, 0)
    assert got == [{"amount": 990}]
    assert mailbox(engine) == []  # consumed
    assert statuses(engine, [job_id]) == {}  # done, deleted by the default retention


def test_a_wait_without_a_signal_parks_the_job_holding_no_slot_and_no_attempt(
    engine: Engine,
) -> None:
    got: list[Any] = []
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 7})
    before = database_clock(engine)
    stats = run_until_empty(engine, payment_registry(got, timeout=3600), BURST)
    after = database_clock(engine)
    assert got == []
    assert (stats.waiting, stats.succeeded, stats.retried, stats.failed) == (1, 0, 0, 0)
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.signal_key, job.attempts, job.max_attempts) == (
        "waiting",
        "payment:7",
        1,
        6,  # refunded as a snooze refunds: the budget grows, the fencing token keeps counting
    )
    assert (job.locked_by, job.lease_expires_at, job.started_at) == (None, None, None)
    assert 3600 in delay_chosen(engine, job_id, before, after)  # run_at is the deadline
    with engine.connect() as conn:  # no slot: nothing running holds it
        assert (
            conn.execute(
                text("SELECT count(*) FROM sqla_queue.jobs WHERE status = 'running'")
            ).scalar()
            == 0
        )


def test_the_signal_wakes_the_waiting_job_in_the_senders_transaction(engine: Engine) -> None:
    got: list[Any] = []
    registry = payment_registry(got)
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 42})
    assert drain(engine, registry).waiting == 1
    with Session(engine) as session, session.begin():
        session.execute(text("CREATE TABLE payments (order_id int, amount int)"))
        session.execute(text("INSERT INTO payments VALUES (42, 990)"))
        assert sqla_queue.signal(session, "payment:42", {"amount": 990}) == 1
        status = session.execute(
            text("SELECT status FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
        assert status == "queued"  # promoted by the sender's own statement, not yet committed
        assert statuses(engine, [job_id]) == {job_id: "waiting"}  # others see it at commit
    result = drain(engine, registry)
    assert (result.succeeded, got) == (1, [{"amount": 990}])
    assert mailbox(engine) == []


def test_a_rolled_back_signal_wakes_nothing_and_leaves_no_signal(engine: Engine) -> None:
    got: list[Any] = []
    registry = payment_registry(got)
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 5})
    drain(engine, registry)
    with Session(engine) as session:
        session.begin()
        assert sqla_queue.signal(session, "payment:5", "paid") == 1
        session.rollback()
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    assert mailbox(engine) == []
    assert drain(engine, registry).ran == 0
    assert got == []


def test_the_timeout_is_enforced_by_the_keeper_and_raises_signal_timeout(engine: Engine) -> None:
    got: list[Any] = []
    registry = payment_registry(got, timeout=3600)
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 9})
    drain(engine, registry)
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    pass_deadlines(engine)
    with WorkerThread(engine, registry, heartbeat=0.2, concurrency=1):
        wait_for(lambda: got, timeout=30)  # the keeper woke it, the handler timed out
    assert got == [("timed out", "payment:9")]
    assert statuses(engine, [job_id]) == {}  # the handler caught it and succeeded
    # a signal after the timeout finds nobody: it stays in the mailbox until it expires
    assert signal_now(engine, "payment:9", "late") == 0
    assert mailbox(engine) == [("payment:9", "late", "one")]


def test_a_timeout_not_caught_fails_the_attempt_as_any_error(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="strict", pass_context=True, max_attempts=1)
    def strict(ctx: JobContext) -> None:
        ctx.wait_for_signal("approval:1", timeout=timedelta(hours=1))

    (job_id,) = enqueue_jobs(engine, "strict", 1)
    drain(engine, registry)
    pass_deadlines(engine)
    result = drain(engine, registry)  # drain wakes jobs past their deadline as the keeper does
    assert result.failed == 1
    job = jobs_by_id(engine)[job_id]
    assert job.status == "failed"
    assert "SignalTimeout" in (job.last_error or "")


def test_wake_one_wakes_the_oldest_waiter_and_each_signal_is_consumed_once(
    engine: Engine,
) -> None:
    got: list[Any] = []
    registry = payment_registry(got)
    first, second = enqueue_jobs(engine, "await_payment", 2, args={"order_id": 1})
    assert drain(engine, registry).waiting == 2
    assert signal_now(engine, "payment:1", "a") == 1
    assert statuses(engine, [first, second]) == {first: "queued", second: "waiting"}
    assert signal_now(engine, "payment:1", "b") == 1
    assert drain(engine, registry).succeeded == 2
    assert sorted(got) == ["a", "b"]
    assert mailbox(engine) == []


def test_wake_all_wakes_every_waiter_and_later_waiters_read_it_too(engine: Engine) -> None:
    got: list[Any] = []
    registry = payment_registry(got)
    enqueue_jobs(engine, "await_payment", 3, args={"order_id": 2})
    assert drain(engine, registry).waiting == 3
    assert signal_now(engine, "payment:2", {"ok": True}, wake="all") == 3
    assert drain(engine, registry).succeeded == 3
    enqueue_jobs(engine, "await_payment", 1, args={"order_id": 2})  # waits after the signal
    assert drain(engine, registry).succeeded == 1
    assert got == [{"ok": True}] * 4
    assert mailbox(engine) == [("payment:2", {"ok": True}, "all")]  # kept until it expires


def test_a_later_run_gets_the_recorded_answer_without_another_signal(engine: Engine) -> None:
    registry = Registry()
    seen: list[Any] = []

    @registry.task(name="flaky", pass_context=True, max_attempts=3)
    def flaky(ctx: JobContext) -> None:
        seen.append(ctx.wait_for_signal("go", timeout=60))
        if len(seen) == 1:
            raise RuntimeError("crashed after the wait")

    enqueue_jobs(engine, "flaky", 1)
    signal_now(engine, "go", 1)
    signal_now(engine, "go", 2)
    assert drain(engine, registry).retried == 1
    make_due(engine)
    assert drain(engine, registry).succeeded == 1
    assert seen == [1, 1]  # the same answer; the second signal is still there for another
    assert mailbox(engine) == [("go", 2, "one")]


def test_two_waits_for_one_key_in_a_run_take_two_signals(engine: Engine) -> None:
    registry = Registry()
    seen: list[Any] = []

    @registry.task(name="twice", pass_context=True)
    def twice(ctx: JobContext) -> None:
        seen.append((ctx.wait_for_signal("step", timeout=60), ctx.wait_for_signal("step", 60)))

    enqueue_jobs(engine, "twice", 1)
    signal_now(engine, "step", "one")
    assert drain(engine, registry).waiting == 1  # got the first, parked on the second
    assert signal_now(engine, "step", "two") == 1
    assert drain(engine, registry).succeeded == 1
    assert seen == [("one", "two")]


def test_cancelling_a_waiting_job_ends_it_and_a_signal_then_wakes_nothing(
    engine: Engine,
) -> None:
    got: list[Any] = []
    registry = payment_registry(got)
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 3})
    drain(engine, registry)
    with engine.begin() as conn:
        assert admin.cancel_jobs(conn, [job_id]) == {job_id: "waiting"}
    assert statuses(engine, [job_id]) == {job_id: "cancelled"}
    assert signal_now(engine, "payment:3", "x") == 0
    assert drain(engine, registry).ran == 0
    assert got == []


def test_an_async_handler_waits_with_the_async_form(engine: Engine) -> None:
    registry = Registry()
    seen: list[Any] = []

    @registry.task(name="async_wait", pass_context=True)
    async def async_wait(ctx: JobContext) -> None:
        await asyncio.sleep(0)
        seen.append(await ctx.wait_for_signal_async("hook:1", timeout=timedelta(minutes=5)))

    (job_id,) = enqueue_jobs(engine, "async_wait", 1)
    stats = run_until_empty(engine, registry, BURST)
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    assert stats.succeeded == 0
    assert signal_now(engine, "hook:1", [1, 2]) == 1
    assert run_until_empty(engine, registry, BURST).succeeded == 1
    assert seen == [[1, 2]]


def test_a_handler_that_swallows_the_park_still_ends_parked(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="greedy", pass_context=True)
    def greedy(ctx: JobContext) -> str:
        try:
            ctx.wait_for_signal("k", timeout=60)
        except BaseException:
            return "swallowed"
        return "got it"

    (job_id,) = enqueue_jobs(engine, "greedy", 1)
    assert drain(engine, registry).waiting == 1
    assert statuses(engine, [job_id]) == {job_id: "waiting"}


@pytest.mark.parametrize(
    ("key", "timeout", "problem"),
    [
        ("", 60, "a signal key is a string of 1 to 200 characters"),
        ("k" * 201, 60, "a signal key is a string of 1 to 200 characters"),
        ("k", 0, "timeout must be a positive timedelta"),
        ("k", float("nan"), "timeout must be a positive timedelta"),
        ("k", timedelta(days=-1), "timeout must be a positive timedelta"),
    ],
)
def test_bad_wait_arguments_fail_the_attempt_with_one_clear_line(
    engine: Engine, key: str, timeout: Any, problem: str
) -> None:
    registry = Registry()

    @registry.task(name="bad", pass_context=True, max_attempts=1)
    def bad(ctx: JobContext) -> None:
        ctx.wait_for_signal(key, timeout=timeout)

    (job_id,) = enqueue_jobs(engine, "bad", 1)
    assert drain(engine, registry).failed == 1
    assert problem in (jobs_by_id(engine)[job_id].last_error or "")


def test_a_context_without_a_database_refuses_the_wait() -> None:
    ctx = JobContext(1, "t", "default", 1)
    with pytest.raises(sqla_queue.ConfigurationError, match="needs a job run by the table worker"):
        ctx.wait_for_signal("k", timeout=60)


# -- races on purpose ------------------------------------------------------------------------


def test_a_waiter_parking_while_the_senders_transaction_is_open_gets_the_signal(
    engine: Engine,
) -> None:
    """The sender's transaction holds the key's lock (shared): the waiter's park waits for
    it; the sender commits; the waiter sees the signal and never parks. Should the machine
    be so slow that the park's lock timeout passes first, the job is put back (not parked)
    and gets the signal on its next run: either way it is never left waiting."""
    got: list[Any] = []
    registry = payment_registry(got)
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 11})
    with Race(engine) as race:
        held = race.hold(lambda conn: sqla_queue.signal(conn, "payment:11", "paid"))
        assert held.value == 0  # the job runs, it does not wait yet
        waiter = race.beside(lambda: drain(engine, registry), "the waiter's run")
        assert race.wait_blocked_by(held, waiter)
        held.commit()
        first = waiter.result()
    assert first.waiting == 0  # it never parked
    if first.snoozed:
        make_due(engine)
        drain(engine, registry)
    assert got == ["paid"]
    assert statuses(engine, [job_id]) == {}
    assert mailbox(engine) == []


def test_a_sender_whose_transaction_outlasts_the_parks_lock_timeout_leaves_the_job_queued(
    engine: Engine,
) -> None:
    got: list[Any] = []
    registry = payment_registry(got)
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 12})
    with Race(engine) as race:
        held = race.hold(lambda conn: sqla_queue.signal(conn, "payment:12", "paid"))
        result = drain(engine, registry)  # the lock timeout passes while the sender is open
        assert (result.waiting, result.snoozed) == (0, 1)
        job = jobs_by_id(engine)[job_id]
        assert (job.status, job.attempts, job.max_attempts) == ("queued", 1, 6)
        held.commit()
    make_due(engine)
    assert drain(engine, registry).succeeded == 1
    assert got == ["paid"]


def test_a_sender_during_an_open_park_waits_for_it_and_wakes_the_parked_job(
    engine: Engine,
) -> None:
    """The reverse: the waiter holds the key's lock (exclusive) in its park's transaction;
    the sender waits for it, then sees the parked job and wakes it."""
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 13})
    with engine.begin() as conn:  # a worker's claim: running at attempt 1
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'running', attempts = 1 WHERE id = :id"),
            {"id": job_id},
        )
    ids = {"waiter_id": job_id, "wait_key": "payment:13", "wait_seq": 1, "waiter_attempt": 1}

    def park(conn: Connection) -> Any:
        conn.execute(signal_queries.begin_wait(), {**ids, "timeout": 3600})
        conn.execute(signal_queries.lock_key_exclusive(), ids)
        return conn.execute(signal_queries.park_job(), {**ids, "task_max_attempts": None}).scalar()

    with Race(engine) as race:
        held = race.hold(park)
        assert held.value == job_id
        sender = race.beside(lambda: signal_now(engine, "payment:13", "paid"), "the sender")
        assert race.wait_blocked_by(held, sender)
        held.commit()
        assert sender.result() == 1  # it saw the park that committed while it waited
    assert statuses(engine, [job_id]) == {job_id: "queued"}
    got: list[Any] = []
    assert drain(engine, payment_registry(got)).succeeded == 1
    assert got == ["paid"]


def test_a_stale_attempt_cannot_consume_a_signal(engine: Engine) -> None:
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 14})
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'running', attempts = 2 WHERE id = :id"),
            {"id": job_id},
        )
    signal_now(engine, "payment:14", "paid")
    stale = {"waiter_id": job_id, "wait_key": "payment:14", "wait_seq": 1, "waiter_attempt": 1}
    with engine.begin() as conn:
        conn.execute(signal_queries.begin_wait(), {**stale, "timeout": 60})
        taken = conn.execute(signal_queries.take_signal(), stale).one()
    assert (taken.taken, taken.recorded) == (0, 0)
    assert mailbox(engine) == [("payment:14", "paid", "one")]


# -- where signals meet other features -------------------------------------------------------


def test_a_job_enqueued_in_the_signals_own_transaction_gets_it_when_it_waits(
    engine: Engine,
) -> None:
    got: list[Any] = []
    with Session(engine) as session, session.begin():
        job_id = sqla_queue.enqueue(session, "await_payment", {"order_id": 21}, flush=True).id
        assert sqla_queue.signal(session, "payment:21", "paid") == 0  # it has not waited yet
    assert drain(engine, payment_registry(got)).succeeded == 1
    assert got == ["paid"]
    assert statuses(engine, [job_id]) == {}


def test_a_task_timeout_does_not_count_the_time_parked(engine: Engine) -> None:
    registry = Registry()
    seen: list[Any] = []

    @registry.task(name="timed", pass_context=True, timeout=30)
    def timed(ctx: JobContext) -> None:
        seen.append(ctx.wait_for_signal("timed:1", timeout=timedelta(days=1)))

    (job_id,) = enqueue_jobs(engine, "timed", 1)
    stats = run_until_empty(engine, registry, BURST)
    assert (stats.timed_out, stats.failed) == (0, 0)
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    signal_now(engine, "timed:1", "go")
    assert run_until_empty(engine, registry, BURST).succeeded == 1
    assert seen == ["go"]


def test_a_kept_result_is_the_run_after_the_signal_and_wait_for_reads_it(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="kept", pass_context=True, keep_result=True)
    def kept(ctx: JobContext) -> Any:
        return {"payment": ctx.wait_for_signal("kept:1", timeout=3600)}

    (job_id,) = enqueue_jobs(engine, "kept", 1)
    drain(engine, registry)
    with pytest.raises(sqla_queue.ResultTimeoutError):
        sqla_queue.wait_for(engine, job_id, timeout=0)  # parked: no result yet
    signal_now(engine, "kept:1", 990)
    assert drain(engine, registry).succeeded == 1
    assert sqla_queue.wait_for(engine, job_id, timeout=5) == {"payment": 990}


def test_a_handler_writes_what_the_signal_says_in_its_own_session(engine: Engine) -> None:
    registry = Registry()
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE receipts (order_id int, amount int)"))

    @registry.task(name="receipt", pass_context=True)
    def receipt(ctx: JobContext, order_id: int) -> None:
        paid = ctx.wait_for_signal(f"payment:{order_id}", timeout=3600)
        with ctx.session() as session:
            session.execute(
                text("INSERT INTO receipts VALUES (:o, :a)"), {"o": order_id, "a": paid["amount"]}
            )
            session.commit()

    (job_id,) = enqueue_jobs(engine, "receipt", 1, args={"order_id": 8})
    run_until_empty(engine, registry, BURST)
    signal_now(engine, "payment:8", {"amount": 12})
    assert run_until_empty(engine, registry, BURST).succeeded == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT * FROM receipts")).all() == [(8, 12)]
    assert statuses(engine, [job_id]) == {}


def test_dependents_wait_for_a_waiting_job_to_end_not_for_its_run(engine: Engine) -> None:
    registry = Registry()
    order: list[str] = []

    @registry.task(name="approve", pass_context=True, keep_result=True)
    def approve(ctx: JobContext) -> Any:
        decision = ctx.wait_for_signal("approval:99", timeout=3600)
        order.append("approve")
        return decision

    @registry.task(name="ship", pass_context=True)
    def ship(ctx: JobContext) -> None:
        order.append(f"ship {ctx.parent_results()}")

    with Session(engine) as session, session.begin():
        parent = sqla_queue.enqueue(session, "approve", flush=True)
        parent_id = parent.id
        child_id = sqla_queue.enqueue(session, "ship", depends_on=[parent], flush=True).id
    assert drain(engine, registry).waiting == 1
    assert statuses(engine, [parent_id, child_id]) == {parent_id: "waiting", child_id: "waiting"}
    assert jobs_by_id(engine)[child_id].deps_left == 1  # the parent's park ended no run of it
    assert drain(engine, registry).ran == 0  # nothing to run: the child still waits
    signal_now(engine, "approval:99", "yes")
    assert statuses(engine, [child_id]) == {child_id: "waiting"}
    assert drain(engine, registry).succeeded == 2
    assert order == ["approve", "ship ['yes']"]


def test_drain_in_a_tests_transaction_runs_a_wait_and_its_signal_and_leaves_nothing(
    engine: Engine,
) -> None:
    got: list[Any] = []
    registry = payment_registry(got)
    with Session(engine) as session:
        session.begin()
        sqla_queue.enqueue(session, "await_payment", {"order_id": 31})
        assert drain(session, registry).waiting == 1
        assert sqla_queue.signal(session, "payment:31", "paid") == 1
        assert drain(session, registry).succeeded == 1
        session.rollback()
    assert got == ["paid"]
    assert statuses(engine) == {}
    assert mailbox(engine) == []
    signal_now(engine, "payment:31", "unblocked")  # no key lock was left behind


def test_a_repeatable_read_sender_whose_snapshot_predates_the_park_is_caught_by_the_keeper(
    engine: Engine,
) -> None:
    """The one case the key's lock cannot cover: a sender's snapshot taken before the job
    parked does not see it, so the sender wakes nothing; the keeper sees a signal its
    parked job has not read and wakes it within a heartbeat."""
    got: list[Any] = []
    registry = payment_registry(got)
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 41})

    def snapshot_first(conn: Connection) -> None:
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        conn.execute(text("SELECT count(*) FROM sqla_queue.jobs"))  # the snapshot is taken

    with Race(engine) as race:
        held = race.hold(snapshot_first)
        assert drain(engine, registry).waiting == 1  # parks after the sender's snapshot
        assert sqla_queue.signal(held.conn, "payment:41", "paid") == 0  # it cannot see it
        held.commit()
    assert statuses(engine, [job_id]) == {job_id: "waiting"}
    assert mailbox(engine) == [("payment:41", "paid", "one")]
    with WorkerThread(engine, registry, heartbeat=0.2, concurrency=1):
        wait_for(lambda: got, timeout=30)
    assert got == ["paid"]
    assert mailbox(engine) == []


def test_a_wait_answered_by_another_run_meanwhile_gets_that_answer_and_takes_nothing(
    engine: Engine,
) -> None:
    (job_id,) = enqueue_jobs(engine, "await_payment", 1, args={"order_id": 51})
    with engine.begin() as conn:  # a worker's claim: running at attempt 1
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'running', attempts = 1 WHERE id = :id"),
            {"id": job_id},
        )
    signal_now(engine, "payment:51", "mine")
    own = engine_transaction(engine)
    calls = 0

    @contextmanager
    def transaction() -> Iterator[Any]:
        nonlocal calls
        calls += 1
        if calls == 2:  # the wait began; before the take, another run of the job answers it
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "UPDATE sqla_queue.signal_waits SET state = 'received', "
                        "payload = '\"theirs\"' WHERE job_id = :id"
                    ),
                    {"id": job_id},
                )
        with own() as run:
            yield run

    ctx = JobContext(job_id, "await_payment", "default", 1)
    assert receive_signal(transaction, ctx, "payment:51", 1, 60, None) == "theirs"
    assert mailbox(engine) == [("payment:51", "mine", "one")]  # every take was rolled back
    assert statuses(engine, [job_id]) == {job_id: "running"}  # not parked
