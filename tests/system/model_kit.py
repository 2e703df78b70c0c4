"""Support for the model-based test of the queue (tests/system/test_model.py).

- `Recorder`: what handlers did, written by the handlers themselves: one `Run` per
  (job, attempt), with the behaviour asked for, how the handler ended and when, and the
  violations seen at a handler's start (a second run of one attempt, a queue's or the
  worker's limit exceeded, a paused queue's job started, a job of a sequence started while
  another of its sequence runs or an earlier one holds it, a partition's limit exceeded:
  those two read the database at the start);
- `build_registry`: the tasks of the model, all one handler that behaves as its job's
  args say (`b`: ok, fail, nul, odd, snooze, slow, surrogate, nan, session, steps, sleep,
  wait: for signal `signal_key(n)`, its payload or its timeout recorded; journey: an outside
  step, a database-only step, a sleep and a wait, in one of three orders, `JOURNEYS`); and the row
  tasks (`ROW_TASKS`), whose handler takes an ORM row (`ModelOrder`) besides, records the
  row it was given (`Recorder.row_seen`) and behaves as `b` says (ok, fail, or touch: change
  the row in `ctx.session()` and commit it with the job's end);
- `observe`: every job row (jobs, the history and the archive of older releases) as a plain
  `Row`;
- `shift_clock`: the test's clock. Time passes by moving every timestamp of the test
  database back by so many seconds (run_at, finished_at, leases, worker registrations,
  rate windows): to the queue, whose every decision compares a timestamp with the
  database's now(), that is the clock moving forward. It is test manipulation of the data
  (like drain's `include_scheduled`), never a mock;
- `kill_claim`: what a worker killed with SIGKILL leaves behind, in process: the worker's
  own claim statement under a worker id of its own (registered, like a real worker, with
  the worker's registration statement), optionally the heartbeat that reports the handler
  started, then the connection goes away without finishing anything; `run_steps` and
  `run_journey`: what a `steps` or `journey` handler of such a worker did before it died
  between two of its steps, sleeps and waits (its first stages, recorded through the
  worker's own step journal and signal waits);
- `reaper_round`: one round of the reaper, the statement every worker's keeper runs;
- `keeper_wake`: the keeper's wake of parked jobs (signal waits, sleeps);
- `check` and `replay`: a fixed scenario's steps run as the state machine runs its rules,
  every invariant checked after each (the regression and durable scenario tests).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import Connection, Engine, Select, Table, func, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import JobContext, Registry, RetryPolicy, SignalTimeout, Snooze
from sqla_queue.db import queries
from sqla_queue.db.queries import signals as signal_queries
from sqla_queue.db.queries import steps as step_queries
from sqla_queue.db.queries.common import archive, history, jobs, queue_starts, workers
from sqla_queue.db.queries.steps import job_steps

TASK_MAX_ATTEMPTS = 2
"""The model's tasks' own max_attempts: small, so jobs run out of attempts in a few steps."""
TIMEOUT = 0.15
"""Seconds the `timed` task may run; its `slow` jobs sleep `SLOW_SLEEP`, past it."""
SLOW_SLEEP = 0.4
SNOOZE_SECONDS = 30.0
RETRY = RetryPolicy(base=60.0, jitter=0.0)
"""Retries wait a minute: never due within one worker step, only once time passes."""
KILL_LEASE = 30.0
"""The lease of the jobs a killed worker claimed."""
KILL_STALE_AFTER = 6.0
"""The registration of a killed worker expires this many seconds after its claim."""

TASKS = {
    "plain": {"max_attempts": TASK_MAX_ATTEMPTS},
    "kept": {"max_attempts": TASK_MAX_ATTEMPTS, "keep_result": True},
    "timed": {"max_attempts": TASK_MAX_ATTEMPTS, "timeout": TIMEOUT},
}
"""The model's tasks by name and their options (one handler for all of them)."""

BEHAVIOURS = {
    "plain": ("ok", "fail", "nul", "odd", "snooze", "steps", "sleep", "wait", "journey"),
    "kept": ("ok", "fail", "snooze", "surrogate", "nan", "session", "steps"),
    "timed": ("ok", "fail", "slow"),
}
"""What a job of each task may be asked to do (its `b` argument)."""

