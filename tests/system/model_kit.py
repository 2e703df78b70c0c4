"""Support for the model-based test of the queue (tests/system/test_model.py).

- `Recorder`: what handlers did, written by the handlers themselves: one `Run` per
  (job, attempt), with the behaviour asked for, how the handler ended and when, and the
  violations seen at a handler's start (a second run of one attempt, a queue's or the
  worker's limit exceeded, a paused queue's job started, a job of a sequence started while
  another of its sequence runs or an earlier one holds it, a partition's limit exceeded:
  those two read the database at the start);
- `build_registry`: the tasks of the model, all one handler that behaves as its job's
  args say (`b`: ok, fail, nul, odd, snooze, slow, surrogate, nan, session);
- `observe`: every job row (jobs and the archive) as a plain `Row`;
- `shift_clock`: the test's clock. Time passes by moving every timestamp of the test
  database back by so many seconds (run_at, finished_at, leases, worker registrations,
  rate windows): to the queue, whose every decision compares a timestamp with the
  database's now(), that is the clock moving forward. It is test manipulation of the data
  (like drain's `include_scheduled`), never a mock;
- `kill_claim`: what a worker killed with SIGKILL leaves behind, in process: the worker's
  own claim statement under a worker id of its own (registered, like a real worker, with
  the worker's registration statement), optionally the heartbeat that reports the handler
  started, then the connection goes away without finishing anything;
- `reaper_round`: one round of the reaper, the statement every worker's keeper runs.
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
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, func, select, text, update
from sqlalchemy.exc import DBAPIError

from sqla_queue import JobContext, Registry, RetryPolicy, Snooze
from sqla_queue.db import queries
from sqla_queue.db.queries.common import archive, jobs, queue_starts, workers

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
    "plain": ("ok", "fail", "nul", "odd", "snooze"),
    "kept": ("ok", "fail", "snooze", "surrogate", "nan", "session"),
    "timed": ("ok", "fail", "slow"),
}
"""What a job of each task may be asked to do (its `b` argument)."""


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
    lock: threading.Lock = field(default_factory=threading.Lock)

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
                return _behave(ctx, b, n)
            except BaseException as exc:
                raised = exc
                raise
            finally:
                recorder.end(run, raised)

        behave.__name__ = behave.__qualname__ = task
        return behave

    for task, options in TASKS.items():
        registry.task(name=task, pass_context=True, retry=RETRY, **options)(make(task))
    return registry


def _behave(ctx: JobContext, b: str, n: int) -> Any:
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
    return {"n": n}


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
    """Every job of the test database by id, the archived ones too."""
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
        func.extract("epoch", now - jobs.c.finished_at).label("age"),
        func.extract("epoch", jobs.c.lease_expires_at - now).label("lease_left"),
        jobs.c.partition,
        jobs.c.sequence,
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
        )
        for r in conn.execute(live)
    }
    archived = select(
        archive.c.id,
        archive.c.queue,
        archive.c.task,
        archive.c.status,
        archive.c.attempts,
        archive.c.max_attempts,
        archive.c.result,
        archive.c.last_error,
        func.extract("epoch", now - archive.c.finished_at).label("age"),
        archive.c.partition,
        archive.c.sequence,
    )
    for r in conn.execute(archived):
        if r.id in found:
            raise AssertionError(f"job {r.id} is both in jobs and in the archive")
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
        )
    return found


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
        (workers, ("started_at", "heartbeat_at", "expires_at", "loop_blocked_since")),
        (queue_starts, ("started_at",)),
    ):
        conn.execute(update(table).values({name: table.c[name] - delta for name in names}))


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
