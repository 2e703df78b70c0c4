"""A stateful, model-based test of the queue: Hypothesis drives the real queue on the real
PostgreSQL through its public API, and a plain-Python model says after each step what
must hold.

Each example gets a database of its own, cloned from the session's migrated template in
the machine's `__init__` and dropped in `teardown`, with one engine for the example.

Rules: enqueue (plain, unique by a key from a two-letter alphabet, delayed, with a
max_attempts, into a keeping, archiving or concurrency-limited queue, with a kept result; by
`enqueue` on a Connection, `Task.enqueue` on a Session, or `enqueue_many`; unique with
`on_conflict` replace or replace_args: debounce and throttle); a worker step (a real
burst-mode `Worker`, `sqla_queue.testing.run_until_empty`, with handlers chosen by the job's
args: they succeed, fail, raise with a NUL in the message, raise a BaseException, snooze,
overrun their timeout, return what jsonb refuses (a lone surrogate, NaN), commit through
`ctx.session()`, run durable steps (an outside step counted in a ledger, a database-only
step through its session), sleep durably (`ctx.sleep`: parked, woken by a keeper's look once
time has passed), wait for a signal (`ctx.wait_for_signal`, its payload or its timeout
recorded), or run a journey of all four (an outside step, a database-only step, a sleep and
a wait, in three orders, `model_kit.JOURNEYS`)); send a wait job's signal in a transaction
committed or rolled back (before its wait, while it is parked, or after its answer); a
keeper's wake of parked jobs; kill a worker (the worker's claim statement under a worker id
of its own, optionally reporting the handler started, then the connection goes away without
finishing), or kill it between any two steps, sleeps or waits of its durable handlers (each
ran its first stages, recorded, a wait parked or answered, then nothing more: no outcome
written); a reaper round; cancel, retry, delete, prune, pause/resume, concurrency and rate
limits, result TTLs; `wait_for(timeout=0)`; time passing; enqueue with `depends_on` (1-3
jobs still in the table or the history, each edge on_failure 'cancel' or 'run'), whose
parents then run, fail, are cancelled, retried or deleted by the rules above; bulk retry,
cancel and delete by a filter of queue, task and status (tests/system/model_bulk.py: exactly
the matching jobs change); jobs with a partition, a sequence and a priority (issue 24), and
queue settings: fair, partition_limit 1 or 2, aging, and sequence_on_failure hold or skip
("keep" starts fair); jobs taking an ORM row (issue 37: `enqueue_row`, by the typed call or
a typed row of `enqueue_many`, on a row of the table or one created in the same transaction,
committed or rolled back with the job; two row tasks, missing 'cancel' / changed 'run' and
missing 'none' / changed 'skip'; their handlers succeed, fail, or touch the row in
`ctx.session()`, committed with the job's end), and the rows changed, deleted and created
again between enqueue and claim (`change_row`).

Time: the test controls the queue's clock by moving every timestamp of the test database
back (`model_kit.shift_clock`): delayed jobs and retries become due, leases and worker
registrations expire, kept results and finished jobs age. That is test manipulation of the
data, not a mock: the queue's every decision compares a timestamp with PostgreSQL's now().
Retries wait a minute and snoozes 30 s, so nothing becomes due inside a worker step.

What must hold (checked after each step; a rule checks what its own command promised):
- no committed job lost: every job enqueued is in jobs or the history, or was removed by
  something the model knows removes it (a success in a deleting queue, delete, prune, a
  kept result's TTL);
- a job runs at most once per attempt (the handlers record (job, attempt));
- a job's handler runs no more often than its attempts allow, refunds aside (a snooze, a
  killed worker's unstarted claim, a retry's fresh budget);
- a unique enqueue returns the job that holds its key, if one does, and writes nothing;
  with `on_conflict` replace, a holder that has not started takes the new args, and a
  running one is never touched (it lets its key go; the duplicate is a new job);
- a queue's concurrency limit and the worker's are never exceeded by executing handlers;
  a paused queue's job never starts; only due, queued jobs start;
- a worker that returns has written the outcome of every job it claimed, and the outcome
  its handler asked for; a burst worker leaves no due job it could have run;
- every admin command does what it says or names the job it left alone;
- durable steps (issue 36): a database-only step's row exists at most once, written by the
  attempt its record names, and exactly once for a job whose handler finished; every run
  of a job got the same result from its outside step, one an attempt that ran it recorded
  (a finished job's ran at least once); a recorded step never runs again (a retry after a
  kill between two stages resumes after the last recorded one); a durable job's handler
  finishes at most once; a sleeping or waiting job is parked (`waiting`)
  and spends no attempt, and no parked job holds a slot (no worker, no lease);
- signals (issue 36): every run of a waiting job gets the same answer, a payload of a
  committed signal of its key (never a rolled-back one), or its timeout; a committed
  signal wakes its parked waiter in the sender's transaction, a rolled-back one changes
  nothing; a committed signal is never lost (consumed by its waiter or still in the
  mailbox); after a keeper's wake no sleeper past its end and no wait past its deadline
  (or with a signal unread) is still parked;
- ORM rows (issue 37): a row handler got its own row and no other, as it was at the load,
  or None only under missing='none' with the row gone; a changed='skip' job ran only with
  its enqueue's version; a job claimed while its row was gone (missing='cancel') or changed
  (changed='skip') ended cancelled naming the row, its handler never called; each touch
  that returned changed its row once, committed with its job (the table read after each
  step); every job about a row is a row job about its own row;
- no command ends in a raw database error, and no worker statement is refused;
- workflows: a job runs only once each parent has succeeded (or, through a 'run' edge,
  ended), a parent run in the same step having ended first; a waiting job's deps_left is
  the number of its parents not yet ended as it needs, never 0 (the last end makes it due
  in its own transaction); a job whose 'cancel' parent failed or was cancelled is
  cancelled (or, retried itself, waits for that parent to be retried);
- partitions and sequences (issue 24): no two jobs of one sequence run at once (running rows
  after each step; handlers executing at a handler's start); a job of a sequence starts
  only when no earlier job of its sequence is queued, running, waiting or failed in a 'hold'
  queue (read from the database at the handler's start, and of a killed worker's claim); a
  partition never runs more jobs than its queue's partition_limit (running rows after each
  step, unless they ran when the limit was lowered; the database at a handler's start; a
  killed worker's claim); in a fair queue, a killed worker's claim gives a partition its
  k-th job only if no partition left with a claimable job had fewer than k - 1 running and
  taken (weights are all 1); a `replace`/`replace_args` enqueue never touches a running
  holder's args or run_at. The three defects of the claim it found are fixed
  (`KNOWN_DEFECTS`).

Progress (issue 33), beside safety, after each step (`progresses`, tests/system/model_liveness.py):
no session of the test database is left in a transaction (row locks) after the call that
opened it returned; a due job that no rule blocks (its sequence, its partition's limit, a
pause, a dependency, its queue's max-running or rate) is claimable by an idle worker
serving its queue: each of up to 3 claims of one job (on a scratch transaction rolled back)
returns one while the model says one is claimable; and every admin command and replacing
enqueue returns within tests/helpers/races.py's deadline (`_ends`), else the test fails naming what
each session waits on.

Races (issue 33, tests/system/model_races.py): a rule holds one transaction after its statements
(a worker's claim, a replacing enqueue, a cancel, a retry, a worker's finish, an enqueue with
depends_on) while another command (the same kinds, or a delete) runs beside it on the same
jobs, then commits or rolls back the held one; the other must return within the deadline,
and the model takes what both did before every invariant runs.

The stress run (tests/system/test_model_stress.py, slow) checks the same invariants on the final
state of 4 real worker processes, SIGKILLed and restarted, with every feature at once.

Profiles (tests/conftest.py): "default" (short, in the README's fast test run) and
"long" (`SQLA_QUEUE_HYPOTHESIS_PROFILE=long`; `test_queue_model_long` runs it under the
slow marker, in `.ci/run`). Failing examples are kept as tests in
tests/system/test_model_regressions.py.
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import itertools
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import pytest
from helpers.races import DEADLINE, Race
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import (
    Dependency,
    JobContext,
    JobFailedError,
    ResultMissingError,
    ResultTimeoutError,
    SqlaQueueError,
    Unique,
    WorkerConfig,
    admin,
    enqueue,
    enqueue_many,
    wait_for,
)
from sqla_queue.admin import partitions
from sqla_queue.db.models import DEFAULT_MAX_ATTEMPTS
from sqla_queue.enqueue.signals import receive_on
from sqla_queue.errors import Sleeping, WaitingForSignal
from sqla_queue.testing import TemplateDatabases, run_until_empty
from sqla_queue.worker.steps import EngineJournal
from system.model_bulk import BulkRules
from system.model_kit import (
    BEHAVIOURS,
    KILL_LEASE,
    KILL_STALE_AFTER,
    ROW_BEHAVIOURS,
    ROW_TABLE,
    ROW_TASKS,
    STEP_ROWS,
    TASKS,
    ClonePool,
    Clones,
    ModelOrder,
    ModelRowBase,
    Recorder,
    Row,
    Run,
    TroubleLog,
    build_registry,
    engine_for,
    keeper_wake,
    key_holders,
    kill_claim,
    no_raw_database_error,
    observe,
    reaper_round,
    run_journey,
    run_steps,
    sequence_holders,
    shift_clock,
    signal_key,
)
from system.model_liveness import Rules, Stall, leftover_transactions, stalled_claims
from system.model_races import BESIDE, HELD, Draw, RaceRules

T = TypeVar("T")

QUEUES = {"default": "delete", "keep": "keep", "arch": "archive", "lim": "delete"}
"""The model's queues and their retention ("lim" starts with a concurrency limit of 1)."""
HUGE_TTL = 99999999999999 * 7 * 86400.0
"""`--result-ttl 99999999999999w` in seconds."""
OVERDUE_PARKED = """
SELECT j.id FROM sqla_queue.jobs j
WHERE j.status = 'waiting' AND (
    (j.signal_key IS NULL AND j.deps_left IS NULL AND j.run_at <= now())
    OR (j.signal_key IS NOT NULL AND (j.run_at <= now() OR EXISTS (
        SELECT 1 FROM sqla_queue.signals s
        WHERE s.key = j.signal_key AND s.expires_at > now() AND s.wake = 'one'))))
"""
"""Parked jobs the keeper's wake must have queued: sleepers past their end, waits past their
deadline or with an unread signal of their key."""
PARKED_WITH_MAIL = """
SELECT j.id, j.signal_key FROM sqla_queue.jobs j
WHERE j.status = 'waiting' AND j.signal_key IS NOT NULL AND EXISTS (
    SELECT 1 FROM sqla_queue.signals s
    WHERE s.key = j.signal_key AND s.expires_at > now() AND s.wake = 'one')
"""
"""Jobs parked for a signal whose key has one unread: a wait takes a signal sent before it
instead of parking, and a signal committed while a job is parked wakes it in its sender's
transaction, so none may exist between two rules (progress: a woken job is due)."""
SLACK = 3.0
"""Seconds of wall time a step may take: ages compared across steps allow this much."""
UNIQUE_STATUSES = ("queued", "running", "waiting")
"""Where a job of the default unique states holds its key: queued and running, and waiting,
which counts as queued (a workflow's dependent; a job parked for a signal or a sleep)."""
ENDED = ("done", "failed", "cancelled")
ROW_OK: tuple[str, str, int | None, bool] = ("row", "ok", 0, True)
"""`enqueue`'s row job when a replay gives none (`via` "row" only)."""
KEPT_DONE = ("finished (retention delete)", "result expired")
"""Reasons a job is gone after it succeeded."""


