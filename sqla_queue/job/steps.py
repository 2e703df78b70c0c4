"""Durable steps and sleeps: what `ctx.step`, `ctx.step_async`, `ctx.sleep` and
`ctx.sleep_until` do, over a `StepJournal` (the table worker's records in PostgreSQL,
`sqla_queue.worker.steps`).

A step is keyed by the job and its name. Its first finished run records its JSON result;
every later run of the job (a retry, a reap after a crash, a wake after a sleep) gets that
recorded result back without running it. What a step returns is always the recorded JSON
decoded (a tuple comes back as a list on the first run too), so the first run and a replay
see the same value. A sleep is a step of kind `sleep` whose result is when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

from sqla_queue.errors import (
    MAX_SNOOZE,
    ConfigurationError,
    JobCancelledError,
    JobLostError,
    Sleeping,
    Snooze,
    StepResultError,
)
from sqla_queue.job.encoding import encode_result
from sqla_queue.job.retry import RetryPolicy

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = [
    "MAX_STEP_NAME_LENGTH",
    "MAX_STEP_RESULT_BYTES",
    "STEP_BACKOFF",
    "DurableSteps",
    "RecordedStep",
    "StepCall",
    "StepJournal",
    "StepWrite",
]

MAX_STEP_RESULT_BYTES = 65_536
"""The largest JSON text a step's result may be (bytes): a step's record is read on every
run of its job; keep large data elsewhere and return its key."""
MAX_STEP_NAME_LENGTH = 200
"""The longest step (or sleep) name."""
MAX_STEP_ERROR_CHARS = 2_000
"""The longest error a failed step records."""
STEP_BACKOFF = RetryPolicy(base=1.0, factor=2.0, max_delay=60.0)
"""The wait between a step's own tries when its `backoff` is not given."""

_NOT_RETRIED = (Snooze, JobLostError, JobCancelledError)
"""What ends a step at once, unrecorded: the job's run is ending (a `StepResultError` is
recorded as the step's error and not retried either: the same value would come back)."""


@dataclass(frozen=True)
class RecordedStep:
    """A step as the journal holds it: `kind` ('step' or 'sleep'), `status` ('done' or
    'failed'), its decoded `result`, and for a sleep the seconds `left` (database clock)."""

    kind: str
    status: str
    result: Any
    left: float | None = None


@dataclass(frozen=True)
class StepCall:
    """One call of `ctx.step` or `ctx.step_async`: the step, its function and arguments, and
    its options (`session`, its own `attempts` and `backoff`)."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    session: bool = False
    attempts: int = 1
    backoff: RetryPolicy | None = None


@dataclass(frozen=True)
class StepWrite:
    """One record to write: the step's outcome, and who writes it (the job's attempt)."""

    job_id: int
    attempt: int
    name: str
    kind: str
    status: str
    tries: int
    started_at: datetime
    result_json: str | None = None
    error: str | None = None
    sleep_seconds: float | None = None
    """A sleep's length from now, the end computed by the database clock."""


