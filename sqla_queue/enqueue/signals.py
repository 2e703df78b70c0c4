"""Signals: `signal(session, key, payload)` in the caller's transaction, and the mailbox side
of `ctx.wait_for_signal`.

    with Session(engine) as session, session.begin():
        session.add(Payment(order_id=42, amount=amount))
        sqla_queue.signal(session, "payment:42", {"amount": amount})
    # commit: the payment row, the signal and the waiting job's wake, or none of them

A signal is kept in the mailbox (`sqla_queue.signals`) until a waiting job consumes it or it
expires (`expires_in`, a week by default; the workers' upkeep deletes expired ones), so a
handler that waits after the signal was sent gets it at once. `wake="one"` (the default)
wakes the oldest job waiting for the key and is consumed by one job; `wake="all"` wakes
every job waiting for it and is read once by each, and by each job that waits for the key
until it expires. The SQL function `sqla_queue.signal(key, payload, wake, expires_in)` does
the sending (this module calls it), so an application's trigger or another language sends
the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, scoped_session

from sqla_queue.db.queries import signals as queries
from sqla_queue.errors import JobLostError, SignalTimeout, WaitingForSignal
from sqla_queue.job.validation import check_signal_key, signal_seconds

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    from sqla_queue.job.context import JobContext
    from sqla_queue.job.tasks import TaskLookup

DEFAULT_SIGNAL_EXPIRY = timedelta(days=7)
"""How long a signal nobody consumed stays in the mailbox, unless `expires_in` says."""
PARK_RETRY_SECONDS = 1.0
"""Seconds until a job whose park found a sender's transaction on its key still open
(`queries.PARK_LOCK_TIMEOUT`) runs again, its attempt refunded."""
LOCK_NOT_AVAILABLE = "55P03"

Wake = Literal["one", "all"]
Execute = Callable[..., Any]


def _params(key: object, payload: Any, wake: object, expires_in: object) -> dict[str, Any]:
    call = "signal()"
    check_signal_key(key, call)
    if wake not in ("one", "all"):
        raise ValueError(f"{call}: wake must be 'one' or 'all' (got {wake!r})")
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{call}: the payload must be JSON (dicts, lists, strings, finite numbers, "
            f"booleans, None): {exc}"
        ) from None
    return {
        "key": key,
        "payload": payload,
        "wake": wake,
        "expires_in": signal_seconds(expires_in, "expires_in", call),
    }


def signal(
    bind: Session | Connection,
    key: str,
    payload: Any = None,
    *,
    wake: Wake = "one",
    expires_in: timedelta | float = DEFAULT_SIGNAL_EXPIRY,
) -> int:
    """Send signal `key` with `payload` (JSON) in the transaction of `bind` (a `Session` or a
    `Connection`): kept in the mailbox until consumed or `expires_in` has passed, and the
    job waiting for it (`wake="one"`, the oldest) or every job waiting for it
    (`wake="all"`) moved to `queued` in this same transaction. Nothing happens unless the
    transaction commits; a rolled-back signal wakes nothing. Returns how many jobs it woke
    (0: none waits yet; the first to wait gets it).

    Under READ COMMITTED (PostgreSQL's default) a job that parks while this transaction
    is open is seen: the park waits for this transaction's lock of the key, or this
    transaction waits for the park's. Under REPEATABLE READ or SERIALIZABLE a job parked
    after this transaction's snapshot is woken by the workers' keeper within a heartbeat.
    """
    params = _params(key, payload, wake, expires_in)
    if isinstance(bind, (Session, scoped_session)):
        return int(bind.execute(queries.send_signal(), params).scalar_one())
    if isinstance(bind, Connection):
        return int(bind.execute(queries.send_signal(), params).scalar_one())
    given = "an Engine: open a Session or a Connection on it" if isinstance(bind, Engine) else None
    raise TypeError(
        "signal() sends the signal in your transaction: pass a Session or a Connection "
        f"(an AsyncSession to signal_async), got {given or type(bind).__name__}"
    )


async def signal_async(
    bind: AsyncSession | AsyncConnection,
    key: str,
    payload: Any = None,
    *,
    wake: Wake = "one",
    expires_in: timedelta | float = DEFAULT_SIGNAL_EXPIRY,
) -> int:
    """`signal` for an `AsyncSession` or an `AsyncConnection`, in its transaction."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    params = _params(key, payload, wake, expires_in)
    if not isinstance(bind, (AsyncSession, AsyncConnection)):
        raise TypeError(
            "signal_async() sends the signal in your transaction: pass an AsyncSession or an "
            f"AsyncConnection (a sync Session to signal), got {type(bind).__name__}"
        )
    result = await bind.execute(queries.send_signal(), params)
    return int(result.scalar_one())


# -- the waiting job's side ------------------------------------------------------------------


def receive_signal(
    transaction: Callable[[], AbstractContextManager[Execute]],
    ctx: JobContext,
    key: str,
    seq: int,
    timeout: float,
    task_max_attempts: int | None,
    *,
    own_transactions: bool = True,
) -> Any:
    """What `ctx.wait_for_signal(key, timeout)` (its `seq`-th for `key` in this run) does
    in the database: the answer recorded by an earlier run, else a signal taken now, else
    (under the key's exclusive lock, so no sender's commit slips between the look and the
    park) the timeout if its deadline has passed, else the job parked (`WaitingForSignal`).

    `transaction()` gives an execute function in a transaction that commits when the block
    ends (the worker's), or, with `own_transactions=False`, in the caller's own transaction
    (`drain` given a Session or a Connection: a test's transaction, seen by no concurrent
    sender, so no key lock is taken, which would block other connections until it ends)."""
    ids = {"waiter_id": ctx.job_id, "wait_key": key, "wait_seq": seq, "waiter_attempt": ctx.attempt}
    with transaction() as run:
        row = run(queries.wait_state(), ids).first()
        if row is None:
            run(queries.begin_wait(), {**ids, "timeout": timeout})
            row = run(queries.wait_state(), ids).one()
    if row.state != "waiting":
        return _answer(row, key)
    found, payload = _take(transaction, ids)
    if found:
        return payload
    try:
        with transaction() as run:
            if own_transactions:
                run(queries.park_lock_timeout())
                run(queries.lock_key_exclusive(), ids)
            taken = run(queries.take_signal(), ids).one()
            if taken.taken and not taken.recorded:
                raise _Answered  # rolls the take back: the signal stays
            if taken.recorded:
                return taken.payload
            timed_out = run(queries.time_out_wait(), ids).first()
            if timed_out is not None:
                deadline = timed_out.deadline
            else:
                params = {**ids, "task_max_attempts": task_max_attempts}
                if run(queries.park_job(), params).first() is None:
                    raise _Answered  # no longer this attempt's, or its wait was answered
    except _Answered:
        return _answered_elsewhere(transaction, ctx, ids)
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        # a sender's transaction on this key is still open: run again in a moment
        raise WaitingForSignal(key, row.deadline, retry_in=PARK_RETRY_SECONDS) from None
    if timed_out is not None:
        raise SignalTimeout(key=key, deadline=deadline)
    ctx.parked = True
    raise WaitingForSignal(key, row.deadline)


def _answered_elsewhere(
    transaction: Callable[[], AbstractContextManager[Execute]],
    ctx: JobContext,
    ids: dict[str, Any],
) -> Any:
    """The answer another run of the job recorded for this wait; `JobLostError` when
    there is none (this attempt no longer holds the job: it was cancelled or reaped)."""
    with transaction() as run:
        row = run(queries.wait_state(), ids).one()
    if row.state == "waiting":
        raise JobLostError(job_id=ctx.job_id)
    return _answer(row, ids["wait_key"])


def _answer(row: Any, key: str) -> Any:
    """A wait an earlier run answered: its payload, or its timeout raised again."""
    if row.state == "received":
        return row.payload
    raise SignalTimeout(key=key, deadline=row.deadline)


def _take(
    transaction: Callable[[], AbstractContextManager[Execute]], ids: dict[str, Any]
) -> tuple[bool, Any]:
    """Take a signal without the key's lock (a sender's lock does not block it): (True,
    payload), or (False, None) when none is there for this job, or when another run of
    the job answered this wait (the take is rolled back: the slow path reads that answer)."""
    try:
        with transaction() as run:
            taken = run(queries.take_signal(), ids).one()
            if taken.taken and not taken.recorded:
                raise _Answered
    except _Answered:
        return False, None
    return bool(taken.recorded), taken.payload


class _Answered(Exception):
    """The wait was answered by another run of the job (rolls the take back)."""


def engine_transaction(engine: Engine) -> Callable[[], AbstractContextManager[Execute]]:
    """Transactions of their own on `engine` (the worker's), each committed as it ends."""

    @contextmanager
    def transaction() -> Iterator[Execute]:
        with engine.begin() as conn:
            yield conn.execute

    return transaction


def receive_on(
    engine: Engine, registry: TaskLookup, ctx: JobContext, key: str, seq: int, timeout: float
) -> Any:
    """`receive_signal` on `engine` for a worker's job (`ctx.wait_for_signal`)."""
    task = registry.get(ctx.task)
    return receive_signal(
        engine_transaction(engine),
        ctx,
        key,
        seq,
        timeout,
        task.max_attempts if task is not None else None,
    )


__all__ = [
    "DEFAULT_SIGNAL_EXPIRY",
    "PARK_RETRY_SECONDS",
    "engine_transaction",
    "receive_on",
    "receive_signal",
    "signal",
    "signal_async",
]