def _gone_as(reason: str, last: Row | None) -> str:
    """How a removed job ended, as the jobs that depend on it count it: done when its
    success removed it; a job deleted before it ended counts as cancelled."""
    if reason in KEPT_DONE:
        return "done"
    return last.status if last is not None and last.status in ENDED else "cancelled"


def _counts_as_ended(outcome: str | None, on_failure: str) -> bool:
    """Whether an edge's parent, ended as `outcome` (None: not ended), lets its child run."""
    return outcome == "done" or (on_failure == "run" and outcome is not None)


task_and_behaviour = st.sampled_from(
    [(task, b) for task, behaviours in BEHAVIOURS.items() for b in behaviours]
)
edge_kinds = st.lists(st.sampled_from(["cancel", "run"]), min_size=3, max_size=3)
job_spec = st.fixed_dictionaries(
    {
        "tb": task_and_behaviour,
        "queue": st.sampled_from(sorted(QUEUES)),
        "letter": st.sampled_from([None, "a", "b"]),
        "delay": st.sampled_from([None, None, 30.0, 3600.0]),
        "max_attempts": st.sampled_from([None, None, 1, 3]),
        "partition": st.sampled_from([None, "p1", "p2", "p3"]),
        "sequence": st.sampled_from([None, None, "s1", "s2", "s3"]),
        "priority": st.sampled_from([None, None, 0, 3]),
    }
)
durable_spec = st.fixed_dictionaries(
    {
        **{key: st.just(None) for key in ("letter", "delay", "max_attempts", "priority")},
        "tb": st.sampled_from(
            [
                ("plain", "steps"),
                ("kept", "steps"),
                ("plain", "sleep"),
                ("plain", "wait"),
                ("plain", "journey"),
                ("kept", "journey"),
            ]
        ),
        "queue": st.sampled_from(sorted(QUEUES)),
        "partition": st.sampled_from([None, "p1"]),
        "sequence": st.sampled_from([None, "s1"]),
    }
)
picks = st.lists(st.integers(0, 40), min_size=1, max_size=3)
queue_names = st.sampled_from(sorted(QUEUES))
TURN_SETTINGS = {
    "fair": partitions.set_fair,
    "partition_limit": partitions.set_partition_limit,
    "aging": partitions.set_aging,
    "sequence_on_failure": partitions.set_sequence_on_failure,
}
turn_settings = st.sampled_from(
    [
        ("fair", True),
        ("fair", False),
        ("partition_limit", 1),
        ("partition_limit", 2),
        ("partition_limit", None),
        ("aging", 1.0),
        ("aging", None),
        ("sequence_on_failure", "skip"),
        ("sequence_on_failure", "hold"),
    ]
)
TALLY: collections.Counter[str] = collections.Counter()
"""What a run of the model did: examples, steps, races, scratch claims, excused stalls
(printed at its end: `pytest -s`)."""
FAIR = ("keep",)
"""The queues that start fair (`take_turns` changes any queue's settings)."""
KNOWN_DEFECTS: frozenset[str] = frozenset()
"""Defects the model found and excuses, narrowly, until they are fixed (each with a replay
in tests/system/test_model_regressions.py that runs without the excuse, a strict xfail while the
defect lives: when its fix merges, the xfail fails; remove the mark and the name here).
None is open. Issue 33's two are fixed: "held-sequence starvation" (defect 2: a fair claim
read the least served partitions only, and those whose due jobs all waited behind a failed
job of their sequence filled it; the progress check found it) and "cancel frees turns"
(defect 3: a job cancelled while its handler ran, `Row.held`, no longer held its sequence
or its partition's slot; the claim's check found it). Issue 24's three are fixed:
"overtaking retry" (a job of a sequence retried while a later one ran was claimable),
"fair starvation" (a
partition with only a delayed job took a fair claim's whole share) and "fair truncation" (a
claim over several queues cut a fair queue's turns by age); their excuses stay, unused,
should one come back."""


@dataclass
class Model:
    """What the model knows of one enqueued job."""

    id: int
    task: str
    queue: str
    behaviour: str
    n: int
    letter: str | None
    budget: int
    spent: int = 0
    removed: str | None = None
    gone_as: str | None = None
    """How a removed job had ended, as its dependents count it (see `_gone_as`)."""
    row: int | None = None
    """A row task's job: the id of the `ModelOrder` it takes (and is about)."""
    row_version: int | None = None
    """The row's version when the job was enqueued."""


@dataclass
class Orphan:
    """A job a killed worker holds: running until reaped (or cancelled)."""

    attempt: int
    lease_left: float = KILL_LEASE
    stale_left: float = KILL_STALE_AFTER
    born: float = field(default_factory=time.monotonic)
    """When its claim began (time.monotonic, read before the claim): the database's clock runs
    on in real time too (a slow step under load can let the 6 s of a registration pass without
    any `time_passes`)."""
    settled: float = field(default_factory=time.monotonic)
    """When its claim had returned: the database's lease and registration began between
    `born` and this, so the reaper may take it from `born` on and must from this on."""

    @property
    def reapable_from(self) -> float:
        """The earliest moment (time.monotonic) from which the reaper may requeue it."""
        return self.born + min(self.lease_left, self.stale_left)

    def reapable_at(self, moment: float) -> bool:
        """The reaper may have requeued it by `moment`."""
        return moment >= self.reapable_from

    def surely_reapable_at(self, moment: float) -> bool:
        """The reaper must requeue it by `moment`."""
        return moment >= self.settled + min(self.lease_left, self.stale_left)

    @property
    def reapable(self) -> bool:
        """The reaper may have requeued it by now (so a worker may have run it again)."""
        return self.reapable_at(time.monotonic())


SNOOZES = ("Snooze", "Sleeping", "WaitingForSignal")
"""What a handler raises to end its run without spending an attempt: queued again after a
delay, or parked (a durable sleep, a wait for a signal)."""
PARKS = {"Sleeping": "sleep", "WaitingForSignal": "signal"}
"""What parks a job, and how its row says so (`Row.parked`)."""
SUCCEEDS = ("ok", "session", "steps", "sleep", "wait", "journey", "touch")
"""The behaviours whose handler, when it returns, succeeds (a deleting queue removes the job)."""
DURABLE = ("steps", "journey")
"""The behaviours whose handler runs durable steps (`steps_hold`)."""
SIGNALLED = ("wait", "journey")
"""The behaviours whose handler waits for its signal, `signal_key(n)`."""
SIGNAL_EXPIRY = 3650 * 86400.0
"""The model's signals never expire: a committed one is consumed or still in the mailbox."""