ROW_TASKS = {
    "row": {"max_attempts": TASK_MAX_ATTEMPTS, "missing": "cancel", "changed": "run"},
    "row_skip": {"max_attempts": TASK_MAX_ATTEMPTS, "missing": "none", "changed": "skip"},
}
"""The model's tasks taking an ORM row (`order: ModelOrder`; `row_skip`'s may be None), with
their row policy (`sqla_queue.orm.row_args`): a row gone cancels a `row` job and runs a
`row_skip` one with None; a row changed since enqueue runs a `row` job with the row as it
is and cancels a `row_skip` one."""
ROW_BEHAVIOURS = ("ok", "fail", "touch")
ROW_TABLE = "model_orders"


class ModelRowBase(DeclarativeBase):
    pass


class ModelOrder(ModelRowBase):
    """The rows the row tasks take: a `version_id_col`, so each change is seen."""

    __tablename__ = ROW_TABLE

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")
    version: Mapped[int] = mapped_column(default=1)
    __mapper_args__ = {"version_id_col": version}


if TYPE_CHECKING:
    from system.test_model import QueueMachine


class OddError(BaseException):
    """A handler's exception that is not an `Exception` (as KeyboardInterrupt is not)."""


@dataclass
class Run:
    """One handler execution, as the handler recorded it."""

    job_id: int
    attempt: int
    queue: str
    task: str
    behaviour: str
    step: int
    started: float
    ended: float | None = None
    raised: str | None = None
    """The exception's class name, if the handler raised (Snooze included)."""
    killed: bool = False
    """Not a handler run: an attempt a killed worker had started."""


HELD_MARGIN = 1.0
"""Seconds before a killed worker's job may be reaped in which the model no longer counts
its slot as held (the database's lease and the model's clock differ by a claim's time)."""


