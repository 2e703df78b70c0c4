"""The stress run of the model: every feature at once on 4 real worker processes, some of
them SIGKILLed and restarted while jobs run, then a drain, then the model's invariants on
the final state and on the run intervals the handlers recorded (tests/helpers/apps/fault_app.py's
`stress` task notes "start" and "end" of every run, server clock).

Features mixed: unique (a key's duplicates return its holder), debounce (`replace` with a
delay, over and over), workflows (children on 'cancel' and 'run' edges; parents that fail),
sequences (a holding queue and a skipping one), a fair queue with a partition limit of 1
and aging, a queue with max-running 2, timeouts (a run past the task's timeout), cancel
(queued and running), retry (of the failed), snooze, kept results; SIGKILLs with a lease of
2 s (the reaper brings their jobs back).

What must hold at the end:
- no job lost: every id an enqueue returned is in the table, in a final state (done, failed,
  cancelled), or explained (queued behind a failed job of its sequence in a holding queue);
- no two runs of one sequence overlap; no two runs of one partition of the fair queue
  (limit 1) overlap; at most 2 runs of the limited queue at once (a killed worker's run
  ends when it was killed);
- a child on a 'cancel' edge ran only after its parent was done; one whose parent failed or
  was cancelled is cancelled (or ran before, retried);
- a done job kept the result its handler returned.

Left out while their fixes are pending (issue 33; the model's replays cover them as strict
xfails): cancelling a running job of a sequence or of a partition-limited queue (defect 3
frees its turn while the handler runs: overlapping intervals), failing sequence jobs in the
fair queue that holds on failure (defect 2 starves its other partitions: the drain would
not end; the fair queue skips instead); a debounce holder that is due while duplicates come
(defect 1: the enqueue can wedge beside a claim; the holder's delay keeps it off the claims
until the duplicates stop).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from helpers.apps.fault_app import registry as fault_registry
from helpers.fault_kit import FaultDatabase, WorkerProcess, wait_until
from sqlalchemy import Engine, create_engine

from sqla_queue import Dependency, Unique, admin, enqueue
from sqla_queue.admin import partitions

pytestmark = pytest.mark.slow

StartWorker = Callable[..., WorkerProcess]

WORKERS = 4
CHAOS = 20.0
"""Seconds of enqueues, cancels, retries and kills; then the drain."""
DRAIN_DEADLINE = 240.0
KILL_EVERY = 2.5
QUEUES = "default,seq,skip,fair,lim"
PARTITIONS = [f"t{i}" for i in range(5)]
DEBOUNCE_DELAY = 10.0
"""Longer than a round of enqueues takes under load: a holder is never due while its
duplicates come (defect 1 of issue 33 could wedge the enqueue beside a claim)."""
FINAL = ("done", "failed", "cancelled")


class Stress:
    """The run's own record: every id an enqueue returned, with what it was asked to do."""

    def __init__(self, engine: Engine, seed: int) -> None:
        self.engine = engine
        self.random = random.Random(seed)
        self.ids: set[int] = set()
        self.n = 0
        self.edges: list[tuple[int, int, str]] = []
        """(parent, child, on_failure) of every dependency enqueued."""

    def enqueue(self, queue: str, mode: str = "ok", seconds: float = 0.05, **options: Any) -> int:
        self.n += 1
        with self.engine.begin() as conn:
            job_id = enqueue(
                conn,
                "stress",
                {"n": self.n, "mode": mode, "seconds": seconds},
                registry=fault_registry,
                queue=queue,
                **options,
            )
        self.ids.add(job_id)
        return job_id

    def mode(self) -> str:
        return self.random.choices(["ok", "fail", "snooze", "slow"], [12, 2, 2, 1])[0]

    def batch(self) -> None:
        """One round of enqueues of every kind."""
        r = self.random
        for _ in range(3):  # sequences in a holding and a skipping queue
            queue = r.choice(["seq", "skip"])
            self.enqueue(queue, self.mode(), sequence=f"{queue}-s{r.randrange(3)}")
        for _ in range(3):  # fair, partition limit 1, aging; sequences that never fail
            sequence = f"f{r.randrange(3)}" if r.random() < 0.3 else None
            mode = r.choice(["ok", "snooze", "ok"]) if sequence else self.mode()
            self.enqueue(
                "fair", mode, partition=r.choice(PARTITIONS), sequence=sequence,
                priority=r.choice([0, 0, 3]),
            )  # fmt: skip
        self.enqueue("lim", self.mode(), seconds=0.2)
        self.enqueue("default", "ok", unique=Unique(args=[], key=f"u{r.randrange(4)}"))
        for key in ("d0", "d1", "d2"):  # debounce: each duplicate pushes run_at back
            self.enqueue(
                "default",
                "ok",
                unique=Unique(args=[], key=key, on_conflict="replace"),
                delay=DEBOUNCE_DELAY,
            )
        parent = self.enqueue("default", self.mode())
        for on_failure in ("cancel", "run"):
            child = self.enqueue(
                "default", "ok", depends_on=[Dependency(parent, on_failure=on_failure)]
            )
            self.edges.append((parent, child, on_failure))

    def meddle(self) -> None:
        """Cancel a few jobs (running ones only where a cancel frees nothing: defect 3 frees
        a running job's sequence, partition slot and 'run' dependents), and retry the
        failed."""
        with self.engine.begin() as conn:
            rows = conn.exec_driver_sql(
                "SELECT id FROM sqla_queue.jobs WHERE status = 'queued' "
                "OR (status = 'running' AND queue = 'lim') ORDER BY random() LIMIT 2"
            ).scalars()
            admin.cancel_jobs(conn, list(rows))
        if self.random.random() < 0.3:
            with self.engine.begin() as conn:
                admin.retry_jobs(conn, all_failed=True)


