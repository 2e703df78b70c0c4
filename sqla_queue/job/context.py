"""`JobContext`: what a job's handler, its middleware and the lifecycle hooks receive.

Both runners (the table worker and the broker worker) make one per attempt; it carries the
job's identity, the shared resources, the cancel signal (`cancelled`) and, for a job that
has a row in PostgreSQL, the session that finishes it (`session()`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqla_queue.errors import ConfigurationError, JobCancelledError, JobLostError, Sleeping
from sqla_queue.job.steps import DurableSteps, StepCall, StepJournal
from sqla_queue.job.validation import check_signal_key, signal_seconds

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from sqla_queue.job.journal import JobJournal, JournalSink
    from sqla_queue.job.retry import RetryPolicy

__all__ = ["JobContext"]


class JobContext:
    """What middleware, hooks and handlers registered with `pass_context=True` receive.

    `attempt` is the fencing token: pass it to outside systems so that a write from a
    stale attempt (a worker that lost its lease and woke up late) can be rejected.
    `resources` are what the registry and the worker were given (an engine, a
    sessionmaker, a client), shared by every job: `ctx.resources["db"]`. `tags` and `meta`
    are the job's own, as enqueued (meta is decoded on first use).
    """

    __slots__ = (
        "_handed",
        "_handed_taken",
        "_heartbeat",
        "_journal",
        "_journal_sink",
        "_lost",
        "_meta",
        "_parent_results",
        "_session_factory",
        "_signal_seqs",
        "_signals",
        "_state",
        "_step_journal",
        "_steps",
        "about",
        "attempt",
        "committed",
        "job_id",
        "parked",
        "queue",
        "resources",
        "sleeping",
        "tags",
        "task",
    )

    def __init__(
        self,
        job_id: int,
        task: str,
        queue: str,
        attempt: int,
        heartbeat: Callable[[JobContext], bool] | None = None,
        resources: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        meta: Mapping[str, Any] | str | None = None,
        session_factory: Callable[[JobContext], Session] | None = None,
        parent_results: Callable[[JobContext], list[Any]] | None = None,
        steps: StepJournal | None = None,
        signals: Callable[[JobContext, str, int, float], Any] | None = None,
        journal_sink: JournalSink | None = None,
        about: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.resources: Mapping[str, Any] = resources if resources is not None else {}
        self._state: dict[str, Any] | None = None
        self._heartbeat = heartbeat
        self._lost: str | None = None
        self.tags: list[str] = list(tags or ())
        """The job's tags."""
        self.about = about
        """The row the job is about, as `<table>:<primary key>` (`about=`, or its first row
        argument); None for a job about no row. A row argument is loaded only if it names
        this row (`sqla_queue.orm.row_args`)."""
        self._meta = meta
        self._session_factory = session_factory
        self._parent_results = parent_results
        self.committed = False
        """True once a `session()` of this job committed: the job is finished already."""
        self._step_journal = steps
        self._steps: DurableSteps | None = None
        self._signals = signals
        self._signal_seqs: dict[str, int] | None = None
        self._handed: Session | None = None
        self._handed_taken = False
        self.parked = False
        """True once `wait_for_signal` parked the job: this run is over, nothing to write."""
        self.sleeping: Sleeping | None = None
        """The `Sleeping` that `sleep` raised: this run is over, and its outcome is the
        park of that sleep, even if the handler swallowed it."""
        self._journal_sink = journal_sink
        self._journal: JobJournal | None = None

    @property
    def meta(self) -> dict[str, Any]:
        """The job's meta (a dict; empty if it has none), decoded from the claim's JSON text
        on first use, so a job whose meta is never read never pays for it."""
        meta = self._meta
        if not isinstance(meta, dict):
            decoded = json.loads(meta) if isinstance(meta, str) else meta
            meta = self._meta = dict(decoded) if isinstance(decoded, Mapping) else {}
        return meta

    @property
    def state(self) -> dict[str, Any]:
        """Scratch space for middleware and hooks of this one job (e.g. a start time)."""
        if self._state is None:
            self._state = {}
        return self._state

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out, or its lease was lost: stop and return."""
        return self._lost is not None

    @property
    def lost_reason(self) -> str | None:
        """Why the job is no longer this worker's: "cancelled", "lost", "timed out", or None."""
        return self._lost

    def raise_if_cancelled(self) -> None:
        """Raise `JobCancelledError` (cancelled) or `JobLostError` (reaped, timed out, or the
        worker stopping), for long loops."""
        if self._lost == "cancelled":
            raise JobCancelledError(job_id=self.job_id)
        if self._lost is not None:
            raise JobLostError(job_id=self.job_id)

    def heartbeat(self) -> bool:
        """Extend this job's lease now; returns False if the worker no longer holds it."""
        if self._heartbeat is None:
            return self._lost is None
        return self._heartbeat(self)

    def session(self) -> Session:
        """A new SQLAlchemy `Session` on the job's database whose commit also finishes this
        job as succeeded, in the same transaction (as River's `JobCompleteTx`).

        Write your rows (and enqueue follow-up jobs) in it and commit: either all of it
        commits with the job marked succeeded (by its queue's retention), or none of it
        does. The finishing statement is fenced on the job's id, attempt and `running`
        status: if this attempt no longer holds the job (its lease expired and it was
        reaped, or it was cancelled), `commit()` raises `JobLostError` and the writes roll
        back. The worker does not finish the job again; when the task has `keep_result`,
        what the handler returns is stored in place of the result the commit left pending.
        Use it as a context manager (`with ctx.session() as session:`) and commit once; a
        session that is never committed changes nothing.

        For a task whose handler takes ORM rows (`order: Order`), the first call returns the
        session they were loaded in (locked, with `for_update=True`): change them there and
        commit, and the rows and the job's end commit together.
        """
        if self._handed is not None and not self._handed_taken:
            self._handed_taken = True
            return self._handed
        if self._session_factory is None:
            raise ConfigurationError(
                detail="ctx.session() needs a job run by a worker (or sqla_queue.testing."
                "drain) that knows the job's database; this context has none"
            )
        return self._session_factory(self)

    def hand_over(self, session: Session) -> None:
        """Make `session` (the handler's rows loaded in it) the next `session()`; the runner
        closes it after the handler returns (`close_handed`), if the handler did not."""
        self._handed = session
        self._handed_taken = False

    def close_handed(self) -> None:
        """Close the sessions `hand_over` gave (rolling back what was not committed, and
        releasing the rows' locks)."""
        if self._handed is not None:
            self._handed.close()
            self._handed = None

    def parent_results(self) -> list[Any]:
        """The results of the jobs this one depends on, in its `depends_on` order (a
        chord's callback: its group's, in the group's order): each one's kept result (its
        task has `keep_result=True`), None for one that kept none (or did not succeed, for
        a job with `on_failure="run"`). An empty list for a job without dependencies.

        Read from the database on each call (the jobs table, else the archive)."""
        if self._parent_results is None:
            raise ConfigurationError(
                detail="ctx.parent_results() needs a job run by a worker (or sqla_queue."
                "testing.drain) that knows the job's database; this context has none"
            )
        return self._parent_results(self)

    # -- durable steps and sleeps (docs/durable.md) -----------------------------------------

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        session: bool = False,
        attempts: int = 1,
        backoff: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run `fn(*args, **kwargs)` once for this job, as its step `name`, and return its
        result: recorded as JSON the first time it returns, and returned from that record,
        without running `fn`, by every later run of the job (a retry, a reap after a crash,
        a wake after `sleep`). Steps are keyed by name, not position.

        `session=True` calls `fn(session, *args, **kwargs)` with a new `Session` that
        `step` commits when `fn` returns, together with the step's record: a step that only
        writes to the database runs exactly once (`fn` flushes, never commits). `attempts`
        tries `fn` that many times, waiting `backoff` (a `RetryPolicy`; 1 s doubling to
        60 s by default) between tries, before its error reaches the handler (and the job's
        own retry). The result must be JSON (`StepResultError` otherwise, as for one over
        `MAX_STEP_RESULT_BYTES`); it is returned as decoded from that JSON on every run.
        Recording is fenced on this attempt: if the job is no longer this attempt's,
        `JobLostError`. `fn` may not take `session`, `attempts` or `backoff` as keywords
        (wrap it). For an async `fn`, or in an async handler, use `step_async`."""
        return self._durable().step(StepCall(name, fn, args, kwargs, session, attempts, backoff))

    async def step_async(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        session: bool = False,
        attempts: int = 1,
        backoff: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Any:
        """`step` for async handlers: `await ctx.step_async("charge", charge, order_id)`;
        `fn` may be a coroutine function or a plain one (a `session=True` step's session is
        a plain `Session`; its statements run in a thread, never on the event loop)."""
        call = StepCall(name, fn, args, kwargs, session, attempts, backoff)
        return await self._durable().step_async(call)

    def sleep(self, duration: timedelta, *, name: str | None = None) -> None:
        """Sleep durably for `duration`: the first time, record the sleep's end and end
        this run (`Sleeping`, a `Suspended`: `except Exception` does not catch it): the job
        is parked (status `waiting`), no slot held and no attempt spent, and runs again at
        the end (woken by a worker's keeper), replaying its finished steps; when that run
        reaches this call again, it returns at once. A sleep is keyed by `name`, else by its
        order among this run's sleeps (`sleep#1`, ...): name sleeps that code may reorder.
        The end is measured by the database's clock. Works the same in async handlers (it
        never has to be awaited: it returns or raises)."""
        self._slept(duration, None, name)

    def sleep_until(self, until: datetime, *, name: str | None = None) -> None:
        """`sleep` until `until`, an aware datetime (at once if it has passed)."""
        self._slept(None, until, name)

    def _slept(self, duration: timedelta | None, until: datetime | None, name: str | None) -> None:
        try:
            self._durable().sleep(duration, until, name)
        except Sleeping as sleeping:
            self.sleeping = sleeping
            raise

    @property
    def steps_run(self) -> int:
        """Steps this run ran and recorded (metrics: run against replayed)."""
        return 0 if self._steps is None else self._steps.run

    @property
    def steps_replayed(self) -> int:
        """Steps this run returned from their record without running them."""
        return 0 if self._steps is None else self._steps.replayed

    def _durable(self) -> DurableSteps:
        if self._steps is None:
            if self._step_journal is None:
                raise ConfigurationError(
                    detail="ctx.step() and ctx.sleep() need a job run by the table worker "
                    "(sqla_queue.Worker, `sqla-queue worker`), which records its steps in "
                    "the job's database; this context has none"
                )
            self._steps = DurableSteps(
                self._step_journal,
                self.job_id,
                self.attempt,
                lambda: self.cancelled,
                self.raise_if_cancelled,
            )
        return self._steps

    # -- signals and waits (docs/signals.md) ------------------------------------------------

    def wait_for_signal(self, key: str, timeout: timedelta | float) -> Any:
        """The payload of signal `key` (`sqla_queue.signal(session, key, payload)`), sent
        before or after this call; or, when none is in the mailbox, this run ends here.

        The job is parked (status `waiting`, holding no worker, queue or partition slot,
        spending no attempt) until the signal is committed or `timeout` (a timedelta or
        seconds, counted from the first run that waited) passes; then it runs again from
        the start of the handler, and this call returns the payload, or raises
        `SignalTimeout` (catch it to do what the timeout means). Everything before the call
        runs again: keep it idempotent (`ctx.step` records what must not). A later run
        gets the same answer: each wait's answer is recorded under the job, the key and the
        call's number among this run's waits for that key. Lets `WaitingForSignal` (a
        `BaseException`) through: do not swallow it.
        """
        check_signal_key(key, "wait_for_signal()")
        seconds = signal_seconds(timeout, "timeout", "wait_for_signal()")
        if self._signals is None:
            raise ConfigurationError(
                detail="ctx.wait_for_signal() needs a job run by the table worker (or "
                "sqla_queue.testing.drain) that knows the job's database; this context has none"
            )
        seqs = self._signal_seqs if self._signal_seqs is not None else {}
        self._signal_seqs = seqs
        seqs[key] = seq = seqs.get(key, 0) + 1
        return self._signals(self, key, seq, seconds)

    async def wait_for_signal_async(self, key: str, timeout: timedelta | float) -> Any:
        """`wait_for_signal` for an async handler: its database work on a thread, so the
        event loop runs on meanwhile."""
        return await asyncio.to_thread(self.wait_for_signal, key, timeout)

    # -- progress and log lines (docs/worker.md) --------------------------------------------

    def progress(self, fraction: float | None, message: str | None = None) -> None:
        """Report how far this attempt has come: `fraction` from 0 to 1 (None: a message
        only) and a short `message` ("resized 4 of 10"), shown by `sqla-queue jobs show`
        and the dashboard's job page. Call it as often as you like: it is written at most
        once a second per job (the latest value always, when the run ends), to a table of
        its own (not the job's row), and only while this attempt holds the job (after it
        was cancelled, timed out or lost, nothing is written). A value
        out of range raises `ValueError`. Without a worker's database (a broker's job, a
        context made by hand) the value is kept on the context only (`journal`)."""
        journal = self.open_journal()
        if self._lost is None:  # cancelled, timed out or lost: the attempt shows no more
            journal.progress(fraction, message)

    @property
    def journal_sink(self) -> JournalSink | None:
        """Where this attempt's journal is written (the worker's database), or None."""
        return self._journal_sink

    @property
    def journal(self) -> JobJournal | None:
        """This attempt's journal (its progress and log lines), once it has one."""
        return self._journal

    def open_journal(self) -> JobJournal:
        """This attempt's journal, made on first use (progress, or a log line)."""
        if self._journal is None:
            from sqla_queue.job.journal import JobJournal

            sink = self._journal_sink if self._journal_sink is not None else _NO_SINK
            self._journal = JobJournal(sink, self.job_id, self.attempt)
        return self._journal

    def resource(self, name: str) -> Any:
        """The resource named `name`, or a `ConfigurationError` naming the ones there are."""
        try:
            return self.resources[name]
        except KeyError:
            known = ", ".join(sorted(self.resources)) or "none"
            raise ConfigurationError(
                detail=f"no resource named {name!r} (known: {known}); pass it as "
                f"Registry(resources={{{name!r}: ...}}) or WorkerConfig(resources=...)"
            ) from None

    def mark_lost(self, reason: str = "lost") -> None:
        """Called by the worker when the job is no longer its own (the first reason stays)."""
        if self._lost is None:
            self._lost = reason

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, task={self.task!r}, attempt={self.attempt})"


class _NoSink:
    """Where a context without a worker's database writes its journal: nowhere."""

    keeps_logs = False

    def write_progress(self, *args: Any) -> None:
        pass

    def write_logs(self, *args: Any) -> None:
        pass


_NO_SINK = _NoSink()
