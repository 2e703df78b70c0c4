"""Debounce and throttle beside a worker's claim of the holder (issue 33, defect 1).

A replacing enqueue whose holder a worker claims at the same moment must return, and must
leave no lock on the holder's row for the worker's finish (or a cancel) to wait on while the
caller's transaction is still open: the holder is never locked until the caller's commit.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from helpers.races import DEADLINE, Beside, Race, open_transactions
from sqlalchemy import Connection, Engine, event, select, text
from sqlalchemy.orm import Session

from sqla_queue import Job, Unique, admin, enqueue
from sqla_queue.db import queries

DEBOUNCE = Unique(args=["account"], on_conflict="replace")
THROTTLE = Unique(args=["account"], on_conflict="replace_args")


def _claim_one(conn: Connection) -> list[Any]:
    return list(conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w"}).mappings())


def _finish(engine: Engine, row: Any) -> int:
    with engine.begin() as conn:
        conn.execute(text("set local lock_timeout = '60s'"))
        params = {"job_ids": [row["id"]], "job_attempts": [row["attempts"]]}
        return int(conn.execute(queries.complete_jobs(), params).scalar_one())


def _cancel(engine: Engine, job_id: int) -> dict[int, str]:
    with engine.begin() as conn:
        conn.execute(text("set local lock_timeout = '60s'"))
        return admin.cancel_jobs(conn, [job_id])


def _waits_on(race: Race, session: Session, call: Beside[Any]) -> bool:
    """Whether `call` waits on a lock `session`'s open transaction holds (before it returns)."""
    pid = session.connection().exec_driver_sql("select pg_backend_pid()").scalar_one()
    end = time.monotonic() + DEADLINE
    while not call.done() and time.monotonic() < end:
        if race.blocked_by(pid):
            return True
        time.sleep(0.02)
    return False


def sync_jobs(engine: Engine) -> list[tuple[int, str, Any, bool]]:
    with Session(engine) as session:
        jobs = session.scalars(select(Job).where(Job.task == "sync").order_by(Job.id))
        return [(j.id, j.status, j.args["page"], j.unique_key is not None) for j in jobs]