class QueueMachine(BulkRules, RaceRules, RuleBasedStateMachine):
    pool: ClassVar[ClonePool | Clones | None] = None
    excused: frozenset[str] = KNOWN_DEFECTS

    def __init__(self) -> None:
        super().__init__()
        assert self.pool is not None, "run it with run_model"
        self.url = self.pool.take()
        TALLY["examples"] += 1
        self.tally = TALLY
        self.engine = engine_for(self.url)
        self.races = Race(self.engine)
        self.recorder = Recorder(engine=self.engine)
        self.registry = build_registry(self.recorder)
        self.trouble = TroubleLog()
        self.jobs: dict[int, Model] = {}
        self.concurrency: dict[str, int | None] = dict.fromkeys(QUEUES)
        self.concurrency["lim"] = 1
        self.rated: set[str] = set()
        self.paused: set[str] = set()
        self.ttl = dict.fromkeys(QUEUES, 86400.0)
        self.orphans: dict[int, Orphan] = {}
        self.fair = set(FAIR)
        self.partition_limit: dict[str, int | None] = dict.fromkeys(QUEUES)
        self.skipping: set[str] = set()
        """The queues whose sequence_on_failure is 'skip'."""
        self.aging: set[str] = set()
        self.overtaken: set[int] = set()
        """Jobs retried while a later job of their sequence ran ("overtaking retry")."""
        self.grandfathered: dict[str, set[tuple[int, int]]] = {q: set() for q in QUEUES}
        """Per queue, the (job, attempt) running when its partition limit was last set: they
        may keep a partition over a lowered limit."""
        self.parents: dict[int, list[tuple[int, str]]] = {}
        """Workflows: each dependent's parents, with their edges' on_failure."""
        self.numbers = itertools.count(1)
        self.sent: dict[str, list[int]] = {}
        """Per signal key, the payloads (`{"s": k}`) of the signals committed."""
        self.rolled_back: set[int] = set()
        """The payloads of signals sent in a transaction rolled back."""
        self.signals = itertools.count(1)
        self.steps = 0
        self.task_max_attempts = {
            t: int(o["max_attempts"]) for t, o in (*TASKS.items(), *ROW_TASKS.items())
        }
        self.row_versions: dict[int, int | None] = {1: 1, 2: 1}
        """Each `ModelOrder`'s version as the model knows it (None: deleted)."""
        with self.engine.begin() as conn:
            ModelRowBase.metadata.create_all(conn)
            conn.execute(  # ids 1 and 2 from the key's sequence, as a new row's next
                text(f"INSERT INTO {ROW_TABLE} (status, version) VALUES ('new', 1), ('new', 1)")
            )
            for name, retention in QUEUES.items():
                if name != "default":
                    admin.create_queue(conn, name, retention)
            admin.set_max_running(conn, "lim", 1)
            for name in FAIR:
                partitions.set_fair(conn, name, True)
            conn.execute(text(f"CREATE TABLE {STEP_ROWS} (job_id bigint, attempt int)"))
        self.seen: dict[int, Row] = self._observe()
        self.seen_at = self.observed_at

    def teardown(self) -> None:
        self.races.__exit__(None, None, None)
        self.engine.dispose()
        assert self.pool is not None
        self.pool.give_back(self.url)

    # -- helpers --------------------------------------------------------------------------

    def _ends(self, what: str, call: Callable[[], T]) -> T:
        """Run an admin command (or an enqueue) on a thread of its own: it must return
        within `DEADLINE` seconds, else the test fails naming what each session waits on."""
        with no_raw_database_error(what):
            return self.races.beside(call, what).result(DEADLINE)

    def _admin(self, what: str, command: Callable[[Connection], T]) -> T:
        """`command` in a transaction of its own, committed, under `_ends`'s deadline."""

        def call() -> T:
            with self.engine.begin() as conn:
                return command(conn)

        return self._ends(what, call)

    def _observe(self) -> dict[int, Row]:
        self.observed_at = time.monotonic()  # before the database's clock is read
        with no_raw_database_error("observing the jobs"), self.engine.connect() as conn:
            return observe(conn)

    def _ids(self, indices: list[int]) -> list[int]:
        ids = sorted(self.jobs)
        return sorted({ids[i % len(ids)] for i in indices})

    def _holder(self, task: str, queue: str, letter: str, seen: Mapping[int, Row]) -> int | None:
        for job in self.jobs.values():
            row = seen.get(job.id)
            if (
                row is not None
                and job.letter == letter
                and job.task == task
                and job.queue == queue
                and row.status in UNIQUE_STATUSES
                and row.unique_key is not None  # a running holder may have let it go
            ):
                return job.id
        return None

    def _settle(
        self, after: dict[int, Row], why: str, gone_ok: Callable[[int], str | None]
    ) -> None:
        """Take the new observation: every job that is gone must be explained."""
        unknown = sorted(set(after) - set(self.jobs))
        assert not unknown, f"after {why}: jobs {unknown} exist that were never enqueued"
        for job in self.jobs.values():
            if job.removed is None and job.id not in after:
                reason = gone_ok(job.id)
                last = self.seen.get(job.id)
                assert reason is not None, (
                    f"after {why}: job {job.id} ({job.task} {job.behaviour} in {job.queue}, "
                    f"last seen {last.status if last else 'never'}) is gone and nothing "
                    "that removes jobs removed it: a committed job was lost"
                )
                job.removed = reason
                job.gone_as = _gone_as(reason, last)
            elif job.removed is not None and job.id in after:
                raise AssertionError(f"after {why}: job {job.id} was {job.removed} but is back")
        for row in after.values():
            last = self.seen.get(row.id)
            retried = last is not None and last.status in ("failed", "cancelled")
            if row.sequence and retried and row.status in ("queued", "waiting"):
                later = [
                    o.id
                    for o in after.values()
                    if o.sequence == row.sequence and o.id > row.id and o.status == "running"
                ]
                if later and "overtaking retry" in self.excused:
                    self.overtaken.add(row.id)
        for job_id in list(self.orphans):
            row = after.get(job_id)
            if (
                row is None
                or row.status != "running"
                or row.attempts != self.orphans[job_id].attempt
            ):
                del self.orphans[job_id]
        self.seen = after
        self.seen_at = self.observed_at  # when `after` was read, at the latest

    def _expired_result(self, job_id: int, elapsed: float) -> bool:
        """Whether the reaper may have deleted the job's kept result (its TTL passed)."""
        row, job = self.seen.get(job_id), self.jobs[job_id]
        if QUEUES[job.queue] != "delete" or self.ttl[job.queue] > 1e12:
            return False
        if row is not None and row.status == "done" and row.result is not None:
            return (row.age or 0) + elapsed + SLACK >= self.ttl[job.queue]
        return self.ttl[job.queue] <= elapsed + SLACK  # finished during the step

    def _effective_max(self, row: Row) -> int:
        return row.max_attempts or self.task_max_attempts.get(row.task) or DEFAULT_MAX_ATTEMPTS

    # -- enqueue --------------------------------------------------------------------------

    def _new(self, spec: dict[str, Any]) -> tuple[dict[str, Any], Model]:
        task, behaviour = spec["tb"]
        n = next(self.numbers)
        budget = spec["max_attempts"] or TASKS[task]["max_attempts"] or DEFAULT_MAX_ATTEMPTS
        model = Model(0, task, spec["queue"], behaviour, n, spec["letter"], budget)
        options: dict[str, Any] = {"queue": spec["queue"]}
        if spec["letter"] is not None:
            options["unique"] = Unique(args=[], key=spec["letter"])
        if spec["delay"] is not None:
            options["delay"] = spec["delay"]
        if spec["max_attempts"] is not None:
            options["max_attempts"] = spec["max_attempts"]
        for name in ("partition", "sequence", "priority"):
            if spec.get(name) is not None:
                options[name] = spec[name]
        return {"task": task, "args": {"b": behaviour, "n": n}, **options}, model

    def _record(
        self, model: Model, job_id: int, duplicate: bool, holder: int | None, after: dict[int, Row]
    ) -> None:
        if holder is not None:
            ok = duplicate and job_id == holder
            assert ok, (
                f"a unique enqueue ({model.task}, {model.queue}, key {model.letter!r}) returned "
                f"job {job_id} (duplicate={duplicate}) while job {holder} holds the key"
            )
            return
        ok = not duplicate and job_id not in self.jobs
        assert ok, (
            f"enqueue returned job {job_id} (duplicate={duplicate}) though no job held its key"
        )
        ok = job_id in after and after[job_id].status == "queued"
        assert ok, f"job {job_id} was enqueued and committed but is {after.get(job_id)}"
        model.id = job_id
        self.jobs[job_id] = model

    @rule(
        spec=job_spec,
        via=st.sampled_from(["connection", "task", "typed", "row"]),
        taking=st.tuples(
            st.sampled_from(sorted(ROW_TASKS)),
            st.sampled_from(ROW_BEHAVIOURS),
            st.none() | st.integers(0, 40),
            st.booleans(),
        ),
    )
    def enqueue(
        self, spec: dict[str, Any], via: str, taking: tuple[str, str, int | None, bool] = ROW_OK
    ) -> None:
        """An enqueue; through `enqueue_row` for `via` "row" (the job takes a row, as
        `taking` says: its task, behaviour, row and whether it commits), so that a random
        run meets rows as often as the other enqueues."""
        if via == "row":
            task, behaviour, pick, commit = taking
            self.enqueue_row(task, behaviour, pick, spec["queue"], "typed", commit)
            return
        row, model = self._new(spec)
        holder = None
        if model.letter is not None:
            holder = self._holder(model.task, model.queue, model.letter, self.seen)
        with no_raw_database_error("enqueue"):
            if via == "connection":
                with self.engine.begin() as conn:
                    job_id = enqueue(
                        conn, row.pop("task"), row.pop("args"), registry=self.registry, **row
                    )
                duplicate = holder is not None and job_id == holder
            elif via == "typed":  # the typed call: the handler's own parameters, options apart
                task = self.registry[row.pop("task")]
                args = row.pop("args")
                with Session(self.engine) as session, session.begin():
                    job = task.using(**row).defer(session, b=args["b"], n=args["n"])
                    session.flush()
                    job_id, duplicate = job.id, job.duplicate
            else:
                task = self.registry[row.pop("task")]
                with Session(self.engine) as session, session.begin():
                    job = task.enqueue(session, row.pop("args"), flush=True, **row)
                    job_id, duplicate = job.id, job.duplicate
        after = self._observe()
        self._record(model, job_id, duplicate, holder, after)
        self._settle(after, "enqueue", lambda _: None)

    @rule(spec=durable_spec)
    def enqueue_durable(self, spec: dict[str, Any]) -> None:
        """A job that runs durable steps or sleeps, due at once (the rules above draw them
        among every behaviour, rarely)."""
        self.enqueue(spec, "connection")

    @rule(
        task=st.sampled_from(sorted(ROW_TASKS)),
        behaviour=st.sampled_from(ROW_BEHAVIOURS),
        pick=st.none() | st.integers(0, 40),
        queue=queue_names,
        via=st.sampled_from(["typed", "many"]),
        commit=st.booleans(),
    )
    def enqueue_row(
        self,
        task: str,
        behaviour: str,
        pick: int | None,
        queue: str,
        via: str,
        commit: bool,
    ) -> None:
        """A job taking an ORM row (issue 37), by the typed call or a typed row of
        `enqueue_many`: one of the rows, or (`pick` None) a row created in the same
        transaction, committed or rolled back with the job."""
        n = next(self.numbers)
        call = self.registry[task].using(queue=queue)
        with no_raw_database_error("enqueue with a row"), Session(self.engine) as session:
            if pick is None:
                order = ModelOrder()
                session.add(order)
                session.flush()
            else:
                ids = sorted(self.row_versions)
                found = session.get(ModelOrder, ids[pick % len(ids)])
                if found is None:  # a deleted row: there is no instance to pass
                    return
                order = found
            if via == "typed":
                job = call.defer(session, order, b=behaviour, n=n)
                session.flush()
                job_id = job.id
                assert job.about == f"{ROW_TABLE}:{order.id}", f"{job} is about {job.about}"
            else:
                (job_id,) = enqueue_many(
                    session, [call.row(order, b=behaviour, n=n)], registry=self.registry
                )
            row_id, version = order.id, order.version
            if commit:
                session.commit()
            else:
                session.rollback()
        after = self._observe()
        if not commit:
            assert job_id not in after, f"job {job_id} was rolled back but is {after[job_id]}"
            if pick is None:
                with self.engine.connect() as conn:
                    kept = conn.execute(
                        text(f"SELECT count(*) FROM {ROW_TABLE} WHERE id = :id"), {"id": row_id}
                    ).scalar_one()
                assert kept == 0, f"row {row_id} was rolled back with its job but is there"
            self._settle(after, "a rolled-back enqueue with a row", lambda _: None)
            return
        budget = int(ROW_TASKS[task]["max_attempts"])
        model = Model(job_id, task, queue, behaviour, n, None, budget, row=row_id)
        model.row_version = version
        ok = job_id not in self.jobs and job_id in after and after[job_id].status == "queued"
        assert ok, f"job {job_id} was enqueued with a row and committed but is {after.get(job_id)}"
        self.jobs[job_id] = model
        if pick is None:
            self.row_versions[row_id] = version
        TALLY["row jobs enqueued"] += 1
        self._settle(after, "enqueue with a row", lambda _: None)

    @rule(pick=st.integers(0, 40), change=st.sampled_from(["change", "delete", "recreate"]))
    def change_row(self, pick: int, change: str) -> None:
        """A row the row tasks take changes (its version goes up), is deleted, or is created
        again under its id (version 1), between enqueue and claim."""
        ids = sorted(self.row_versions)
        row_id = ids[pick % len(ids)]
        known = self.row_versions[row_id]
        with (
            no_raw_database_error(f"a row's {change}"),
            Session(self.engine) as session,
            session.begin(),
        ):
            order = session.get(ModelOrder, row_id)
            now = None if order is None else order.version
            assert now == known, f"row {row_id} has version {now}; the model says {known}"
            if change == "change" and order is not None:
                order.status = f"changed from version {order.version}"
                session.flush()
                known = order.version
            elif change == "delete" and order is not None:
                session.delete(order)
                known = None
            elif change == "recreate" and order is None:
                session.add(ModelOrder(id=row_id))
                known = 1
        self.row_versions[row_id] = known

    @rule(specs=st.lists(job_spec, min_size=1, max_size=4))
    def enqueue_many(self, specs: list[dict[str, Any]]) -> None:
        made = [self._new(spec) for spec in specs]
        with no_raw_database_error("enqueue_many"), self.engine.begin() as conn:
            ids = enqueue_many(conn, [row for row, _ in made], registry=self.registry)
        after = self._observe()
        assert len(ids) == len(made)
        for (_, model), job_id, duplicate in zip(made, ids, ids.duplicates, strict=True):
            holder = None
            if model.letter is not None:
                # held before the call, or by an earlier row of this batch
                holder = self._holder(model.task, model.queue, model.letter, self.seen)
                if holder is None:
                    holder = self._holder(model.task, model.queue, model.letter, after)
            self._record(model, job_id, duplicate, holder, after)
        self._settle(after, "enqueue_many", lambda _: None)

    @rule(spec=job_spec, mode=st.sampled_from(["replace", "replace_args"]))
    def enqueue_replacing(self, spec: dict[str, Any], mode: str) -> None:
        """Debounce and throttle (issue 24): a duplicate gives the holder its args if the
        holder has not started; a running holder is never touched, it lets its key go and
        the duplicate is written as a new job."""
        row, model = self._new({**spec, "letter": spec["letter"] or "a"})
        assert model.letter is not None
        row["unique"] = Unique(args=[], key=model.letter, on_conflict=mode)
        holder = self._holder(model.task, model.queue, model.letter, self.seen)
        args = dict(row["args"])
        before = self._args_of(holder)
        running = holder is not None and self.seen[holder].status == "running"
        task, given = row.pop("task"), row.pop("args")
        job_id = self._admin(
            "enqueue_replacing",
            lambda conn: enqueue(conn, task, given, registry=self.registry, **row),
        )
        after = self._observe()
        if holder is not None and not running:
            assert job_id == holder, f"a {mode} duplicate of job {holder} returned {job_id}"
            got = self._args_of(holder)
            ok = got is not None and got[0] == args
            assert ok, f"{mode}: job {holder} has args {got}, not the last call's {args}"
            held = self.jobs[holder]
            held.behaviour, held.n = model.behaviour, model.n
        else:
            if holder is not None:
                got = self._args_of(holder)  # its args and run_at
                assert got == before, f"{mode} touched running job {holder}: {before} -> {got}"
                assert job_id != holder, f"{mode} returned running job {holder} as replaced"
                assert after[holder].unique_key is None, f"running job {holder} kept its key"
                self.jobs[holder].letter = None
            self._record(model, job_id, False, None, after)
        self._settle(after, "enqueue_replacing", lambda _: None)

    def _args_of(self, job_id: int | None) -> tuple[dict[str, Any], Any] | None:
        """The job's args and run_at (None: no such job)."""
        if job_id is None:
            return None
        with self.engine.connect() as conn:
            found = conn.execute(
                text("SELECT args, run_at FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
            ).first()
        return None if found is None else (dict(found.args), found.run_at)

    # -- workflows ------------------------------------------------------------------------

    def _outcome(self, job_id: int) -> str | None:
        """How the job ended (None: it has not), from the latest observation. A job
        cancelled while its handler runs ends for its dependents when the handler returns."""
        row = self.seen.get(job_id)
        if row is not None:
            return row.status if row.status in ENDED and not row.held else None
        return self.jobs[job_id].gone_as

    @precondition(lambda self: self.seen)
    @rule(spec=job_spec, indices=picks, kinds=edge_kinds)
    def enqueue_dependent(self, spec: dict[str, Any], indices: list[int], kinds: list[str]) -> None:
        """A job that depends on 1-3 jobs still in the table (or the archive), each edge
        'cancel' or 'run'; it is cancelled at once if a 'cancel' parent already failed."""
        live = sorted(self.seen)
        parents = sorted({live[i % len(live)] for i in indices})
        pairs = list(zip(parents, kinds, strict=False))
        row, model = self._new({**spec, "letter": None})
        depends = [Dependency(p, on_failure=kind) for p, kind in pairs]
        task, args = row.pop("task"), row.pop("args")
        job_id = self._admin(
            "enqueue with depends_on",
            lambda conn: enqueue(
                conn, task, args, registry=self.registry, depends_on=depends, **row
            ),
        )
        after = self._observe()
        outcomes = [(self._outcome(p), kind) for p, kind in pairs]
        doomed = any(k == "cancel" and o in ("failed", "cancelled") for o, k in outcomes)
        pending = sum(1 for o, k in outcomes if not _counts_as_ended(o, k))
        expected = "cancelled" if doomed else "waiting" if pending else "queued"
        got = after.get(job_id)
        assert job_id not in self.jobs, f"enqueue returned job {job_id}, an existing one"
        ok = got is not None and got.status == expected
        assert ok, f"job {job_id} depends on {outcomes} and should be {expected}, is {got}"
        model.id = job_id
        self.jobs[job_id] = model
        self.parents[job_id] = pairs
        self._settle(after, "enqueue with depends_on", lambda _: None)

    def _check_ran_after_parents(self, runs: list[Run]) -> None:
        """Every job run in a step had all its parents ended as its edges let it run; a
        parent run in the same step ended before it started."""
        ended_at = {r.job_id: r.ended for r in runs if r.raised is None and r.ended}
        for run in runs:
            for parent, kind in self.parents.get(run.job_id, ()):
                outcome = self._outcome(parent)
                assert _counts_as_ended(outcome, kind), (
                    f"job {run.job_id} ran though its parent {parent} ({kind} edge) is {outcome}"
                )
                ended = ended_at.get(parent)
                assert ended is None or ended <= run.started, (
                    f"job {run.job_id} started before its parent {parent}'s handler ended"
                )

    # -- workers --------------------------------------------------------------------------

    def _runnable(
        self, row: Row | None, served: list[str] | None, within: float | None = None
    ) -> bool:
        """Whether a worker step may run `row` (as observed before it). `within`: seconds of
        real time the step may have taken since the observation; a queued job falling due
        in them may run too (a 30 s delay ends during a step that a loaded machine slowed)."""
        if row is None or row.archived:
            return False
        if row.queue in self.paused or (served is not None and row.queue not in served):
            return False
        if row.status == "queued":
            falls_due = within is not None and row.due_in is not None and row.due_in <= within
            return row.due or falls_due
        if row.status == "waiting" and row.parked is not None:  # the keeper's wake may come
            return row.due
        if row.status == "waiting":  # its last parent may end in the same step
            return row.id in self.parents and row.due
        orphan = self.orphans.get(row.id)
        return row.status == "running" and orphan is not None and orphan.reapable

    @rule(
        concurrency=st.integers(1, 3),
        batch=st.sampled_from([1, 5]),
        served=st.sampled_from([None, None, ["lim"], ["default", "keep"]]),
    )
    def work(self, concurrency: int, batch: int, served: list[str] | None) -> None:
        self.steps += 1
        step = self.steps
        rec = self.recorder
        with rec.lock:
            rec.step = step
            rec.limits = dict(self.concurrency)
            rec.held_until = {}
            for job_id, orphan in self.orphans.items():
                queue = self.seen[job_id].queue
                rec.held_until.setdefault(queue, []).append(orphan.reapable_from)
            rec.paused = frozenset(self.paused)
            rec.worker_concurrency = concurrency
            rec.partition_limits = dict(self.partition_limit)
            rec.sequence_of = {i: r.sequence for i, r in self.seen.items() if r.sequence}
            rec.overtaken = frozenset(self.overtaken)
            rec.executing_sequences = {}
        before = self.seen
        seen_at = self.seen_at
        worker_id = f"model-worker-{step}"
        config = WorkerConfig(
            queues=served,
            concurrency=concurrency,
            batch=batch,
            lease=KILL_LEASE,
            heartbeat=0.5,
            dead_after=6.0,
            poll_only=True,
            shutdown_timeout=5.0,
            worker_id=worker_id,
        )
        versions = dict(self.row_versions)  # no rule changes a row while the step runs
        started = dt.datetime.now()
        with self.trouble.watching(), no_raw_database_error("a worker step"):
            run_until_empty(self.engine, self.registry, config)
        elapsed = (dt.datetime.now() - started).total_seconds()
        assert not self.trouble.seen, f"the worker's statements were refused: {self.trouble.seen}"
        after = self._observe()
        left = [r.id for r in after.values() if r.status == "running" and r.locked_by == worker_id]
        assert not left, (
            f"the worker returned and left jobs {left} running: their outcome was not written"
        )
        runs = rec.in_step(step)
        within = time.monotonic() - seen_at
        for run in runs:
            assert self._runnable(before.get(run.job_id), served, within), (
                f"job {run.job_id} ran though at the step's start it was "
                f"{before.get(run.job_id)} (paused: {sorted(self.paused)}, served: {served})"
            )
            if run.raised not in SNOOZES:
                self.jobs[run.job_id].spent += 1
            self._check_outcome(run, after)
        self._check_rows(runs, before, after, versions)
        ran = {run.job_id for run in runs}
        for row in before.values():
            if (
                row.status == "queued"
                and self._runnable(row, served)
                and row.queue not in self.rated
                and self.concurrency[row.queue] is None
                and self.partition_limit[row.queue] is None
                and row.id not in ran
            ):
                now = after.get(row.id)
                if now is not None and (
                    sequence_holders(now, after, self.skipping)
                    or sequence_holders(row, before, self.skipping)
                ):
                    # an earlier job of its sequence holds it, or held it when the step began
                    # (a job cancelled while held by a claim is reaped when its lease ends,
                    # which under load may fall after the burst worker's last claim)
                    continue
                if self._starved(row, after):
                    continue
                ok = now is not None and (
                    now.status == "failed" or self._row_refused(now, now.attempts)
                )
                assert ok, (
                    f"the burst worker returned without running due job {row.id} of queue "
                    f"{row.queue!r} (now {now})"
                )
        TALLY["steps runs"] += sum(1 for r in runs if r.behaviour == "steps")
        TALLY["steps runs that raised"] += sum(
            1 for r in runs if r.behaviour == "steps" and r.raised
        )
        TALLY["sleeps begun"] += sum(1 for r in runs if r.raised == "Sleeping")
        TALLY["sleeps woken"] += sum(1 for r in runs if r.behaviour == "sleep" and not r.raised)
        TALLY["journey runs"] += sum(1 for r in runs if r.behaviour == "journey")
        TALLY["journeys finished"] += sum(
            1 for r in runs if r.behaviour == "journey" and not r.raised
        )
        succeeded = {r.job_id for r in runs if r.raised is None and r.behaviour in SUCCEEDS}

        def gone_ok(job_id: int) -> str | None:
            job = self.jobs[job_id]
            deleting = job_id in succeeded and QUEUES[job.queue] == "delete"
            if deleting and (job.task != "kept" or self._expired_result(job_id, elapsed)):
                return "finished (retention delete)"
            if self._expired_result(job_id, elapsed):
                return "result expired"
            return None

        self._settle(after, f"worker step {step}", gone_ok)
        self._check_ran_after_parents(runs)

    def _row_refused(self, row: Row, attempt: int) -> bool:
        """Whether a row job's attempt ended cancelled by its row policy, before its
        handler ran (its reason names its row: `_check_rows` checks which reason)."""
        job = self.jobs.get(row.id)
        return (
            job is not None
            and job.row is not None
            and row.status == "cancelled"
            and row.attempts == attempt
            and (row.last_error or "").startswith(f"{ROW_TABLE} {job.row} ")
        )

    def _check_rows(
        self,
        runs: list[Run],
        before: Mapping[int, Row],
        after: Mapping[int, Row],
        versions: Mapping[int, int | None],
    ) -> None:
        """ORM rows (issue 37), after a worker step; `versions`: each row's as it began.
        A row job's handler got its own row and no other, as it was at the load (its
        version at the step's start, or later by the touches of jobs that succeeded in the
        step), or None only under missing='none' with the row gone; a changed='skip' job
        ran only with its enqueue's version. A job claimed in the step whose row was gone
        (missing='cancel'), or changed (changed='skip'), ended cancelled naming the row,
        its handler never called. Each touch that returned counts once: the row's change
        committed with the job's end (`rows_hold` compares the table)."""
        with self.recorder.lock:
            seen = dict(self.recorder.row_seen)
        touched: collections.Counter[int] = collections.Counter()
        row_runs = [(run, self.jobs[run.job_id]) for run in runs]
        row_runs = [(run, job) for run, job in row_runs if job.row is not None]
        for run, job in row_runs:
            assert job.row is not None
            what = f"job {run.job_id} ({job.task} {job.behaviour}, attempt {run.attempt})"
            got = seen.get((run.job_id, run.attempt), "nothing")
            if versions[job.row] is None:
                ok = job.task == "row_skip" and got is None
                assert ok, (
                    f"{what} ran and got {got!r} though its row {job.row} was gone "
                    f"(missing={ROW_TASKS[job.task]['missing']!r})"
                )
                continue
            ok = isinstance(got, tuple) and got[0] == job.row
            assert ok, f"{what} was given {got!r}, not its row {job.row}, which exists"
            if job.task == "row_skip":
                assert got[1] == job.row_version, (
                    f"{what} ran with its row at version {got[1]} though it was enqueued at "
                    f"version {job.row_version} (changed='skip')"
                )
            if run.behaviour == "touch" and run.raised is None:
                touched[job.row] += 1
            TALLY["row jobs run with their row"] += 1
        for run, job in row_runs:
            got = seen.get((run.job_id, run.attempt))
            assert job.row is not None
            low = versions[job.row]
            if isinstance(got, tuple) and low is not None:
                ok = low <= got[1] <= low + touched[job.row]
                assert ok, (
                    f"job {run.job_id} got row {job.row} at version {got[1]}: it was at "
                    f"{low} as the step began and {touched[job.row]} job(s) changed it since"
                )
        ran = {(run.job_id, run.attempt) for run in runs}
        for job in self.jobs.values():
            was, now = before.get(job.id), after.get(job.id)
            if job.row is None or was is None or now is None or now.attempts <= was.attempts:
                continue  # not claimed by this step's worker
            known = versions[job.row]
            reason = now.last_error or ""
            what = f"row job {job.id} ({job.task}, row {job.row} enqueued at {job.row_version})"
            if not self._row_refused(now, now.attempts):
                gone = known is None and job.task == "row"
                skipped = (
                    known is not None
                    and job.task == "row_skip"
                    and known != job.row_version
                    and not touched[job.row]
                )
                ok = not (gone or skipped)
                assert ok, (
                    f"{what} was claimed with its row at {known} but is {now}: its policy "
                    "cancels it without running it"
                )
                continue
            assert (job.id, now.attempts) not in ran, f"{what} ran though it is cancelled: {now}"
            if job.task == "row":
                ok = known is None and reason == f"{ROW_TABLE} {job.row} is gone"
                assert ok, f"{what}, its row at {known}, was cancelled: {reason!r}"
            else:
                changed = re.fullmatch(
                    rf"{ROW_TABLE} {job.row} changed since enqueue "
                    rf"\(version {job.row_version}, now (\d+)\)",
                    reason,
                )
                at = None if changed is None else int(changed.group(1))
                ok = (
                    known is not None
                    and at is not None
                    and at != job.row_version
                    and known <= at <= known + touched[job.row]
                )
                assert ok, f"{what}, its row at {known}, was cancelled: {reason!r}"
            TALLY["row jobs cancelled by their policy"] += 1
        for row_id, count in touched.items():
            known = self.row_versions[row_id]
            assert known is not None
            self.row_versions[row_id] = known + count

    def _starved(self, row: Row, after: Mapping[int, Row]) -> bool:
        """Whether a job of a fair queue may be left by "fair starvation": its queue has a
        running job, and a queued job not due or held by its sequence in another partition."""
        if "fair starvation" not in self.excused or row.queue not in self.fair:
            return False
        mates = [r for r in after.values() if r.queue == row.queue and not r.archived]
        return any(r.status == "running" for r in mates) and any(
            r.status == "queued"
            and r.partition != row.partition
            and (not r.due or sequence_holders(r, after, self.skipping))
            for r in mates
        )

    def _check_outcome(self, run: Run, after: dict[int, Row]) -> None:
        """The job's row says what its handler's run asked for."""
        row = after.get(run.job_id)
        job = self.jobs[run.job_id]
        if row is not None and row.attempts != run.attempt:
            return  # claimed again since (after a reap): a later run tells
        what = (
            f"job {run.job_id} ({job.task} {job.behaviour} in {job.queue}, attempt {run.attempt})"
        )
        if run.raised in PARKS:  # parked; queued again if its sleep or wait ended since
            ok = row is not None and (
                (row.status == "waiting" and row.parked == PARKS[run.raised])
                or row.status == "queued"
            )
            assert ok, f"{what} raised {run.raised} but is {row}"
        elif run.raised in SNOOZES:
            ok = row is not None and row.status == "queued"
            assert ok, f"{what} snoozed but is {row}"
        elif run.raised is not None or run.behaviour == "slow":
            ok = row is not None and row.status in ("queued", "failed")
            assert ok, f"{what} failed (or timed out) but is {row}"
            last = run.attempt >= self._effective_max(row)
            assert (row.status == "failed") == last, (
                f"{what} failed on attempt {run.attempt} of {self._effective_max(row)} and is "
                f"{row.status}"
            )
        elif run.behaviour in ("surrogate", "nan"):
            ok = row is not None and row.status in ("failed", "queued")
            assert ok, (
                f"{what} returned a result jsonb cannot store: a failure outcome is due, got {row}"
            )
        else:
            kept = job.task == "kept"
            retention = QUEUES[job.queue]
            if retention == "delete" and not kept:
                assert row is None, f"{what} succeeded in a deleting queue but is {row}"
            elif row is None:
                ok = retention == "delete" and self._expired_result(run.job_id, SLACK)
                assert ok, (
                    f"{what} succeeded but its row is gone (its result is kept: it must stay "
                    f"done for the queue's result ttl, {self.ttl[job.queue]} s)"
                )
            else:
                assert row.status == "done", f"{what} succeeded but is {row}"
                # keep and archive: in the history (no model job blocks its key once done,
                # the one case a keep queue's job stays in jobs)
                moves = retention in ("keep", "archive")
                assert row.archived == moves, f"{what}: retention {retention}"
                if kept:
                    assert row.result == {"n": job.n}, (
                        f"{what} returned {{'n': {job.n}}} with keep_result but the job keeps "
                        f"{row.result!r}"
                    )

    @rule(limit=st.integers(1, 3), started=st.booleans())
    def kill_worker(self, limit: int, started: bool) -> None:
        self._kill(limit, started, 0)

    @rule(limit=st.integers(1, 3), upto=st.integers(1, 4))
    def kill_between_steps(self, limit: int, upto: int) -> None:
        """A worker SIGKILLed between two steps, sleeps or waits of its handlers: it claimed,
        reported them started, and each `steps` job it took ran its first `upto` steps (two
        at most, `run_steps`), each `journey` job its first `upto` stages (`run_journey`:
        steps recorded by the worker's step journal, a sleep recorded, a wait answered or
        parked in its own transaction), before it died; the rest never ran, and nothing
        wrote the run's outcome (a sleep not yet over is recorded but not parked). The
        reaper gives the running ones back once their lease ends; a parked one waits for
        its signal, its attempt refunded. The retry resumes after the last recorded stage
        (`steps_hold`, `signals_hold`: no recorded step runs again, every run gets its
        result and its wait's answer)."""
        self._kill(limit, True, upto)

    def _kill(self, limit: int, started: bool, upto: int) -> None:
        self.steps += 1
        worker_id = f"model-killed-{self.steps}"
        before = self.seen
        began = time.monotonic()  # before the registration: the database's clock starts there
        with no_raw_database_error("a killed worker's claim"), self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            rows = kill_claim(conn, worker_id, limit, started, self.task_max_attempts)
        per_queue: dict[str, int] = {}
        for claimed in rows:
            row = before.get(claimed["id"])
            ok = row is not None and row.status == "queued" and row.due
            assert ok, f"a claim took job {claimed['id']}, which was {row}"
            assert row.queue not in self.paused, f"a claim took job {row.id} of a paused queue"
            if claimed["status"] != "running":
                continue  # out of attempts: failed by the claim
            per_queue[row.queue] = per_queue.get(row.queue, 0) + 1
            self.orphans[row.id] = Orphan(claimed["attempts"], born=began)
            if started:
                self.jobs[row.id].spent += 1
                key = (row.id, claimed["attempts"])
                with self.recorder.lock:
                    assert key not in self.recorder.runs, f"attempt {key} was claimed twice"
                    self.recorder.runs[key] = Run(
                        row.id, key[1], row.queue, row.task, "killed", self.steps, 0.0, killed=True
                    )
                if upto and self.jobs[row.id].behaviour in DURABLE:
                    self._run_killed(row.id, row.task, row.queue, key[1], upto)
        for queue, count in per_queue.items():
            limit_of = self.concurrency[queue]
            running = sum(1 for r in before.values() if r.queue == queue and r.status == "running")
            assert limit_of is None or running + count <= limit_of, (
                f"a claim started {count} job(s) of queue {queue!r} with {running} running: "
                f"its concurrency limit is {limit_of}"
            )
        self._check_turns_claim(before, [before[r["id"]] for r in rows], rows, limit)
        self._settle(self._observe(), "a killed worker's claim", lambda _: None)

    def _run_killed(self, job_id: int, task: str, queue: str, attempt: int, upto: int) -> None:
        """What a killed worker's handler of a durable job did before it died: the first
        `upto` steps (or stages) of it, through the worker's own step journal and signal
        waits; a stage that ends the run (a sleep not yet over, a wait that parks) ends it
        there. A wait that parked the job refunded its attempt."""
        job = self.jobs[job_id]
        ctx = JobContext(
            job_id,
            task,
            queue,
            attempt,
            steps=EngineJournal(self.engine),
            signals=functools.partial(receive_on, self.engine, self.registry),
        )
        ended = "its last stage"
        with no_raw_database_error("the stages of a handler killed between them"):
            try:
                if job.behaviour == "steps":
                    upto = min(upto, 2)  # a steps job has two
                    run_steps(ctx, self.recorder, upto)
                else:
                    run_journey(ctx, self.recorder, job.n, upto)
            except (Sleeping, WaitingForSignal) as stop:
                ended = type(stop).__name__
        if ctx.parked:
            job.spent -= 1  # parked in the wait's own transaction: no attempt spent
        TALLY[f"kills of a {job.behaviour} job after stage {upto} ({ended})"] += 1

    def _check_turns_claim(
        self, before: Mapping[int, Row], taken: list[Row], claimed: list[Any], limit: int
    ) -> None:
        """One claim (a killed worker's) as partitions and sequences allow: no job an earlier
        one of its sequence holds, nor one of a sequence that runs, nor two of one sequence;
        no partition past its queue's limit; and in a fair queue, turns: a partition's k-th
        job of the claim goes to it only if no partition with a claimable job left had fewer
        than k - 1 running and taken (running counted before the claim; weights are 1)."""
        running: dict[tuple[str, str | None], int] = {}
        freed = "cancel frees turns" in self.excused
        for row in before.values():
            if (row.status == "running" or (row.held and not freed)) and not row.archived:
                key = (row.queue, row.partition)
                running[key] = running.get(key, 0) + 1
        sequences = [r.sequence for r in taken if r.sequence is not None]
        assert len(sequences) == len(set(sequences)), f"a claim took two jobs of {sequences}"
        for row in taken:
            holders = sequence_holders(row, before, self.skipping)
            assert not holders, f"a claim took job {row.id} though {holders} hold its sequence"
            busy = [
                r.id
                for r in before.values()
                if row.sequence
                and r.sequence == row.sequence
                and (r.status == "running" or (r.held and not freed))
                and not (row.id in self.overtaken and r.id > row.id)
            ]
            assert not busy, (
                f"a claim took job {row.id} while {busy} of its sequence ran (a job cancelled "
                "while its handler runs still runs it)"
            )
        started: dict[tuple[str, str | None], int] = {}
        for row, got in zip(taken, claimed, strict=True):
            key = (row.queue, row.partition)
            started[key] = started.get(key, 0) + 1
            cap = self.partition_limit[row.queue]
            if got["status"] == "running" and cap is not None:
                assert running.get(key, 0) + started[key] <= cap, (
                    f"a claim took job {row.id} of partition {row.partition!r} of queue "
                    f"{row.queue!r} with {running.get(key, 0)} running and {started[key] - 1} "
                    f"taken before it: its partition limit is {cap}"
                )
        ids = {r.id for r in taken}
        mixed = len(taken) >= limit and len({r.queue for r in taken}) > 1
        if mixed and "fair truncation" in self.excused:
            return  # the claim may have cut a fair queue's turns by age
        for queue in self.fair - self.paused:
            cap = self.partition_limit[queue]

            def level(partition: str | None, queue: str = queue) -> int:
                return running.get((queue, partition), 0) + started.get((queue, partition), 0)

            left = {
                r.partition
                for r in before.values()
                if r.queue == queue
                and r.status == "queued"
                and r.due
                and r.id not in ids
                and not sequence_holders(r, before, self.skipping)
                and (cap is None or level(r.partition) < cap)
            }
            for other in {r.partition for r in taken if r.queue == queue}:
                lowest = min((level(p) for p in left), default=None)
                ok = lowest is None or level(other) <= lowest + 1
                assert ok, (
                    f"fair queue {queue!r}: a claim brought partition {other!r} to "
                    f"{level(other)} running, while partition(s) "
                    f"{sorted(p or '(none)' for p in left if level(p) == lowest)} with "
                    f"{lowest} running kept a claimable job"
                )

    def _take_orphans(self, claimed: list[Any], began: float) -> None:
        """The running jobs of a claim whose worker never finishes them (it was killed);
        their lease runs from `began`, when the claim's transaction began (a held claim
        commits long after)."""
        for row in claimed:
            if row["status"] == "running":
                self.orphans[row["id"]] = Orphan(row["attempts"], born=began)

    @precondition(lambda self: self.jobs)
    @rule(
        held=st.sampled_from(HELD),
        beside=st.sampled_from(BESIDE),
        spec=job_spec,
        indices=picks,
        kinds=edge_kinds,
        limit=st.integers(1, 3),
        mode=st.sampled_from(["replace", "replace_args"]),
        outcome=st.sampled_from(["done", "failed"]),
        attempts=st.sampled_from([None, 3]),
        commit=st.booleans(),
    )
    def race(self, held: str, beside: str, commit: bool, **draw: Any) -> None:
        """Two commands at once (tests/system/model_races.py): `held` runs and waits, its locks
        held, while `beside` runs; then `held` commits (or rolls back) and `beside` must
        return within the deadline."""
        TALLY["races"] += 1
        with no_raw_database_error(f"{beside} beside a held {held}"):
            self._race(held, beside, Draw(**draw), commit)

    @rule(seconds=st.sampled_from([1.0, 10.0, 40.0, 4000.0, 200000.0]))
    def time_passes(self, seconds: float) -> None:
        with no_raw_database_error("moving the clock"), self.engine.begin() as conn:
            shift_clock(conn, seconds)
        for orphan in self.orphans.values():
            orphan.lease_left -= seconds
            orphan.stale_left -= seconds
        self._settle(self._observe(), f"{seconds} s passing", lambda _: None)

    @rule()
    def reaper(self) -> None:
        before = time.monotonic()
        with no_raw_database_error("a reaper round"), self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            reaped = reaper_round(conn, self.task_max_attempts)
        after_round = time.monotonic()
        reaped_ids = {r["id"] for r in reaped}
        # Due before the round began, and at most those due once it ended: real time passes.
        due = {i for i, orphan in self.orphans.items() if orphan.surely_reapable_at(before)}
        may = {i for i, orphan in self.orphans.items() if orphan.reapable_at(after_round)}
        assert reaped_ids <= set(self.orphans), (
            f"the reaper requeued {sorted(reaped_ids - set(self.orphans))}, which no dead "
            "worker held"
        )
        assert due <= reaped_ids, (
            f"the reaper left jobs {sorted(due - reaped_ids)} of dead workers running"
        )
        assert all(r["status"] in ("queued", "failed") for r in reaped)
        premature = reaped_ids - may
        assert not premature, f"the reaper requeued {sorted(premature)} before their lease ended"
        after = self._observe()
        for row in self.seen.values():
            job = self.jobs[row.id]
            if (
                row.status == "done"
                and row.result is not None
                and not row.archived
                and QUEUES[job.queue] == "delete"
                and (row.age or 0) > self.ttl[job.queue] + SLACK
            ):
                assert row.id not in after, (
                    f"job {row.id}'s kept result is past its queue's ttl but was not deleted"
                )
        self._settle(
            after,
            "a reaper round",
            lambda i: "result expired" if self._expired_result(i, 0) else None,
        )

    @rule()
    def keeper(self) -> None:
        """A keeper's wake of parked jobs: afterwards no sleeper whose end has come, and no
        job waiting for a signal past its deadline or with a signal unread, is still
        parked; nothing else changed (the jobs it queued are the only changes)."""
        before = self.seen
        with no_raw_database_error("a keeper's wake"), self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            keeper_wake(conn)
            left = conn.execute(text(OVERDUE_PARKED)).scalars().all()
        assert not left, f"the keeper's wake left jobs {sorted(left)} parked past their time"
        after = self._observe()
        for job_id, row in after.items():
            was = before.get(job_id)
            if was is None or was.stable() == row.stable():
                continue
            woken = was.parked is not None and row.status == "queued"
            # a killed worker's job, reaped meanwhile, is not the keeper's doing: real time
            ok = woken or (was.status == "running" and job_id in self.orphans)
            assert ok, f"the keeper's wake changed job {job_id}: {was} -> {row}"
        TALLY["keeper: parked jobs woken"] += sum(
            1
            for i, r in after.items()
            if r.status == "queued" and getattr(before.get(i), "parked", None)
        )
        self._settle(after, "a keeper's wake", lambda _: None)

    @precondition(lambda self: any(j.behaviour in SIGNALLED for j in self.jobs.values()))
    @rule(index=st.integers(0, 40), commit=st.booleans())
    def send_signal(self, index: int, commit: bool) -> None:
        """A signal to a `wait` job's key, in a transaction committed or rolled back: before
        its wait (the mailbox keeps it), while it is parked (woken in the sender's
        transaction), or after its wait was answered (kept, unread)."""
        waiters = sorted(j.id for j in self.jobs.values() if j.behaviour in SIGNALLED)
        job = self.jobs[waiters[index % len(waiters)]]
        key, payload = signal_key(job.n), next(self.signals)
        before = self.seen

        def send() -> int:
            with Session(self.engine) as session:
                woke = sqla_queue.signal(session, key, {"s": payload}, expires_in=SIGNAL_EXPIRY)
                if commit:
                    session.commit()
                else:
                    session.rollback()
                return woke

        woke = self._ends("signal", send)
        after = self._observe()
        was, now = before.get(job.id), after.get(job.id)
        if commit:
            self.sent.setdefault(key, []).append(payload)
            TALLY["signals committed"] += 1
            if was is not None and was.parked == "signal":
                ok = woke == 1 and now is not None and now.status == "queued"
                assert ok, (
                    f"a committed signal {key!r} left its parked job {job.id} {now} (woke {woke})"
                )
                TALLY["signals that woke a parked job"] += 1
        else:
            self.rolled_back.add(payload)
            TALLY["signals rolled back"] += 1
            ok = was is None or (now is not None and now.stable() == was.stable())
            assert ok, f"a rolled-back signal {key!r} changed job {job.id}: {was} -> {now}"
        self._settle(after, "a signal", lambda _: None)

    # -- admin ----------------------------------------------------------------------------

    @precondition(lambda self: self.jobs)
    @rule(indices=picks)
    def cancel(self, indices: list[int]) -> None:
        ids = self._ids(indices)
        before = self.seen
        result = self._admin("cancel_jobs", lambda conn: admin.cancel_jobs(conn, ids))
        after = self._observe()
        expected = {
            i for i in ids if i in before and before[i].status in ("queued", "running", "waiting")
        }
        assert set(result) == expected, f"cancel_jobs({ids}) returned {result}, not {expected}"
        for job_id in ids:
            if job_id in expected:
                assert after[job_id].status == "cancelled", f"job {job_id} was not cancelled"
            elif job_id in before:
                now = after.get(job_id)
                ok = now is not None and now.stable() == before[job_id].stable()
                assert ok, f"cancel changed job {job_id}: {before[job_id]} -> {now}"
        self._settle(after, "cancel_jobs", lambda _: None)

    @precondition(lambda self: self.jobs)
    @rule(
        indices=st.none() | picks,
        queue=st.none() | queue_names,
        attempts=st.sampled_from([None, None, 1, 3]),
    )
    def retry(self, indices: list[int] | None, queue: str | None, attempts: int | None) -> None:
        before = self.seen
        if indices is None:
            ids = None
            expected = {
                r.id
                for r in before.values()
                if r.status == "failed" and not r.archived and queue in (None, r.queue)
            }
        else:
            ids, queue = self._ids(indices), None
            expected = {
                i
                for i in ids
                if i in before
                and before[i].status in ("failed", "cancelled")
                and not before[i].held
            }
        result = self._admin(
            "retry_jobs",
            lambda conn: admin.retry_jobs(
                conn, ids, all_failed=ids is None, queue=queue, attempts=attempts
            ),
        )
        retried = set(result if isinstance(result, Mapping) else result.retried)
        after = self._observe()
        assert retried <= expected, f"retry_jobs retried {sorted(retried - expected)}"
        for job_id in expected:
            row = after[job_id]
            if job_id in retried:
                ok = (row.status == "queued" and row.due) or (
                    row.status == "waiting" and job_id in self.parents
                )
                assert ok, f"job {job_id} retried but is {row}"
                job = self.jobs[job_id]
                job.spent = 0
                job.budget = attempts or before[job_id].max_attempts or DEFAULT_MAX_ATTEMPTS
                continue
            holders = key_holders(row, after)
            assert holders, (
                f"retry_jobs left job {job_id} ({row.status}) alone though no other job holds "
                "its unique key"
            )
            skipped = getattr(result, "skipped", None)
            assert skipped is None or job_id in skipped, (
                f"retry_jobs left job {job_id} alone (its key is held by {holders}) and did "
                "not name it"
            )
            assert row.stable() == before[job_id].stable(), (
                f"retry_jobs changed job {job_id}, which it did not retry: "
                f"{before[job_id]} -> {row}"
            )
        self._settle(after, "retry_jobs", lambda _: None)

    @precondition(lambda self: self.jobs)
    @rule(indices=picks)
    def delete(self, indices: list[int]) -> None:
        ids = self._ids(indices)
        before = self.seen
        result = self._admin("delete_jobs", lambda conn: admin.delete_jobs(conn, ids))
        expected = {
            i for i in ids if i in before and before[i].status != "running" and not before[i].held
        }
        assert set(result) == expected, f"delete_jobs({ids}) returned {result}, not {expected}"
        self._settle(self._observe(), "delete_jobs", lambda i: "deleted" if i in expected else None)

    @rule(
        older_than=st.sampled_from([0.0, 60.0, 7200.0]),
        statuses=st.sets(st.sampled_from(["done", "failed", "cancelled"]), min_size=1),
        archive=st.booleans(),
    )
    def prune(self, older_than: float, statuses: set[str], archive: bool) -> None:
        before = self.seen
        count = self._admin(
            "prune", lambda conn: admin.prune(conn, older_than, sorted(statuses), archive=archive)
        )
        after = self._observe()

        def prunable(row: Row) -> bool:
            if row.old_archive:
                return archive
            return row.status in statuses and not row.held

        gone = {i for i in before if i not in after}
        assert count == len(gone), f"prune said {count} but {len(gone)} jobs went"
        for row in before.values():
            if row.id in gone:
                ok = prunable(row) and (row.age or 0) + SLACK >= older_than
                assert ok, f"prune(older_than={older_than}, {sorted(statuses)}) deleted {row}"
            elif prunable(row) and row.age is not None:
                assert row.age <= older_than + SLACK, f"prune left {row}"
        self._settle(after, "prune", lambda i: "pruned" if i in gone else None)

    @rule(queue=queue_names, paused=st.booleans())
    def pause(self, queue: str, paused: bool) -> None:
        self._admin("set_paused", lambda conn: admin.set_paused(conn, queue, paused))
        (self.paused.add if paused else self.paused.discard)(queue)

    @rule(queue=queue_names, limit=st.sampled_from([None, 1, 2]))
    def limit_concurrency(self, queue: str, limit: int | None) -> None:
        self._admin("set_max_running", lambda conn: admin.set_max_running(conn, queue, limit))
        self.concurrency[queue] = limit

    @rule(queue=queue_names, setting=turn_settings)
    def take_turns(self, queue: str, setting: tuple[str, Any]) -> None:
        """Fair queues, partition limits, aging, and what a failed job does to its sequence."""
        name, value = setting
        self._admin(f"set_{name}", lambda conn: TURN_SETTINGS[name](conn, queue, value))
        if name == "fair":
            (self.fair.add if value else self.fair.discard)(queue)
        elif name == "partition_limit":
            self.partition_limit[queue] = value
            self.grandfathered[queue] = {
                (r.id, r.attempts)
                for r in self.seen.values()
                if r.queue == queue and r.status == "running" and not r.archived
            }
        elif name == "aging":
            (self.aging.discard if value is None else self.aging.add)(queue)
        else:
            (self.skipping.add if value == "skip" else self.skipping.discard)(queue)

    @rule(queue=queue_names, rate=st.sampled_from([None, "1/s", "2/min"]))
    def limit_rate(self, queue: str, rate: str | None) -> None:
        self._admin("set_rate", lambda conn: admin.set_rate(conn, queue, rate))
        (self.rated.discard if rate is None else self.rated.add)(queue)

    @rule(queue=queue_names, seconds=st.sampled_from([0.0, 5.0, 3600.0, 86400.0, HUGE_TTL]))
    def result_ttl(self, queue: str, seconds: float) -> None:
        try:
            self._admin("set_result_ttl", lambda conn: admin.set_result_ttl(conn, queue, seconds))
        except SqlaQueueError:
            assert seconds == HUGE_TTL, f"set_result_ttl refused {seconds} s"
            return  # a clear refusal of what PostgreSQL cannot hold
        self.ttl[queue] = seconds

    @precondition(lambda self: self.jobs)
    @rule(index=st.integers(0, 40))
    def poll_result(self, index: int) -> None:
        (job_id,) = self._ids([index])
        row = self.seen.get(job_id)
        expected: Any
        try:
            with no_raw_database_error("wait_for"):
                got: Any = wait_for(self.engine, job_id, timeout=0)
        except (JobFailedError, ResultMissingError, ResultTimeoutError) as exc:
            got = type(exc)
        if row is None:
            expected = ResultMissingError
        elif row.status == "done":
            expected = row.result
        elif row.status in ("failed", "cancelled"):
            expected = JobFailedError
        else:
            expected = ResultTimeoutError
        assert got == expected, (
            f"wait_for(job {job_id}, timeout=0) on a job that is "
            f"{row.status if row else 'gone'} gave {got!r}, not {expected!r}"
        )

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def workflows_hold(self) -> None:
        """A waiting job's deps_left is the count of its parents that have not ended as its
        edges need (and is never 0: the last end makes it due); a job whose 'cancel' parent
        failed or was cancelled has not run and is cancelled (or waits, retried, for that
        parent to be retried)."""
        if not self.parents:
            return
        with no_raw_database_error("reading deps_left"), self.engine.connect() as conn:
            deps_left = dict(
                conn.execute(
                    text("SELECT id, deps_left FROM sqla_queue.jobs WHERE status = 'waiting'")
                ).all()
            )
        for child, pairs in self.parents.items():
            row = self.seen.get(child)
            if row is None or row.archived:
                continue
            outcomes = [(p, self._outcome(p), kind) for p, kind in pairs]
            pending = sum(1 for _, o, k in outcomes if not _counts_as_ended(o, k))
            doomed = [p for p, o, k in outcomes if k == "cancel" and o in ("failed", "cancelled")]
            if row.status == "waiting" and row.parked is None:
                assert deps_left.get(child) == pending, (
                    f"job {child} waits with deps_left {deps_left.get(child)} but {pending} of "
                    f"its parents have not ended as it needs: {outcomes}"
                )
                assert pending, f"job {child} waits though all its parents ended: {outcomes}"
            if doomed:
                assert row.status in ("cancelled", "waiting"), (
                    f"job {child} is {row.status} though its parent(s) {doomed} ended "
                    f"failed or cancelled: {outcomes}"
                )

    @invariant()
    def turns_hold(self) -> None:
        """No two jobs of one sequence run at once; no partition runs more jobs than its
        queue's limit (unless those running when the limit was lowered still do)."""
        running: dict[Any, list[Row]] = {}
        for row in self.seen.values():
            if row.status != "running" or row.archived:
                continue
            if row.sequence is not None:
                running.setdefault(("sequence", row.sequence), []).append(row)
            running.setdefault((row.queue, row.partition), []).append(row)
        for key, rows in running.items():
            ids = sorted(r.id for r in rows)
            if key[0] == "sequence":
                ok = all(i in self.overtaken for i in ids[:-1])
                assert ok, f"jobs {ids} of sequence {key[1]!r} run at once"
                continue
            limit = self.partition_limit[key[0]]
            fresh = [r.id for r in rows if (r.id, r.attempts) not in self.grandfathered[key[0]]]
            assert limit is None or len(rows) <= limit or not fresh, (
                f"jobs {ids} of partition {key[1]!r} of queue {key[0]!r} run: its partition "
                f"limit is {limit}"
            )

    @invariant()
    def progresses(self) -> None:
        """Liveness: no session holds a transaction (row locks) after the call that opened
        it returned; and a due job no rule blocks (its sequence, its partition's limit, a
        pause, a dependency, its queue's max-running or rate) is claimable by an idle
        worker serving its queue: a claim returns a job while the model says one is
        claimable (`model_liveness.stalled_claims`, on a scratch transaction rolled
        back); no job stays parked for a signal that sits unread in the mailbox (its wake
        came with the signal's commit, or its wait took it)."""
        TALLY["invariant rounds"] += 1
        left = leftover_transactions(self.engine)
        assert not left, f"sessions still hold a transaction after their call returned: {left}"
        rules = Rules(
            paused=frozenset(self.paused),
            rated=frozenset(self.rated),
            concurrency=dict(self.concurrency),
            partition_limit=dict(self.partition_limit),
            skipping=frozenset(self.skipping),
        )
        due = sorted({r.queue for r in self.seen.values() if r.status == "queued" and r.due})
        with no_raw_database_error("a scratch claim"):
            stalls = stalled_claims(
                self.engine, self.seen, rules, due, self.task_max_attempts, TALLY
            )
        stalls = [s for s in stalls if not self._excused_stall(s)]
        assert not stalls, "; ".join(map(str, stalls))
        with no_raw_database_error("reading parked waits"), self.engine.connect() as conn:
            unread = conn.execute(text(PARKED_WITH_MAIL)).all()
        assert not unread, (
            f"jobs parked for a signal that sits unread in the mailbox (only a keeper's look "
            f"would wake them): {[tuple(r) for r in unread]}"
        )

    def _excused_stall(self, stall: Stall) -> bool:
        """A stall a known defect explains (see `KNOWN_DEFECTS`): "held-sequence
        starvation" (issue 33, defect 2), a fair queue's claim reads only the least served
        partitions, and those whose due jobs all wait behind their sequence fill it."""
        excused = (
            "held-sequence starvation" in self.excused
            and stall.queue in self.fair
            and bool(stall.held_partitions())
        )
        TALLY["stalls excused (held-sequence starvation)"] += excused
        return excused

    @invariant()
    def steps_hold(self) -> None:
        """Durable steps (issue 36): a database-only step's row exists at most once, written
        by the attempt its record names (the row and the record committed together; a job
        deleted takes its record, never the row); every run of a job got the same result
        from its outside step, the one an attempt that ran it recorded; a recorded step never
        runs again (`Recorder.outside_step`: a violation); a steps job's handler finishes
        at most once."""
        with no_raw_database_error("reading steps"), self.engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT job_id, count(*), min(attempt) FROM {STEP_ROWS} GROUP BY job_id")
            ).all()
            recorded = dict(
                conn.execute(
                    text(
                        "SELECT job_id, attempt FROM sqla_queue.job_steps "
                        "WHERE name = 'db' AND status = 'done'"
                    )
                ).all()
            )
        written = {job_id: attempt for job_id, _, attempt in rows}
        twice = [job_id for job_id, count, _ in rows if count != 1]
        assert not twice, f"database-only steps of jobs {twice} wrote their rows more than once"
        for job_id, attempt in recorded.items():
            assert written.get(job_id) == attempt, (
                f"job {job_id}'s step 'db' is recorded by attempt {attempt}, but its row was "
                f"written by {written.get(job_id)}"
            )
        for job_id in set(written) - set(recorded):
            row = self.seen.get(job_id)
            assert row is None or row.archived, (
                f"job {job_id} wrote its step's row, has no record of the step and is {row}"
            )
        with self.recorder.lock:
            seen = {job_id: list(got) for job_id, got in self.recorder.step_seen.items()}
            ran = set(self.recorder.outside)
            finished = collections.Counter(
                r.job_id
                for r in self.recorder.runs.values()
                if r.behaviour in DURABLE and r.ended is not None and r.raised is None
            )
        again = sorted(job_id for job_id, count in finished.items() if count > 1)
        assert not again, f"steps jobs {again} finished more than once"
        unwritten = sorted(set(finished) - set(written))
        assert not unwritten, (
            f"durable jobs {unwritten} finished, but their database-only step's row is missing"
        )
        unrun = sorted(set(finished) - {job_id for job_id, _ in ran})
        assert not unrun, f"durable jobs {unrun} finished, but their outside step never ran"
        TALLY["steps: database-only rows, max"] = max(
            TALLY["steps: database-only rows, max"], len(rows)
        )
        TALLY["steps: replays seen, max"] = max(
            TALLY["steps: replays seen, max"], sum(len(got) - 1 for got in seen.values())
        )
        for job_id, got in seen.items():
            assert all(g == got[0] for g in got), f"job {job_id}'s runs saw {got}"
            assert (job_id, got[0]["attempt"]) in ran, (
                f"job {job_id}'s outside step returned {got[0]}, which no run of it made"
            )

    @invariant()
    def parked_jobs_hold_nothing(self) -> None:
        """No sleeping or waiting job holds a slot: no worker, no lease."""
        for row in self.seen.values():
            if row.status == "waiting":
                holds = row.locked_by is not None or row.lease_left is not None
                assert not holds, (
                    f"job {row.id} is waiting ({row.parked or 'for its parents'}) but holds "
                    f"a slot: {row}"
                )

    @invariant()
    def signals_hold(self) -> None:
        """Every run of a `wait` job got the same answer (a wait's answer is recorded, so a
        signal is consumed once by each waiter it wakes), a payload of a committed signal
        for its key, never a rolled-back one; and a committed signal is never lost: each
        was consumed by its key's waiter or is still in the mailbox."""
        if not self.sent and not self.rolled_back:
            return
        with self.recorder.lock:
            seen = {job_id: list(got) for job_id, got in self.recorder.signal_seen.items()}
        consumed: dict[str, int] = {}
        for job_id, got in seen.items():
            key = signal_key(self.jobs[job_id].n)
            assert all(g == got[0] for g in got), f"job {job_id}'s runs got {got} from {key!r}"
            if got[0] == "timed out":
                continue
            payload = got[0]["s"]
            assert payload not in self.rolled_back, (
                f"job {job_id} got signal {payload}, which was sent in a rolled-back transaction"
            )
            assert payload in self.sent.get(key, []), (
                f"job {job_id} got signal {payload}, which was not committed for {key!r}"
            )
            consumed[key] = consumed.get(key, 0) + 1
        with no_raw_database_error("reading the mailbox"), self.engine.connect() as conn:
            kept = dict(
                conn.execute(
                    text("SELECT key, count(*) FROM sqla_queue.signals GROUP BY key")
                ).all()
            )
        for key, payloads in self.sent.items():
            left = kept.get(key, 0) + consumed.get(key, 0)
            assert left == len(payloads), (
                f"{len(payloads)} signal(s) {key!r} were committed; {consumed.get(key, 0)} "
                f"consumed and {kept.get(key, 0)} in the mailbox: a signal was lost"
            )
        TALLY["signal waits answered"] = len(seen)

    @invariant()
    def rows_hold(self) -> None:
        """ORM rows (issue 37): the rows are as the model says (each touch of a job that
        succeeded counted once, none of a job that failed), and every job about a row is a
        row job about its own row (`about`, recorded at enqueue)."""
        with no_raw_database_error("reading the rows"), self.engine.connect() as conn:
            versions = dict(conn.execute(text(f"SELECT id, version FROM {ROW_TABLE}")).all())
            abouts = conn.execute(
                text(
                    "SELECT id, about FROM sqla_queue.jobs WHERE about IS NOT NULL UNION ALL "
                    "SELECT id, about FROM sqla_queue.jobs_history WHERE about IS NOT NULL"
                )
            ).all()
        expected = {k: v for k, v in self.row_versions.items() if v is not None}
        assert versions == expected, f"the rows are {versions}; the model says {expected}"
        for job_id, about in abouts:
            job = self.jobs.get(job_id)
            ok = job is not None and job.row is not None and about == f"{ROW_TABLE}:{job.row}"
            assert ok, f"job {job_id} is about {about!r}: {job}"

    @invariant()
    def holds(self) -> None:
        with self.recorder.lock:
            violations = list(self.recorder.violations)
        assert not violations, "; ".join(violations)
        for job in self.jobs.values():
            assert job.spent <= job.budget, (
                f"job {job.id} ({job.task} {job.behaviour}) ran {job.spent} times on a budget "
                f"of {job.budget} attempts"
            )


def run_model(databases: TemplateDatabases, profile: settings | None = None) -> None:
    QueueMachine.pool = pool = ClonePool(databases)
    TALLY.clear()
    try:
        run_state_machine_as_test(QueueMachine, settings=profile)
    finally:
        QueueMachine.pool = None
        pool.close()
        print(f"the model ran: {dict(TALLY)}")


@pytest.mark.timeout(1800)  # SQLA_QUEUE_HYPOTHESIS_PROFILE=long runs it long too
def test_queue_model(databases: TemplateDatabases) -> None:
    """The model with the loaded profile ("default": short; SQLA_QUEUE_HYPOTHESIS_PROFILE)."""
    run_model(databases)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 15-45 minutes on a loaded machine: past the suite's 300 s
def test_queue_model_long(databases: TemplateDatabases) -> None:
    """The model with the "long" profile."""
    run_model(databases, settings.get_profile("long"))