class StepJournal(Protocol):
    """Where a runner keeps its jobs' steps. `record` and `record_in_session` are fenced on
    the job's attempt: they return None, writing nothing, when the attempt no longer holds
    the job or the step is recorded done already (the caller reads which)."""

    def read(self, job_id: int, name: str) -> RecordedStep | None: ...

    def read_all(self, job_id: int) -> dict[str, RecordedStep]:
        """Every recorded step of the job, by name: read once per run, for its replays."""
        ...

    def record(self, write: StepWrite) -> RecordedStep | None: ...

    def record_in_session(
        self, write: StepWrite, call: Callable[[Session], str]
    ) -> RecordedStep | None:
        """Open a session, `call(session)` (the step: its writes, then its result as JSON
        text), record the step on the same transaction and commit both, or neither."""
        ...


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class DurableSteps:
    """The steps and sleeps of one run of one job (made by `JobContext` on first use)."""

    def __init__(
        self,
        journal: StepJournal,
        job_id: int,
        attempt: int,
        cancelled: Callable[[], bool],
        raise_if_cancelled: Callable[[], None],
    ) -> None:
        self.journal = journal
        self.job_id = job_id
        self.attempt = attempt
        self._cancelled = cancelled
        self._raise_if_cancelled = raise_if_cancelled
        self.run = 0
        """Steps this run ran and recorded."""
        self.replayed = 0
        """Steps this run returned from their record, without running them."""
        self._sleeps = 0
        self._known: dict[str, RecordedStep] | None = None
        """The job's recorded steps as this run's first step read them."""
        self._lock = threading.Lock()

    # -- steps ----------------------------------------------------------------------------

    def step(self, call: StepCall) -> Any:
        """`ctx.step`: the recorded result of step `name`, or `fn`'s, run and recorded."""
        name, fn, args, kwargs = call.name, call.fn, call.args, call.kwargs
        session, attempts, backoff = call.session, call.attempts, call.backoff
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"step {name!r}: {_callable_name(fn)} is a coroutine function; in an async "
                "handler use `await ctx.step_async(...)`"
            )
        _check_options(name, attempts)
        done = self._replay(name)
        if done is not None:
            return done[0]
        started, tries = _utcnow(), 0
        while True:
            tries += 1
            self._raise_if_cancelled()
            try:
                written = self._try(name, fn, args, kwargs, session, tries, started, None)
            except _NOT_RETRIED:
                raise
            except Exception as exc:
                delay = self._failed_try(name, exc, tries, attempts, started, backoff)
                self._wait(delay)
                if self._cancelled():  # given up on while it waited: record the last error
                    self._failed_try(name, exc, tries, tries, started, backoff)
                continue
            return self._settled(name, written)

    async def step_async(self, call: StepCall) -> Any:
        """`ctx.step_async`: as `step`, for async handlers; `fn` may be sync or async. The
        journal's statements run in a thread, so the event loop is never blocked on them."""
        name, fn, args, kwargs = call.name, call.fn, call.args, call.kwargs
        session, attempts, backoff = call.session, call.attempts, call.backoff
        _check_options(name, attempts)
        done = await asyncio.to_thread(self._replay, name)
        if done is not None:
            return done[0]
        loop = asyncio.get_running_loop()
        started, tries = _utcnow(), 0
        while True:
            tries += 1
            self._raise_if_cancelled()
            try:
                if session:  # the session's work runs in a thread; an async fn on this loop
                    written = await asyncio.to_thread(
                        self._try, name, fn, args, kwargs, True, tries, started, loop
                    )
                else:
                    value = fn(*args, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                    encoded = self._encoded(name, value)
                    write = self._write(name, "done", tries, started, encoded)
                    written = (await asyncio.to_thread(self.journal.record, write), encoded)
            except _NOT_RETRIED:
                raise
            except Exception as exc:
                delay = await asyncio.to_thread(
                    self._failed_try, name, exc, tries, attempts, started, backoff
                )
                await asyncio.sleep(delay)
                if self._cancelled():
                    await asyncio.to_thread(
                        self._failed_try, name, exc, tries, tries, started, backoff
                    )
                continue
            return await asyncio.to_thread(self._settled, name, written)

    def _replay(self, name: str) -> tuple[Any] | None:
        """The recorded result of a done step, as a 1-tuple (None: run it). The job's
        records are read once, at the run's first step: a step another attempt records
        after that is found when this run's own record of it is refused (`_settled`)."""
        with self._lock:
            known = self._known
        if known is None:
            known = self.journal.read_all(self.job_id)
            with self._lock:
                self._known = known
        recorded = known.get(name)
        if recorded is None:
            return None
        if recorded.kind != "step":
            raise ConfigurationError(
                detail=f"job {self.job_id}: {name!r} names a sleep already, not a step; "
                "give each step and each sleep a name of its own"
            )
        if recorded.status != "done":
            return None
        with self._lock:
            self.replayed += 1
        return (recorded.result,)

    def _try(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        session: bool,
        tries: int,
        started: datetime,
        loop: asyncio.AbstractEventLoop | None,
    ) -> tuple[RecordedStep | None, str]:
        """One try of the step, recorded: (what the journal wrote, the result's JSON)."""
        if not session:
            encoded = self._encoded(name, fn(*args, **kwargs))
            return self.journal.record(self._write(name, "done", tries, started, encoded)), encoded
        kept: list[str] = []

        def call(db: Session) -> str:
            value = fn(db, *args, **kwargs)
            if inspect.isawaitable(value):
                if loop is None:
                    raise TypeError(
                        f"step {name!r}: {_callable_name(fn)} returned an awaitable; in an "
                        "async handler use `await ctx.step_async(...)`"
                    )
                value = asyncio.run_coroutine_threadsafe(_awaited(value), loop).result()
            kept.append(self._encoded(name, value))
            return kept[0]

        # The result is known only once fn returned: the journal asks for it through `call`.
        placeholder = self._write(name, "done", tries, started, None)
        written = self.journal.record_in_session(placeholder, call)
        return written, kept[0] if kept else "null"

    def _settled(self, name: str, written: tuple[RecordedStep | None, str]) -> Any:
        """What a step returns once its try ended: its result, as recorded (by this run, or
        by another attempt that recorded it first); `JobLostError` if this attempt was fenced
        off and nothing is recorded."""
        recorded, encoded = written
        if recorded is not None:
            value = json.loads(encoded)
            with self._lock:
                self.run += 1
                if self._known is not None:  # called again in this run, it replays
                    self._known[name] = RecordedStep("step", "done", value)
            return value
        again = self.journal.read(self.job_id, name)
        if again is not None and again.status == "done":  # another attempt recorded it first
            with self._lock:
                self.replayed += 1
                if self._known is not None:
                    self._known[name] = again
            return again.result
        raise JobLostError(job_id=self.job_id)

    def _failed_try(
        self,
        name: str,
        exc: BaseException,
        tries: int,
        attempts: int,
        started: datetime,
        backoff: RetryPolicy | None,
    ) -> float:
        """After a try that raised: the seconds to wait before the next; on the last try,
        record the step failed (its error shown by `jobs show`) and raise `exc`."""
        if tries < attempts and not self._cancelled() and not isinstance(exc, StepResultError):
            return (backoff or STEP_BACKOFF).delay(tries)
        write = self._write(name, "failed", tries, started, None, _error_line(exc))
        with contextlib.suppress(Exception):  # the step's own error is what the handler sees
            self.journal.record(write)
        raise exc

    def _wait(self, seconds: float) -> None:
        """Wait between two tries, in short slices: a cancel or a lost lease ends the wait."""
        stop = threading.Event()
        left = seconds
        while left > 0 and not self._cancelled():
            stop.wait(min(left, 0.2))
            left -= 0.2

    def _encoded(self, name: str, value: Any) -> str:
        encoded, problem = encode_result(f"step {name}", value)
        if problem is not None or encoded is None:
            raise StepResultError(step=name, job_id=self.job_id, detail=problem)
        size = len(encoded.encode("utf-8"))
        if size > MAX_STEP_RESULT_BYTES:
            raise StepResultError(
                step=name,
                job_id=self.job_id,
                detail=f"its JSON is {size:,} bytes, over the {MAX_STEP_RESULT_BYTES:,}-byte "
                "limit of a step's result (sqla_queue.job.steps.MAX_STEP_RESULT_BYTES); store "
                "the data elsewhere (a table, an object store) and return its key",
            )
        return encoded

    def _write(
        self,
        name: str,
        status: str,
        tries: int,
        started: datetime,
        encoded: str | None,
        error: str | None = None,
        kind: str = "step",
        sleep_seconds: float | None = None,
    ) -> StepWrite:
        return StepWrite(
            self.job_id,
            self.attempt,
            name,
            kind,
            status,
            tries,
            started,
            encoded,
            error,
            sleep_seconds,
        )

    # -- sleeps ---------------------------------------------------------------------------

    def sleep(self, duration: timedelta | None, until: datetime | None, name: str | None) -> None:
        """`ctx.sleep` and `ctx.sleep_until`: return at once if this sleep is over (recorded
        by an earlier run and past its end); else record it (the first time) and raise
        `Sleeping`, which ends the run: the job is queued again, due at the sleep's end."""
        with self._lock:
            self._sleeps += 1
            ordinal = self._sleeps
        name = f"sleep#{ordinal}" if name is None else name
        _check_name(name)
        recorded = self.journal.read(self.job_id, name)
        if recorded is None:
            recorded = self.journal.record(_sleep_write(self, name, duration, until))
            if recorded is None:  # fenced off, or another attempt recorded it meanwhile
                recorded = self.journal.read(self.job_id, name)
                if recorded is None:
                    raise JobLostError(job_id=self.job_id)
        if recorded.kind != "sleep":
            raise ConfigurationError(
                detail=f"job {self.job_id}: {name!r} names a step already, not a sleep; "
                "give each step and each sleep a name of its own"
            )
        left = recorded.left
        if left is None or left <= 0:
            return
        self._raise_if_cancelled()
        raise Sleeping(left, str(recorded.result.get("until")), name)


def _sleep_write(
    steps: DurableSteps, name: str, duration: timedelta | None, until: datetime | None
) -> StepWrite:
    """The record of a new sleep: its length (the end computed by the database's clock), or
    its fixed end (an aware datetime)."""
    if until is not None:
        if not isinstance(until, datetime) or until.tzinfo is None:
            raise TypeError(
                f"ctx.sleep_until needs an aware datetime, got {until!r}; pass one with a "
                "timezone, e.g. datetime.now(timezone.utc) + timedelta(days=3)"
            )
        encoded = json.dumps({"until": until.astimezone(timezone.utc).isoformat()})
        return steps._write(name, "done", 1, _utcnow(), encoded, kind="sleep")
    if not isinstance(duration, timedelta):
        raise TypeError(
            f"ctx.sleep needs a timedelta, got {type(duration).__name__}; "
            "e.g. ctx.sleep(timedelta(days=3))"
        )
    seconds = duration.total_seconds()
    if not 0 <= seconds <= MAX_SNOOZE.total_seconds():
        raise ValueError(
            f"ctx.sleep needs a duration from 0 to {MAX_SNOOZE.days} days, got {duration!r}"
        )
    return steps._write(name, "done", 1, _utcnow(), None, kind="sleep", sleep_seconds=seconds)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME_LENGTH:
        raise ConfigurationError(
            detail=f"a step's name must be a non-empty string of at most "
            f"{MAX_STEP_NAME_LENGTH} characters, got {name!r}"
        )


def _check_options(name: str, attempts: object) -> None:
    _check_name(name)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(
            detail=f"step {name!r}: attempts must be a whole number of 1 or more, got {attempts!r}"
        )


def _error_line(exc: BaseException) -> str:
    """A failed step's error as `jobs show` lists it: its class and message, bounded, with
    what PostgreSQL text cannot hold (NUL, a lone surrogate) escaped."""
    text = f"{type(exc).__name__}: {exc}"[:MAX_STEP_ERROR_CHARS]
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _callable_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value