@pytest.mark.timeout(600)  # the drain may take minutes on a loaded machine
def test_every_feature_on_four_killed_workers_keeps_the_models_invariants(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    # a statement that waits on a lock for 10 s fails the test instead of hanging it
    engine = create_engine(fault_db.url, connect_args={"options": "-c lock_timeout=10000"})
    seed = random.randrange(2**32)
    print(f"stress seed {seed}")
    stress = Stress(engine, seed)
    with engine.begin() as conn:
        for name in ("seq", "skip", "fair", "lim"):
            admin.create_queue(conn, name, "keep")
        admin.create_queue(conn, "default", "keep")
        admin.set_retention(conn, "default", "keep")
        partitions.set_sequence_on_failure(conn, "skip", "skip")
        partitions.set_fair(conn, "fair", True)
        partitions.set_partition_limit(conn, "fair", 1)
        partitions.set_aging(conn, "fair", 2.0)
        partitions.set_sequence_on_failure(conn, "fair", "skip")
        admin.set_max_running(conn, "lim", 2)
    options = ("-q", QUEUES, "-c", "4", "--batch", "2", "--lease", "2", "--poll-interval", "0.5")
    pool = [workers(fault_db.url, *options) for _ in range(WORKERS)]
    killed_at: dict[int, datetime] = {}
    kills = 0
    try:
        end = time.monotonic() + CHAOS
        next_kill = time.monotonic() + KILL_EVERY
        while time.monotonic() < end:
            stress.batch()
            stress.meddle()
            if time.monotonic() >= next_kill:
                victim = stress.random.choice(pool)
                pid = victim.pid
                victim.kill()
                killed_at[pid] = fault_db.value("SELECT clock_timestamp()")
                kills += 1
                victim.start()
                next_kill = time.monotonic() + KILL_EVERY
            time.sleep(0.2)
        wait_until(
            lambda: not unexplained(fault_db),
            DRAIN_DEADLINE,
            interval=1.0,
            what="every job to end or be held by a failed job of its sequence",
        )
    finally:
        engine.dispose()
    check_final_state(fault_db, stress)
    checked = check_intervals(fault_db, killed_at)
    print(
        f"stress: {len(stress.ids)} jobs, {kills} SIGKILLs, {fault_db.status_counts()}, {checked}"
    )
    assert kills >= 4, f"only {kills} SIGKILLs"
    assert len(stress.ids) > 100, f"only {len(stress.ids)} jobs"


HELD_BY_SEQUENCE = """
    j.status = 'queued' AND j.sequence IS NOT NULL AND EXISTS (
        SELECT 1 FROM sqla_queue.jobs e JOIN sqla_queue.queues q ON q.name = e.queue
        WHERE e.sequence = j.sequence AND e.id < j.id AND e.status = 'failed'
            AND q.sequence_on_failure = 'hold')
"""
"""A queued job a failed earlier job of its sequence holds (its queue holds on failure)."""


def unexplained(db: FaultDatabase) -> list[tuple[Any, ...]]:
    """The jobs neither in a final state nor held by a failed job of their sequence."""
    return db.rows(
        f"SELECT j.id, j.queue, j.status, j.sequence, j.partition FROM sqla_queue.jobs j "
        f"WHERE j.status NOT IN ('done', 'failed', 'cancelled') AND NOT ({HELD_BY_SEQUENCE})"
    )


def check_final_state(db: FaultDatabase, stress: Stress) -> None:
    rows = {
        r[0]: r
        for r in db.rows(
            # every queue keeps: the done jobs are in the history
            "SELECT id, status, result, args, finished_at, sequence FROM sqla_queue.all_jobs"
        )
    }
    lost = sorted(stress.ids - set(rows))
    assert not lost, f"jobs {lost} were enqueued and committed but are gone"
    strays = sorted(set(rows) - stress.ids)
    assert not strays, f"jobs {strays} exist that no enqueue returned"
    assert not unexplained(db), f"jobs left unfinished, unexplained: {unexplained(db)}"
    for job_id, status, result, args, _, _ in rows.values():
        if status == "done":
            assert result == {"n": args["n"]}, f"job {job_id} done with result {result!r}"
    starts = first_event(db, "start")
    ends = first_event(db, "end")
    for parent, child, on_failure in stress.edges:
        p, c = rows[parent], rows[child]
        if on_failure == "cancel" and child in starts:
            assert p[1] == "done" or c[1] != "done", (
                f"job {child} ran and is done though its parent {parent} is {p[1]}"
            )
            if p[1] == "done":
                assert p[4] <= starts[child], f"job {child} started before parent {parent} ended"
        if on_failure == "cancel" and p[1] in ("failed", "cancelled") and child not in starts:
            assert c[1] == "cancelled", (
                f"job {child} is {c[1]} though its parent {parent} is {p[1]}"
            )
        if on_failure == "run" and child in starts:  # a run of the parent ended before
            ended = ends.get(parent, p[4])  # never ran: it ended when cancelled
            ok = ended is not None and ended <= starts[child]
            assert ok, f"job {child} ('run' edge) started before its parent {parent} ended ({p[1]})"


def first_event(db: FaultDatabase, event: str) -> dict[int, datetime]:
    """When each job's handler first noted `event`."""
    return dict(
        db.rows("SELECT job_id, min(at) FROM public.fault_runs WHERE event = %s GROUP BY 1", event)
    )


def runs(db: FaultDatabase, killed_at: dict[int, datetime]) -> list[tuple[Any, ...]]:
    """Every run: (job, attempt, start, end, queue, partition, sequence); a run with no end
    ended when its worker process was killed."""
    found = []
    rows = db.rows(
        "SELECT r.job_id, r.attempt, r.pid, r.at, "
        "  (SELECT min(e.at) FROM public.fault_runs e WHERE e.job_id = r.job_id "
        "   AND e.attempt = r.attempt AND e.pid = r.pid AND e.event = 'end' AND e.at >= r.at), "
        "  j.queue, j.partition, j.sequence "
        "FROM public.fault_runs r JOIN sqla_queue.jobs j ON j.id = r.job_id "
        "WHERE r.event = 'start'"
    )
    for job_id, attempt, pid, start, end, queue, partition, sequence in rows:
        if end is None:
            assert pid in killed_at, f"job {job_id}'s attempt {attempt} started and never ended"
            end = killed_at[pid]
        found.append((job_id, attempt, start, end, queue, partition, sequence))
    return found


def overlaps(intervals: list[tuple[datetime, datetime, int]], most: int) -> list[list[int]]:
    """Moments more than `most` intervals (start, end, job) are open at once: their jobs."""
    events = sorted(
        [(s, 1, j) for s, _, j in intervals] + [(e, 0, j) for _, e, j in intervals]
    )  # at one instant an end comes before a start
    open_: set[int] = set()
    found = []
    for _, starts, job in events:
        if starts:
            open_.add(job)
            if len(open_) > most:
                found.append(sorted(open_))
        else:
            open_.discard(job)
    return found


def check_intervals(db: FaultDatabase, killed_at: dict[int, datetime]) -> dict[str, int]:
    """No overlap where the rules forbid one; returns how many runs each kind checked."""
    groups: dict[tuple[str, Any], list[tuple[datetime, datetime, int]]] = defaultdict(list)
    for job_id, _, start, end, queue, partition, sequence in runs(db, killed_at):
        if sequence is not None:
            groups[("sequence", sequence)].append((start, end, job_id))
        if queue == "fair":
            groups[("partition", partition)].append((start, end, job_id))
        if queue == "lim":
            groups[("max-running", queue)].append((start, end, job_id))
    for (kind, name), intervals in groups.items():
        most = 2 if kind == "max-running" else 1
        found = overlaps(intervals, most)
        assert not found, f"{kind} {name!r}: more than {most} ran at once: jobs {found[:5]}"
    checked = {
        kind: sum(len(v) for (k, _), v in groups.items() if k == kind)
        for kind in ("sequence", "partition", "max-running")
    }
    assert all(checked.values()), f"a rule had no runs to check: {checked}"
    return checked