@dataclass
class Recorder:
    """What the handlers did, and what they saw at their start, across threads."""

    runs: dict[tuple[int, int], Run] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    executing: dict[str, int] = field(default_factory=dict)
    step: int = 0
    limits: dict[str, int | None] = field(default_factory=dict)
    """Each queue's concurrency limit while the current worker step runs."""
    held_until: dict[str, list[float]] = field(default_factory=dict)
    """When (time.monotonic) each killed worker's job of a queue may be reaped, freeing its
    slot: until then it holds one of its queue's slots."""
    paused: frozenset[str] = frozenset()
    worker_concurrency: int = 1
    engine: Engine | None = None
    """The test database, read at the start of a job of a sequence or a partition-limited
    queue (`_turn_violations`)."""
    sequence_of: dict[int, str] = field(default_factory=dict)
    """The sequence of each job that has one, as the step began (a sequence never changes)."""
    partition_limits: dict[str, int | None] = field(default_factory=dict)
    """Each queue's partition limit while the current worker step runs."""
    executing_sequences: dict[str, list[int]] = field(default_factory=dict)
    overtaken: frozenset[int] = frozenset()
    """Jobs retried while a later job of their sequence ran: that one may still run as they
    start (a known defect the model excuses, "overtaking retry" in tests/system/test_model.py)."""
    outside: list[tuple[int, int]] = field(default_factory=list)
    """(job, attempt) of every run of a `steps` job's outside step: its effect, counted."""
    step_seen: dict[int, list[Any]] = field(default_factory=dict)
    """What each run of a `steps` job got back from its outside step, in run order."""
    signal_seen: dict[int, list[Any]] = field(default_factory=dict)
    """What each run of a `wait` job got from its wait: a payload, or "timed out"."""
    row_seen: dict[tuple[int, int], tuple[int, int] | None] = field(default_factory=dict)
    """Per (job, attempt) of a row task's run: the (id, version) of the row its handler was
    given, or None."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def outside_step(self, job_id: int, attempt: int) -> dict[str, int]:
        """A durable step's outside effect: counted in the ledger, its result the attempt.
        A violation if the step is recorded done already: a recorded step never runs again
        (in the model no worker dies between a step's function and its record)."""
        recorded = None
        if self.engine is not None:
            with self.engine.connect() as conn:
                recorded = conn.execute(RECORDED_OUTSIDE, {"j": job_id}).scalar()
        with self.lock:
            self.outside.append((job_id, attempt))
            if recorded is not None:
                self.violations.append(
                    f"job {job_id}'s step 'outside', recorded done by attempt {recorded}, ran "
                    f"again as attempt {attempt}"
                )
        return {"attempt": attempt}

    def start(self, ctx: JobContext, task: str, behaviour: str) -> Run:
        found = self._turn_violations(ctx.job_id, ctx.queue)
        with self.lock:
            self.violations.extend(found)
            sequence = self.sequence_of.get(ctx.job_id)
            if sequence is not None:
                others = self.executing_sequences.setdefault(sequence, [])
                if [i for i in others if not (ctx.job_id in self.overtaken and i > ctx.job_id)]:
                    self.violations.append(
                        f"job {ctx.job_id} of sequence {sequence!r} started while the handlers "
                        f"of jobs {others} of its sequence were executing"
                    )
                others.append(ctx.job_id)
            key = (ctx.job_id, ctx.attempt)
            if key in self.runs:
                self.violations.append(
                    f"job {ctx.job_id} ran twice as attempt {ctx.attempt} "
                    f"(steps {self.runs[key].step} and {self.step})"
                )
            run = Run(
                ctx.job_id, ctx.attempt, ctx.queue, task, behaviour, self.step, time.monotonic()
            )
            self.runs[key] = run
            self.executing[ctx.queue] = self.executing.get(ctx.queue, 0) + 1
            total = sum(self.executing.values())
            limit = self.limits.get(ctx.queue)
            # Surely held: reapable only later than a second from now. Near its deadline the
            # database (whose lease began at the claim, a little before the model's clock
            # did) may have freed the slot already, so such a job is not counted.
            now = time.monotonic()
            deadlines = self.held_until.get(ctx.queue, ())
            held = sum(1 for until in deadlines if until > now + HELD_MARGIN)
            if limit is not None and self.executing[ctx.queue] + held > limit:
                self.violations.append(
                    f"job {ctx.job_id} started while {self.executing[ctx.queue] - 1} handler(s) "
                    f"of queue {ctx.queue!r} were executing and {held} of its jobs were held "
                    f"by killed workers: its concurrency limit is {limit}"
                )
            if total > self.worker_concurrency:
                self.violations.append(
                    f"job {ctx.job_id} started while {total - 1} handler(s) were executing: "
                    f"the worker's concurrency is {self.worker_concurrency}"
                )
            if ctx.queue in self.paused:
                self.violations.append(f"job {ctx.job_id} of paused queue {ctx.queue!r} ran")
            return run

    def end(self, run: Run, raised: BaseException | None) -> None:
        with self.lock:
            run.ended = time.monotonic()
            run.raised = None if raised is None else type(raised).__name__
            self.executing[run.queue] -= 1
            sequence = self.sequence_of.get(run.job_id)
            if sequence is not None:
                self.executing_sequences[sequence].remove(run.job_id)

    def in_step(self, step: int) -> list[Run]:
        with self.lock:
            return [r for r in self.runs.values() if r.step == step and not r.killed]

    def _turn_violations(self, job_id: int, queue: str) -> list[str]:
        """What the database shows as a job of a sequence, or of a partition-limited queue,
        starts: another job of its sequence running, or an earlier one holding it; more
        running jobs in its partition than its queue's limit."""
        limit = self.partition_limits.get(queue)
        sequence = self.sequence_of.get(job_id)
        if self.engine is None or (sequence is None and limit is None):
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(TURN_NEIGHBOURS, {"id": job_id}).all()
        found = [
            f"job {job_id} of sequence {sequence!r} started while job {other} of its sequence "
            f"was {status}" + (" in a queue that holds sequences on failure" * (status == "failed"))
            for other, status, same_sequence, _, skips, cleans_up_from in rows
            if same_sequence
            and (
                status.startswith("running")
                or (
                    other < job_id
                    and not (status == "failed" and skips)
                    and not (cleans_up_from is not None and other >= cleans_up_from)
                )
            )
            and not (job_id in self.overtaken and other > job_id)
        ]
        neighbours = sum(1 for r in rows if r.same_partition and r.status.startswith("running"))
        if limit is not None and neighbours + 1 > limit:
            found.append(
                f"job {job_id} of queue {queue!r} started with {neighbours} other job(s) of its "
                f"partition running: its partition limit is {limit}"
            )
        return found


TURN_NEIGHBOURS = text(
    """
    WITH me AS (SELECT id, queue, partition, sequence FROM sqla_queue.jobs WHERE id = :id)
    SELECT j.id,
        CASE WHEN j.status = 'cancelled' THEN 'running (cancelled)' ELSE j.status END AS status,
        coalesce(j.sequence = me.sequence, false) AS same_sequence,
        j.queue = me.queue AND j.partition IS NOT DISTINCT FROM me.partition AS same_partition,
        q.sequence_on_failure = 'skip' AS skips,
        (SELECT min(f.id) FROM sqla_queue.job_deps d JOIN sqla_queue.jobs f ON f.id = d.parent_id
         WHERE d.child_id = me.id AND d.on_failure = 'run' AND f.status = 'failed'
           AND f.sequence = me.sequence) AS cleans_up_from
    FROM me
    JOIN sqla_queue.jobs j ON j.id <> me.id AND (
        (j.sequence = me.sequence AND (j.status IN ('queued', 'running', 'waiting', 'failed')
                                       OR (j.status = 'cancelled'
                                           AND j.lease_expires_at IS NOT NULL)))
        OR (j.queue = me.queue AND (j.status = 'running'
                                    OR (j.status = 'cancelled'
                                        AND j.lease_expires_at IS NOT NULL))
            AND j.partition IS NOT DISTINCT FROM me.partition))
    JOIN sqla_queue.queues q ON q.name = j.queue
    """
)
"""The jobs that may forbid job `:id`'s start: those of its sequence that may hold it, and the
running jobs of its queue's partition (the jobs without a partition are one partition); a
job cancelled while its handler runs holds both as a running one does. `cleans_up_from`: the
first failed job of its sequence it depends on through an on_failure 'run' edge (a clean-up
runs in its place, ahead of the jobs behind it)."""


def build_registry(recorder: Recorder) -> Registry:
    """The model's tasks, each running `behave` and recording what it did."""
    registry = Registry()

    def make(task: str) -> Any:
        def behave(ctx: JobContext, b: str, n: int) -> Any:
            run = recorder.start(ctx, task, b)
            raised: BaseException | None = None
            try:
                return _behave(ctx, b, n, recorder)
            except BaseException as exc:
                raised = exc
                raise
            finally:
                recorder.end(run, raised)

        behave.__name__ = behave.__qualname__ = task
        return behave

    def make_row(task: str) -> Any:
        def behave(ctx: JobContext, order: ModelOrder | None, b: str, n: int) -> Any:
            run = recorder.start(ctx, task, b)
            raised: BaseException | None = None
            with recorder.lock:
                seen = None if order is None else (order.id, order.version)
                recorder.row_seen[(ctx.job_id, ctx.attempt)] = seen
            try:
                if b == "touch" and order is not None:  # the row and the job's end, at once
                    with ctx.session() as session:
                        order.status = f"touched by job {ctx.job_id}"
                        session.commit()
                    return None
                return _behave(ctx, b, n, recorder)
            except BaseException as exc:
                raised = exc
                raise
            finally:
                recorder.end(run, raised)

        behave.__name__ = behave.__qualname__ = task
        kind = ModelOrder if ROW_TASKS[task]["missing"] == "cancel" else ModelOrder | None
        behave.__annotations__ = {"order": kind, "b": str, "n": int}
        return behave

    for task, options in TASKS.items():
        registry.task(name=task, pass_context=True, retry=RETRY, **options)(make(task))
    for task, row_options in ROW_TASKS.items():
        registry.task(name=task, pass_context=True, retry=RETRY, **row_options)(make_row(task))
    return registry


def _behave(ctx: JobContext, b: str, n: int, recorder: Recorder) -> Any:
    if b == "fail":
        raise RuntimeError(f"job {n} failed as asked")
    if b == "nul":
        raise RuntimeError(f"job {n} failed with a NUL \x00 in its message")
    if b == "odd":
        raise OddError(f"job {n} raised a BaseException")
    if b == "snooze":
        raise Snooze(SNOOZE_SECONDS, "asked to")
    if b == "slow":
        time.sleep(SLOW_SLEEP)
        return None
    if b == "surrogate":
        return "caf\udce9"
    if b == "nan":
        return float("nan")
    if b == "session":
        with ctx.session() as session:
            session.commit()
        return {"n": n}
    if b == "steps":
        run_steps(ctx, recorder)
        return {"n": n}
    if b == "sleep":  # asleep for SNOOZE_SECONDS, then done once that much time has passed
        ctx.sleep(timedelta(seconds=SNOOZE_SECONDS))
        return {"n": n}
    if b == "wait":  # parked until signal_key(n) comes or SNOOZE_SECONDS pass
        wait_stage(ctx, recorder, n)
        return {"n": n}
    if b == "journey":
        run_journey(ctx, recorder, n)
        return {"n": n}
    return {"n": n}


def wait_stage(ctx: JobContext, recorder: Recorder, n: int) -> None:
    """Wait for signal `signal_key(n)` (parked until it comes or `SNOOZE_SECONDS` pass) and
    record the answer: its payload, or "timed out"."""
    try:
        got = ctx.wait_for_signal(signal_key(n), timedelta(seconds=SNOOZE_SECONDS))
    except SignalTimeout:
        got = "timed out"
    with recorder.lock:
        recorder.signal_seen.setdefault(ctx.job_id, []).append(got)


JOURNEYS = (
    ("outside", "sleep", "db", "wait"),
    ("wait", "outside", "sleep", "db"),
    ("sleep", "wait", "db", "outside"),
)
"""The stages of a `journey` job of number n, `JOURNEYS[n % 3]`: its outside step, its
database-only step, a durable sleep (`NAP`) and a wait for its signal, in three orders that
put each kind of stage next to each other kind, so a worker killed between two stages
(`kill_between_steps`) falls between any two of them."""
NAP = "nap"
"""The name of a journey's sleep."""


def run_journey(ctx: JobContext, recorder: Recorder, n: int, upto: int = 4) -> None:
    """A `journey` job's first `upto` stages (`JOURNEYS`): the handler runs all four; a
    worker killed between two of them ran the first `upto` (a sleep not yet over or a wait
    that parked ends the run there, as in the handler)."""
    for stage in JOURNEYS[n % len(JOURNEYS)][:upto]:
        if stage == "outside":
            got = ctx.step("outside", recorder.outside_step, ctx.job_id, ctx.attempt)
            with recorder.lock:
                recorder.step_seen.setdefault(ctx.job_id, []).append(got)
        elif stage == "db":
            ctx.step("db", write_step_row, ctx.job_id, ctx.attempt, session=True)
        elif stage == "sleep":
            ctx.sleep(timedelta(seconds=SNOOZE_SECONDS), name=NAP)
        else:
            wait_stage(ctx, recorder, n)


STEPS = ("outside", "db")
"""A `steps` job's steps, in order."""
RECORDED_OUTSIDE = text(
    "SELECT attempt FROM sqla_queue.job_steps WHERE job_id = :j AND name = 'outside' "
    "AND status = 'done'"
)


def run_steps(ctx: JobContext, recorder: Recorder, upto: int = len(STEPS)) -> None:
    """A `steps` job's first `upto` steps: an outside step (at least once: its effect is
    counted in the ledger), then a database-only step (exactly once: its row written through
    the step's session). The handler runs both; a worker killed between two steps (the
    model's `kill_between_steps`) ran the first `upto` of them."""
    got = ctx.step("outside", recorder.outside_step, ctx.job_id, ctx.attempt)
    with recorder.lock:
        recorder.step_seen.setdefault(ctx.job_id, []).append(got)
    if upto >= 2:
        ctx.step("db", write_step_row, ctx.job_id, ctx.attempt, session=True)


def signal_key(n: int) -> str:
    """The signal a `wait` job of number `n` waits for."""
    return f"model:{n}"


STEP_ROWS = "public.model_step_rows"
"""The rows `steps` jobs write through their database-only step's session."""


def write_step_row(session: Session, job_id: int, attempt: int) -> None:
    session.execute(
        text(f"INSERT INTO {STEP_ROWS} (job_id, attempt) VALUES (:j, :a)"),
        {"j": job_id, "a": attempt},
    )


@dataclass(frozen=True)
class Row:
    """One job as observed: from `jobs`, or (archived) from `jobs_archive`."""

    id: int
    queue: str
    task: str
    status: str
    attempts: int
    max_attempts: int | None
    unique_key: bytes | None
    unique_states: int | None
    result: Any
    last_error: str | None
    locked_by: str | None
    due: bool
    age: float | None
    """Seconds since it finished, by the database clock (None: not finished)."""
    lease_left: float | None
    archived: bool = False
    partition: str | None = None
    sequence: str | None = None
    parked: str | None = None
    """While `waiting`: "signal" (parked by `ctx.wait_for_signal`), "sleep" (by
    `ctx.sleep`), or None (waiting for the jobs it depends on)."""
    due_in: float | None = None
    """Seconds until `run_at` by the database clock when observed (<= 0: due)."""
    old_archive: bool = False
    """Archived in the unpartitioned archive of releases before sqlaq_0030 (`prune` only
    empties it with `archive=True`), not in the history."""

    @property
    def held(self) -> bool:
        """Cancelled while its handler ran, and not let go of yet: it keeps its queue's
        slot, so retry, delete and prune leave it alone until its worker (or the reaper)
        clears its lease."""
        return self.status == "cancelled" and self.lease_left is not None and not self.archived

    def stable(self) -> tuple[Any, ...]:
        """The row without what changes as time passes (its age, lease, being due)."""
        return (
            self.id,
            self.queue,
            self.status,
            self.attempts,
            self.max_attempts,
            self.unique_key,
            self.result,
            self.last_error,
            self.locked_by,
            self.archived,
        )


def key_holders(row: Row, seen: Mapping[int, Row]) -> list[int]:
    """The other jobs that hold `row`'s unique key (queued or running with the same key)."""
    return [
        other.id
        for other in seen.values()
        if other.id != row.id
        and row.unique_key is not None
        and other.unique_key == row.unique_key
        and other.status in ("queued", "running")
    ]


HOLDS_SEQUENCE = ("queued", "running", "waiting", "failed")


def sequence_holders(row: Row, seen: Mapping[int, Row], skipping: set[str]) -> list[int]:
    """The jobs of `row`'s sequence that hold it: any other running (or cancelled while
    its handler runs, `Row.held`: issue 33, defect 3), and the earlier ones queued,
    waiting, or failed in a queue not in `skipping` (those whose `sequence_on_failure` is
    'skip')."""
    if row.sequence is None:
        return []
    return [
        other.id
        for other in seen.values()
        if other.sequence == row.sequence
        and other.id != row.id
        and not other.archived
        and (
            other.held
            or (
                (other.id < row.id or other.status == "running")
                and other.status in HOLDS_SEQUENCE
                and not (other.status == "failed" and other.queue in skipping)
            )
        )
    ]


def observe(conn: Connection) -> dict[int, Row]:
    """Every job of the test database by id, those in the history (or archive) too."""
    now = func.now()
    live = select(
        jobs.c.id,
        jobs.c.queue,
        jobs.c.task,
        jobs.c.status,
        jobs.c.attempts,
        jobs.c.max_attempts,
        jobs.c.unique_key,
        jobs.c.unique_states,
        jobs.c.result,
        jobs.c.last_error,
        jobs.c.locked_by,
        (jobs.c.run_at <= now).label("due"),
        func.extract("epoch", jobs.c.run_at - now).label("due_in"),
        func.extract("epoch", now - jobs.c.finished_at).label("age"),
        func.extract("epoch", jobs.c.lease_expires_at - now).label("lease_left"),
        jobs.c.partition,
        jobs.c.sequence,
        jobs.c.signal_key,
        jobs.c.deps_left,
    )
    found = {
        r.id: Row(
            r.id,
            r.queue,
            r.task,
            r.status,
            r.attempts,
            r.max_attempts,
            None if r.unique_key is None else bytes(r.unique_key),
            r.unique_states,
            r.result,
            r.last_error,
            r.locked_by,
            bool(r.due),
            None if r.age is None else float(r.age),
            None if r.lease_left is None else float(r.lease_left),
            partition=r.partition,
            sequence=r.sequence,
            parked=_parked(r),
            due_in=None if r.due_in is None else float(r.due_in),
        )
        for r in conn.execute(live)
    }
    for table in (history, archive):  # the history, and the archive of older releases
        for r in conn.execute(_finished_rows(table, now)):
            if r.id in found:
                raise AssertionError(f"job {r.id} is both in jobs and in {table.name}")
            found[r.id] = Row(
                r.id,
                r.queue,
                r.task,
                r.status,
                r.attempts,
                r.max_attempts,
                None,
                None,
                r.result,
                r.last_error,
                None,
                False,
                None if r.age is None else float(r.age),
                None,
                archived=True,
                partition=r.partition,
                sequence=r.sequence,
                old_archive=table is archive,
            )
    return found


def _finished_rows(table: Table, now: Any) -> Select[Any]:
    """The columns `observe` reads of a finished job moved out of `jobs`."""
    return select(
        table.c.id,
        table.c.queue,
        table.c.task,
        table.c.status,
        table.c.attempts,
        table.c.max_attempts,
        table.c.result,
        table.c.last_error,
        func.extract("epoch", now - table.c.finished_at).label("age"),
        table.c.partition,
        table.c.sequence,
    )


def _parked(r: Any) -> str | None:
    if r.status != "waiting":
        return None
    if r.signal_key is not None:
        return "signal"
    return "sleep" if r.deps_left is None else None


def keeper_wake(conn: Connection) -> None:
    """The keeper's wake of parked jobs: those waiting for a signal past their deadline or
    with one unread, and the sleepers whose end has come (no look-ahead)."""
    conn.execute(signal_queries.wake_waiting_jobs())
    conn.execute(step_queries.wake_sleeping_jobs(), {"ahead": 0.0})


def shift_clock(conn: Connection, seconds: float) -> None:
    """Let `seconds` pass for the queue: every timestamp it compares with now() moves back."""
    delta = func.make_interval(0, 0, 0, 0, 0, 0, seconds)
    for table, names in (
        (
            jobs,
            (
                "run_at",
                "created_at",
                "finished_at",
                "locked_at",
                "heartbeat_at",
                "lease_expires_at",
                "started_at",
            ),
        ),
        (archive, ("run_at", "created_at", "finished_at", "locked_at", "heartbeat_at")),
        (history, ("run_at", "created_at", "finished_at", "locked_at", "heartbeat_at")),
        (workers, ("started_at", "heartbeat_at", "expires_at", "loop_blocked_since")),
        (queue_starts, ("started_at",)),
        (job_steps, ("started_at", "finished_at")),
        (signal_queries.signals, ("created_at", "expires_at")),
        (signal_queries.signal_waits, ("deadline", "started_at", "resolved_at")),
    ):
        conn.execute(update(table).values({name: table.c[name] - delta for name in names}))
    conn.execute(  # a durable sleep's end, kept in its JSON result
        text(
            "UPDATE sqla_queue.job_steps SET result = jsonb_build_object('until', "
            "(result->>'until')::timestamptz - make_interval(secs => :s)) WHERE kind = 'sleep'"
        ),
        {"s": seconds},
    )


def kill_claim(
    conn: Connection, worker_id: str, limit: int, started: bool, task_max_attempts: dict[str, int]
) -> list[Any]:
    """Claim like a worker, report the handlers started (or not), and never finish."""
    conn.execute(
        queries.beat_worker(),
        {
            "worker_id": worker_id,
            "hostname": "killed",
            "pid": 0,
            "queues": None,
            "concurrency": limit,
            "stale_after": KILL_STALE_AFTER,
            "loop_blocked_for": None,
        },
    )
    rows = (
        conn.execute(
            queries.claim_jobs(None),
            {
                "worker_id": worker_id,
                "limit": limit,
                "lease": KILL_LEASE,
                "task_leases": {},
                "task_max_attempts": task_max_attempts,
            },
        )
        .mappings()
        .all()
    )
    running = [r for r in rows if r["status"] == "running"]
    if started and running:
        conn.execute(
            queries.heartbeat_jobs(),
            {
                "job_ids": [r["id"] for r in running],
                "job_attempts": [r["attempts"] for r in running],
                "job_leases": [KILL_LEASE] * len(running),
                "job_started": [True] * len(running),
            },
        )
    return list(rows)


def reaper_round(conn: Connection, task_max_attempts: dict[str, int]) -> list[Any]:
    """The reaper statement of a worker's keeper, once: the (id, queue, status) it requeued."""
    return list(
        conn.execute(queries.reap_stale_jobs(), {"task_max_attempts": task_max_attempts})
        .mappings()
        .all()
    )


@contextmanager
def no_raw_database_error(what: str) -> Iterator[None]:
    """Fail with the error if `what` ends in a raw database error."""
    try:
        yield
    except (DBAPIError, psycopg.Error) as exc:
        raise AssertionError(f"{what} ended in a raw database error: {exc}") from exc


DATABASE_TROUBLE = (
    "could not record the outcome",
    "heartbeat/reaper round failed",
)
"""Log messages of a worker that say the database refused one of its statements."""


class TroubleLog(logging.Handler):
    """Collects the worker's log records that say a statement of it was refused."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if any(str(record.msg).startswith(m) for m in DATABASE_TROUBLE):
            self.seen.append(record.getMessage())

    @contextmanager
    def watching(self) -> Iterator[None]:
        logger = logging.getLogger("sqla_queue")
        logger.addHandler(self)
        try:
            yield
        finally:
            logger.removeHandler(self)


class Clones:
    """A clone per `take`, dropped at `give_back`: for replaying one example."""

    def __init__(self, databases: Any) -> None:
        self.databases = databases

    def take(self) -> str:
        return str(self.databases.clone())

    def give_back(self, url: str) -> None:
        self.databases.drop(url)

    def close(self) -> None:
        pass


class ClonePool:
    """Fresh clones of the template made ahead, in a thread, and dropped in another: a
    clone or a drop takes from 0.1 s to 2 s on a busy machine, an example's steps less.
    Each example still gets a database of its own, used once."""

    def __init__(self, databases: Any, ahead: int = 2) -> None:
        self.databases = databases
        self._ready: queue.Queue[str] = queue.Queue(maxsize=ahead)
        self._drops: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self._maker = threading.Thread(target=self._make, daemon=True)
        self._dropper = threading.Thread(target=self._drop, daemon=True)
        self._maker.start()
        self._dropper.start()

    def _make(self) -> None:
        while not self._stop.is_set():
            url = self.databases.clone()
            self._ready.put(url)

    def _drop(self) -> None:
        while (url := self._drops.get()) is not None:
            self.databases.drop(url)

    def take(self) -> str:
        return self._ready.get(timeout=120)

    def give_back(self, url: str) -> None:
        self._drops.put(url)

    def close(self) -> None:
        self._stop.set()
        while self._maker.is_alive():
            with contextlib.suppress(queue.Empty):
                self._drops.put(self._ready.get(timeout=0.1))
        while not self._ready.empty():
            self._drops.put(self._ready.get())
        self._drops.put(None)
        self._dropper.join(300)


def engine_for(url: str) -> Engine:
    from sqlalchemy import create_engine

    return create_engine(url, pool_size=4, max_overflow=8)


def check(state: QueueMachine) -> None:
    """Every invariant of the state machine, as it runs them after each step."""
    state.holds()
    state.workflows_hold()
    state.turns_hold()
    state.progresses()
    state.steps_hold()
    state.parked_jobs_hold_nothing()
    state.signals_hold()
    state.rows_hold()


def replay(state: QueueMachine, *steps: tuple[str, dict[str, Any]]) -> None:
    """Run each (rule, arguments), then the invariants, as the state machine does."""
    check(state)
    for name, arguments in steps:
        getattr(state, name)(**arguments)
        check(state)
