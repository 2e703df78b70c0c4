"""Races on purpose: hold one transaction at a chosen point while another runs.

    with Race(engine) as race:
        held = race.hold(lambda conn: claim_jobs(conn, ...))   # ran, not committed
        other = race.beside(lambda: enqueue_replacing(...))     # on a thread of its own
        race.wait_blocked_by(held, other)   # True once `other` waits on a lock `held` holds
        held.commit()
        assert other.result() == ...        # fails after the deadline, never hangs

A call that never returns is a wedge: `result()` fails the test after `DEADLINE` seconds
with what the database's sessions were waiting on. When the block ends, every transaction
the race still holds is rolled back and every other session of the test's database is
terminated, so a wedged thread unwinds instead of hanging the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine, text

T = TypeVar("T")

# Seconds a call may take before it counts as wedged: long beside anything the code under
# test decides (its own timeouts are shorter), short beside pytest-timeout.
DEADLINE = 30.0
POLL = 0.02


class Held(Generic[T]):
    """A transaction that ran `step` and now waits, its locks held, for commit or rollback."""

    def __init__(self, engine: Engine, step: Callable[[Connection], T]) -> None:
        self.conn = engine.connect()
        self.pid: int = self.conn.exec_driver_sql("select pg_backend_pid()").scalar_one()
        self.conn.commit()
        self._trans = self.conn.begin()
        self.value: T = step(self.conn)

    @property
    def open(self) -> bool:
        return self._trans.is_active

    def commit(self) -> None:
        self._trans.commit()
        self.conn.close()

    def rollback(self) -> None:
        if self._trans.is_active:
            self._trans.rollback()
        self.conn.close()


class Beside(Generic[T]):
    """A call running on a thread of its own while the race holds its transactions."""

    def __init__(self, future: Future[T], what: str, race: Race) -> None:
        self._future = future
        self.what = what
        self._race = race

    def done(self) -> bool:
        return self._future.done()

    def result(self, deadline: float = DEADLINE) -> T:
        """The call's value (or its exception); a call still running after `deadline` fails."""
        try:
            return self._future.result(timeout=deadline)
        except FutureTimeout:
            waits = self._race.waits()
            raise AssertionError(
                f"{self.what} did not return within {deadline:g} s (a wedge); "
                f"sessions waiting: {waits or 'none'}"
            ) from None


class Race:
    """Holds transactions and runs calls beside them on one test database (`engine`'s)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._held: list[Held[Any]] = []
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="race")

    def __enter__(self) -> Race:
        return self

    def __exit__(self, *exc: object) -> None:
        # End the waiting sessions first: rolled back before them, a holder would let a
        # waiter go on to its COMMIT while the block ends (a transaction seen still open).
        self._terminate_others(spare={held.pid for held in self._held if held.open})
        for held in self._held:
            if held.open:
                held.rollback()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def hold(self, step: Callable[[Connection], T]) -> Held[T]:
        """Run `step` in a new transaction and keep it open (its row and advisory locks held)."""
        held = Held(self.engine, step)
        self._held.append(held)
        return held

    def beside(self, call: Callable[[], T], what: str | None = None) -> Beside[T]:
        """Start `call` on a thread of its own; it may block on a held transaction."""
        name = what or getattr(call, "__name__", "the call")
        return Beside(self._pool.submit(call), name, self)

    def wait_blocked_by(
        self, held: Held[Any], other: Beside[Any], deadline: float = DEADLINE
    ) -> bool:
        """Wait until a session waits on a lock `held` holds (True) or `other` returns (False)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.blocked_by(held.pid):
                return True
            if other.done():
                return False
            time.sleep(POLL)
        raise AssertionError(
            f"{other.what} neither returned nor waited on the held transaction "
            f"within {deadline:g} s; sessions waiting: {self.waits() or 'none'}"
        )

    def blocked_by(self, pid: int) -> list[int]:
        """The sessions of this database that wait on a lock session `pid` holds."""
        with self.engine.connect() as conn:
            return list(
                conn.execute(
                    text(
                        "select pid from pg_stat_activity where datname = current_database()"
                        " and :pid = any(pg_blocking_pids(pid))"
                    ),
                    {"pid": pid},
                ).scalars()
            )

    def waits(self) -> list[str]:
        """What each waiting session of this database waits on, and its query: for failures."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "select pid, wait_event_type, wait_event, pg_blocking_pids(pid), query"
                    " from pg_stat_activity where datname = current_database()"
                    " and pid <> pg_backend_pid() and wait_event_type in ('Lock', 'LWLock')"
                )
            ).all()
        return [f"{r[0]} {r[1]}/{r[2]} behind {r[3]}: {r[4][:200]}" for r in rows]

    def _terminate_others(self, spare: set[int]) -> None:
        """Terminate every busy session of the database but `spare`, and wait until each has
        gone (a deadline of `DEADLINE`), so none is left mid-statement when the block ends."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            ended = list(
                conn.execute(
                    text(
                        "select pid from pg_stat_activity"
                        " where datname = current_database() and pid <> pg_backend_pid()"
                        " and state <> 'idle' and not (pid = any(:spare))"
                    ),
                    {"spare": sorted(spare)},
                ).scalars()
            )
            for pid in ended:  # one by one: a WHERE may call a function before its filters
                conn.execute(text("select pg_terminate_backend(:pid)"), {"pid": pid})
            end = time.monotonic() + DEADLINE
            alive = text("select count(*) from pg_stat_activity where pid = any(:pids)")
            while conn.execute(alive, {"pids": ended}).scalar_one():
                assert time.monotonic() < end, f"sessions {ended} outlived their termination"
                time.sleep(POLL)


def open_transactions(engine: Engine) -> list[str]:
    """Sessions of this database in a transaction that holds locks (it has a transaction id):
    after a call returns, none of its own should be left behind."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "select pid, state, query from pg_stat_activity"
                " where datname = current_database() and pid <> pg_backend_pid()"
                " and backend_xid is not null"
            )
        ).all()
    return [f"{r[0]} {r[1]}: {r[2][:200]}" for r in rows]


@contextmanager
def deadline_thread(call: Callable[[], Any], what: str) -> Iterator[threading.Thread]:
    """Run `call` on a daemon thread for the block; the block's end fails if it still runs."""
    thread = threading.Thread(target=call, name=what, daemon=True)
    thread.start()
    yield thread
    thread.join(DEADLINE)
    assert not thread.is_alive(), f"{what} still ran {DEADLINE:g} s after the test's end"
