"""Waiting for a job: `wait_for(engine, job_id)` returns its kept result or raises its failure.

The finishing statements NOTIFY `RESULTS_CHANNEL` with a job's id when it ends with a kept
result (its task has `keep_result=True`) or fails; one LISTEN connection per engine wakes
every thread waiting on it. A waiter also looks at the row every `recheck` seconds, for
ends that send no notification (a cancel, a success of a task that keeps no result).

    job = send_invoice.enqueue(session, {"order_id": 7}, flush=True)
    session.commit()
    invoice = sqla_queue.wait_for(engine, job.id, timeout=30)
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine
from sqlalchemy import event as sqla_event
from sqlalchemy.orm import Session

from sqla_queue.db import queries
from sqla_queue.db.database import create_queue_engine
from sqla_queue.db.models import JobStatus
from sqla_queue.db.notify import listening
from sqla_queue.errors import (
    ConfigurationError,
    JobFailedError,
    ResultMissingError,
    ResultTimeoutError,
)
from sqla_queue.job.encoding import PENDING_RESULT

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    from sqla_queue.job.context import JobContext

log = logging.getLogger("sqla_queue.results")

RECHECK = 5.0
"""Seconds between looks at a waited-for row that sent no notification (the safety net)."""
IDLE_CLOSE = 10.0
"""Seconds the LISTEN connection of an engine stays open once nobody waits."""

_ENDED_WITHOUT_RESULT = (JobStatus.failed.value, JobStatus.cancelled.value)
_PENDING = json.loads(PENDING_RESULT)


class _Listener:
    """One LISTEN connection per engine on `RESULTS_CHANNEL`, waking waiters by job id."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._waiters: dict[int, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()

    def subscribe(self, job_id: int, timeout: float | None) -> threading.Event | None:
        """An event set when `job_id` may have ended; returns once LISTEN is in force, so a
        finish committed after this call is never missed (None: not in force in `timeout`)."""
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(event)
            if self._thread is None or not self._thread.is_alive():
                self._listening.clear()
                self._thread = threading.Thread(
                    target=self._run, name="sqla-queue-results", daemon=True
                )
                self._thread.start()
        if not self._listening.wait(timeout):
            self.unsubscribe(job_id, event)
            return None
        return event

    def unsubscribe(self, job_id: int, event: threading.Event) -> None:
        with self._lock:
            events = self._waiters.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[job_id]

    def _wake(self, job_id: int | None) -> None:
        with self._lock:
            if job_id is None:
                targets = [e for events in self._waiters.values() for e in events]
            else:
                targets = list(self._waiters.get(job_id, ()))
        for event in targets:
            event.set()

    def _idle(self) -> bool:
        """Nobody waits: the thread ends (under the lock, so a new waiter starts another)."""
        with self._lock:
            if self._waiters:
                return False
            self._thread = None
            self._listening.clear()
            return True

    def _run(self) -> None:
        while not self._idle():
            try:
                self._listen()
            except Exception as exc:  # lost or refused: waiters look at their rows meanwhile
                log.warning("results LISTEN connection: %s; reconnecting", exc)
                self._listening.clear()
                self._wake(None)
                time.sleep(0.5)

    def _listen(self) -> None:
        """LISTEN until nobody has waited for `IDLE_CLOSE` seconds."""
        with listening(self._engine, queries.LISTEN_RESULTS) as conn:
            self._listening.set()
            self._wake(None)  # anything that ended while (re)connecting
            idle_since = time.monotonic()
            while True:
                for note in conn.notifies(timeout=0.5):
                    if note.payload.isdigit():
                        self._wake(int(note.payload))
                with self._lock:
                    if self._waiters:
                        idle_since = time.monotonic()
                if time.monotonic() - idle_since >= IDLE_CLOSE:
                    return


_listeners: weakref.WeakKeyDictionary[Engine, _Listener] = weakref.WeakKeyDictionary()
_listeners_lock = threading.Lock()


def _listener(engine: Engine) -> _Listener:
    with _listeners_lock:
        listener = _listeners.get(engine)
        if listener is None:
            listener = _listeners[engine] = _Listener(engine)
        return listener


def _engine_of(bind: Engine | Connection | Session) -> Engine:
    if isinstance(bind, Engine):
        return bind
    if isinstance(bind, Connection):
        return bind.engine
    if isinstance(bind, Session):
        return _engine_of(bind.get_bind())
    raise ConfigurationError(
        detail=f"wait_for needs an Engine, a Connection or a Session, got {type(bind).__name__}"
    )


def _look(engine: Engine, job_id: int) -> tuple[bool, Any]:
    """(ended, result) of the job; raises its failure, or `ResultMissingError`."""
    with engine.connect() as conn:
        row = conn.execute(queries.job_outcome(), {"job_id": job_id}).mappings().first()
    if row is None:
        raise ResultMissingError(job_id=job_id)
    if row["status"] == JobStatus.done.value:
        if row["result"] == _PENDING:  # its session committed; the handler is returning
            return False, "finishing"
        return True, row["result"]
    if row["status"] in _ENDED_WITHOUT_RESULT:
        raise JobFailedError(job_id, row["task"], row["status"], row["last_error"])
    return False, row["status"]