def _claim_before_the_replace(race: Race, engine: Engine) -> tuple[threading.Event, list[Any]]:
    """Have a worker claim the holder (and not commit) just before the enqueue's UPDATE of
    it is sent: the UPDATE then meets the claim's row lock (the moment the issue found)."""
    claimed, held = threading.Event(), []

    def hook(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if not held and statement.startswith("UPDATE sqla_queue.jobs SET args="):
            held.append(race.hold(_claim_one))
            claimed.set()

    event.listen(engine, "before_cursor_execute", hook)
    return claimed, held


@pytest.mark.parametrize("unique", [DEBOUNCE, THROTTLE], ids=["replace", "replace_args"])
@pytest.mark.parametrize("then", ["finish", "cancel"])
def test_a_replacing_enqueue_beside_a_claim_of_its_holder_returns_and_locks_nothing(
    engine: Engine, unique: Unique, then: str
) -> None:
    with Session(engine) as session, session.begin():
        holder = enqueue(session, "sync", {"account": 3, "page": 1}, unique=unique).id
    caller = Session(engine)
    try:
        with Race(engine) as race:
            claimed, held = _claim_before_the_replace(race, engine)

            def enqueue_replacing() -> Job:
                return enqueue(caller, "sync", {"account": 3, "page": 2}, unique=unique)

            replacing = race.beside(enqueue_replacing, "the replacing enqueue")
            assert claimed.wait(DEADLINE)
            (claim,) = held
            assert [r["id"] for r in claim.value] == [holder]
            assert race.wait_blocked_by(claim, replacing) is True  # its UPDATE met the claim
            claim.commit()
            new = replacing.result()  # a wedge fails here after the deadline
            # the holder runs: the call wrote a new job (uncommitted: the caller is still open)
            assert (new.duplicate, new.id != holder) == (False, True)
            new_id = new.id

            # the caller's transaction is open and must hold no lock the worker needs
            def ended() -> object:
                if then == "finish":
                    return _finish(engine, claim.value[0])
                return _cancel(engine, holder)

            done = race.beside(ended, f"the worker's {then} of the holder")
            assert _waits_on(race, caller, done) is False
            assert done.result() in (1, {holder: "running"})
            caller.commit()
    finally:
        caller.close()
    jobs = sync_jobs(engine)
    if then == "cancel":  # the cancelled holder is kept (retention deletes done jobs)
        assert [j[:3] for j in jobs[:1]] == [(holder, jobs[0][1], 1)]
        assert jobs[0][1] != "running"
        assert jobs[0][3] is False  # it had let its key go
    assert jobs[-1] == (new_id, "queued", 2, True)
    assert open_transactions(engine) == []


@pytest.mark.slow
def test_replacing_enqueues_and_claiming_workers_on_four_keys_all_return(engine: Engine) -> None:
    """The issue's reproduction: 4 keys, 2 claiming workers, 4 enqueuing threads for a few
    seconds; with the deadlock, most enqueuing threads hung within a minute."""
    stop = threading.Event()
    errors: list[BaseException] = []
    enqueued = [0] * 4
    claimed = [0] * 2

    def enqueuing(n: int) -> None:
        rng = random.Random(n)
        try:
            while not stop.is_set():
                with Session(engine) as session, session.begin():
                    account = rng.randrange(4)
                    page = rng.randrange(1000)
                    unique = DEBOUNCE if rng.random() < 0.5 else THROTTLE
                    enqueue(session, "sync", {"account": account, "page": page}, unique=unique)
                enqueued[n] += 1
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    def claiming(n: int) -> None:
        try:
            while not stop.is_set():
                with engine.connect() as conn:
                    rows = _claim_one(conn)
                    conn.commit()
                for row in rows:
                    _finish(engine, row)
                claimed[n] += len(rows)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueuing, args=(n,), daemon=True) for n in range(4)]
    threads += [threading.Thread(target=claiming, args=(n,), daemon=True) for n in range(2)]
    for thread in threads:
        thread.start()
    stop.wait(6)
    stop.set()
    for thread in threads:
        thread.join(DEADLINE)
    hung = [t.name for t in threads if t.is_alive()]
    with Race(engine) as race:  # ends the sessions of hung threads, if any
        waits = race.waits() if hung else []
    assert hung == [], f"threads that never returned: {hung}; sessions waiting: {waits}"
    assert errors == []
    assert all(enqueued)
    assert sum(claimed) > 0
    # one job per key at most is queued (the holder), whatever ran meanwhile
    with Session(engine) as session:
        queued = session.execute(
            select(Job.args["account"].as_integer(), Job.id).where(
                Job.task == "sync", Job.status == "queued"
            )
        ).all()
    accounts = [a for a, _ in queued]
    assert len(accounts) == len(set(accounts))


def test_a_replacing_enqueue_whose_caller_locked_the_running_holder_itself_returns(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        holder = enqueue(session, "sync", {"account": 3, "page": 1}, unique=DEBOUNCE).id
    with engine.begin() as conn:
        assert [r["id"] for r in _claim_one(conn)] == [holder]
    caller = Session(engine)
    try:
        with Race(engine) as race:

            def lock_then_enqueue() -> tuple[bool, int]:
                # the caller's own transaction holds the running holder's row
                caller.execute(select(Job.id).where(Job.id == holder).with_for_update())
                new = enqueue(caller, "sync", {"account": 3, "page": 2}, unique=DEBOUNCE)
                return new.duplicate, new.id

            replacing = race.beside(lock_then_enqueue, "the replacing enqueue")
            duplicate, new_id = replacing.result()  # its key release cannot wait on itself
            assert (duplicate, new_id != holder) == (False, True)
            caller.commit()
    finally:
        caller.close()
    assert sync_jobs(engine) == [(holder, "running", 1, False), (new_id, "queued", 2, True)]