def wait_for(
    bind: Engine | Connection | Session,
    job_id: int,
    timeout: float | None = None,
    *,
    recheck: float = RECHECK,
) -> Any:
    """Wait until job `job_id` has ended; return its result, or raise why it did not succeed.

    `bind` is an engine, or a connection or session whose engine is used (the wait reads
    the row on connections of its own, never in the caller's transaction: commit the
    enqueue first). Returns what the handler returned when its task has
    `keep_result=True` (None otherwise). Raises `JobFailedError` (status failed or
    cancelled, with the last error), `ResultTimeoutError` after `timeout` seconds (None:
    no limit), `ResultMissingError` if no row is found (never existed, or succeeded
    without a kept result in a queue that deletes its jobs, or expired or pruned).

    It looks at the row first, so `timeout=0` is a poll that never blocks: the result of a
    job that has ended, else `ResultTimeoutError`. A negative or NaN `timeout` is a
    `ValueError`. Woken by the NOTIFY of the statement that finished the job; `recheck`
    seconds is only how often it looks without one (for ends that notify nobody).
    """
    _check_wait(timeout, recheck)
    engine = _engine_of(bind)
    if timeout is not None and math.isinf(timeout):
        timeout = None
    deadline = None if timeout is None else time.monotonic() + timeout
    ended, value = _look(engine, job_id)  # first: a job that has ended needs no LISTEN
    if ended:
        return value
    listener = _listener(engine)
    event = listener.subscribe(job_id, _left(deadline))
    if event is None:  # LISTEN not in force before the deadline: one last look
        ended, value = _look(engine, job_id)
        if ended:
            return value
        raise ResultTimeoutError(job_id=job_id, timeout=timeout, status=value)
    try:
        while True:
            ended, value = _look(engine, job_id)
            if ended:
                return value
            left = _left(deadline)
            if left is not None and left <= 0:
                raise ResultTimeoutError(job_id=job_id, timeout=timeout, status=value)
            event.wait(recheck if left is None else min(recheck, left))
            event.clear()
    finally:
        listener.unsubscribe(job_id, event)


_PARENT_RESULTS = queries.workflows.parent_results()
PENDING_WAIT = 30.0
"""Seconds `parent_results` waits for a parent whose result is still being stored (its
`ctx.session()` committed, which let its dependents run, and its handler is returning)."""


def read_parent_results(execute: Callable[..., Any], job_id: int) -> list[Any]:
    """`ctx.parent_results()`: the kept results of the jobs `job_id` depends on, in its
    `depends_on` order, None for one that kept none; `execute(statement, params)` runs the
    query (a connection's, or `drain`'s in its transaction)."""
    deadline = time.monotonic() + PENDING_WAIT
    while True:
        results = [row.result for row in execute(_PARENT_RESULTS, {"job_id": job_id})]
        if _PENDING not in results:
            return results
        if time.monotonic() >= deadline:
            return [None if result == _PENDING else result for result in results]
        time.sleep(0.05)


def parent_results_on(engine: Engine, ctx: JobContext) -> list[Any]:
    """`read_parent_results` for `ctx`'s job on a connection of `engine` (the worker's)."""
    with engine.connect() as conn:
        return read_parent_results(conn.execute, ctx.job_id)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _check_wait(timeout: float | None, recheck: float) -> None:
    """A timeout that is negative, NaN or not a number (None: no limit), or a recheck that is
    not a positive number, is refused with what is accepted."""
    for name, value, accepted in (
        ("timeout", timeout, "0 or more seconds (0 looks once; None waits without a limit)"),
        ("recheck", recheck, "more than 0 seconds"),
    ):
        if value is None and name == "timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"wait_for's {name} must be {accepted}, got {value!r}")
        if math.isnan(value) or value < 0 or (name == "recheck" and value == 0):
            raise ValueError(f"wait_for's {name} must be {accepted}, got {value!r}")


_sync_engines: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()
"""An async engine's (its `sync_engine`'s) small synchronous companion, for `wait_for_async`:
disposed when the async engine is disposed or collected."""
_sync_engines_lock = threading.Lock()


def sync_engine_of(bind: AsyncEngine | AsyncConnection | AsyncSession) -> Engine:
    """A small synchronous engine on the same database as an async bind: one per async
    engine, made on first use and disposed with it (its `dispose()`, or when it is
    collected), so a process that makes and drops async engines keeps no pool of theirs."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(bind, AsyncSession):
        found = bind.bind
        if found is None:
            raise ConfigurationError(detail="wait_for_async needs a session bound to an engine")
        return sync_engine_of(found)
    owner = (bind.engine if isinstance(bind, AsyncConnection) else bind).sync_engine
    with _sync_engines_lock:
        companion = _sync_engines.get(owner)
        if companion is None:
            url = owner.url.render_as_string(hide_password=False)
            companion = _sync_engines[owner] = create_queue_engine(url, pool_size=2)
            weakref.finalize(owner, companion.dispose)
            if not sqla_event.contains(owner, "engine_disposed", _dispose_companion):
                sqla_event.listen(owner, "engine_disposed", _dispose_companion)
        return companion


def _dispose_companion(owner: Engine) -> None:
    """The async engine was disposed: so is its companion (a later wait makes a new one)."""
    with _sync_engines_lock:
        companion = _sync_engines.pop(owner, None)
    if companion is not None:
        companion.dispose()


async def wait_for_async(
    bind: AsyncEngine | AsyncConnection | AsyncSession,
    job_id: int,
    timeout: float | None = None,
    *,
    recheck: float = RECHECK,
) -> Any:
    """`wait_for` for asyncio: the same wait, woken by the same NOTIFY, in a worker thread
    (the event loop stays free). `bind` is an async engine, connection or session."""
    _check_wait(timeout, recheck)
    engine = sync_engine_of(bind)
    return await asyncio.to_thread(wait_for, engine, job_id, timeout, recheck=recheck)


__all__ = [
    "PENDING_WAIT",
    "RECHECK",
    "parent_results_on",
    "read_parent_results",
    "wait_for",
    "wait_for_async",
]
