"""Workflows run by real `sqla-queue worker` processes (issue 23's "done means").

The handlers (tests/helpers/apps/workflow_app.py) write a ledger of their starts and ends by the
database's clock; the tests check it against the graph: for every edge the parent's
completing attempt ended before any attempt of the child started, every node ran (to the
end) exactly once, failures cancel what depends on them and run the clean-ups, a retry
revives the graph, SIGKILLed workers lose nothing and run nothing early, the workers mint
no MultiXact, and a hot fan-in's lock waits are measured (printed for the record).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.apps.workflow_app import create_ledger
from helpers.fault_kit import FaultDatabase, WorkerProcess, libpq_dsn, wait_until
from helpers.multixact_support import admin_engine, count_multixacts
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from sqla_queue import Dependency, Queue, admin, enqueue, enqueue_many

StartWorker = Callable[..., WorkerProcess]
APP = "helpers.apps.workflow_app:registry"
QUEUE = "wf"
ENDED = ("done", "failed", "cancelled")


@dataclass
class Graph:
    """Jobs enqueued with their edges: `parents[child] = [(parent, on_failure), ...]`."""

    ids: dict[str, int] = field(default_factory=dict)
    parents: dict[int, list[tuple[int, str]]] = field(default_factory=dict)

    def edges(self) -> Iterator[tuple[int, int, str]]:
        for child, parents in self.parents.items():
            for parent, on_failure in parents:
                yield parent, child, on_failure


@dataclass
class Spec:
    """One node to enqueue: its task and args, and its parents by name."""

    task: str
    args: dict[str, Any]
    after: list[str | tuple[str, str]] = field(default_factory=list)
    """Parents by name; (name, "run") for an on_failure="run" edge."""


def enqueue_graph(url: str, specs: dict[str, Spec]) -> Graph:
    """Enqueue the nodes (parents named before their children) in one transaction, into
    the keeping queue QUEUE (finished rows stay to be read)."""
    engine = create_engine(url)
    graph = Graph()
    try:
        with Session(engine) as session, session.begin():
            admin.create_queue(session, QUEUE, "keep")
            jobs: dict[str, Any] = {}
            for name, spec in specs.items():
                depends = [
                    jobs[p] if isinstance(p, str) else Dependency(jobs[p[0]], on_failure=p[1])
                    for p in spec.after
                ]
                jobs[name] = enqueue(
                    session, spec.task, spec.args, queue=QUEUE, depends_on=depends or None
                )
            session.flush()
            graph.ids = {name: job.id for name, job in jobs.items()}
            for name, spec in specs.items():
                if spec.after:
                    graph.parents[graph.ids[name]] = [
                        (graph.ids[p], "cancel") if isinstance(p, str) else (graph.ids[p[0]], p[1])
                        for p in spec.after
                    ]
    finally:
        engine.dispose()
    return graph


def random_dag(rng: random.Random, size: int, sleep: float = 0.0) -> dict[str, Spec]:
    """`size` nodes; each depends on up to 3 of the 40 nodes before it (a few on none)."""
    specs: dict[str, Spec] = {}
    for i in range(size):
        window = list(range(max(0, i - 40), i))
        k = min(len(window), rng.choice([0, 1, 1, 2, 2, 3]))
        parents = [f"n{p}" for p in sorted(rng.sample(window, k))]
        specs[f"n{i}"] = Spec("node", {"n": i, "sleep": sleep * rng.random()}, list(parents))
    return specs


@dataclass(frozen=True)
class Attempt:
    job_id: int
    attempt: int
    started: float
    ended: float | None


def ledger(db: FaultDatabase) -> dict[int, list[Attempt]]:
    """Every attempt the handlers recorded, by job id, in attempt order."""
    found: dict[int, list[Attempt]] = {}
    for job_id, attempt, started, ended in db.rows(
        "SELECT job_id, attempt, extract(epoch FROM started)::float8, "
        "extract(epoch FROM ended)::float8 FROM public.wf_ledger ORDER BY job_id, attempt"
    ):
        found.setdefault(job_id, []).append(Attempt(job_id, attempt, started, ended))
    return found


def rows(db: FaultDatabase) -> dict[int, tuple[str, int, float | None, str | None]]:
    """(status, attempts, finished_at as epoch, last_error) of every job, by id (a kept
    job's in the history: `all_jobs`)."""
    return {
        job_id: (status, attempts, finished, error)
        for job_id, status, attempts, finished, error in db.rows(
            "SELECT id, status, attempts, extract(epoch FROM finished_at)::float8, last_error "
            "FROM sqla_queue.all_jobs"
        )
    }


def unended(db: FaultDatabase) -> int:
    return int(
        db.value("SELECT count(*) FROM sqla_queue.jobs WHERE status <> ALL(%s)", list(ENDED))
    )


def start_workers(workers: StartWorker, url: str, count: int, *options: str) -> list[WorkerProcess]:
    started = [workers(url, "-q", QUEUE, *options, app=APP) for _ in range(count)]
    for worker in started:
        worker.wait_started(90)  # a process's start takes tens of seconds on a loaded box
    return started


def stop_all(started: list[WorkerProcess]) -> str:
    """SIGTERM every live worker (each must exit 0); returns their logs, joined."""
    for worker in started:
        if worker.alive():
            assert worker.stop() == 0, worker.log()[-3000:]
    return "\n".join(w.log() for w in started)


def assert_no_early_start(graph: Graph, db: FaultDatabase) -> int:
    """For every 'cancel' edge whose child ran: the parent is done, and its completing
    attempt ended (and its row finished) before any attempt of the child started. Returns
    how many edges were checked."""
    runs, jobs = ledger(db), rows(db)
    checked = 0
    for parent, child, on_failure in graph.edges():
        if child not in runs or on_failure == "run":
            continue
        status, attempts, finished, _ = jobs[parent]
        assert status == "done", f"job {child} ran though its parent {parent} is {status}"
        completing = next(a for a in runs[parent] if a.attempt == attempts)
        assert completing.ended is not None
        assert finished is not None
        first_start = min(a.started for a in runs[child])
        assert completing.ended <= first_start, (
            f"job {child} started {completing.ended - first_start:.4f} s before its parent "
            f"{parent}'s handler ended"
        )
        assert finished <= first_start, (
            f"job {child} started before its parent {parent} was finished in the table"
        )
        checked += 1
    return checked


def assert_each_ran_once(ids: list[int], db: FaultDatabase) -> None:
    runs = ledger(db)
    counts = {i: len(runs.get(i, [])) for i in ids}
    assert set(counts.values()) == {1}, {i: c for i, c in counts.items() if c != 1}
    assert all(runs[i][0].ended is not None for i in ids)


def deadlocks(db: FaultDatabase) -> int:
    return int(
        db.value("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    )


@pytest.fixture
def wf_db(fault_db: FaultDatabase) -> FaultDatabase:
    create_ledger(fault_db.dsn)
    return fault_db


@pytest.mark.slow  # worker processes' start and stop on a loaded 2-core machine
def test_a_child_never_starts_before_all_its_parents_succeeded(
    wf_db: FaultDatabase, workers: StartWorker
) -> None:
    """A random DAG of 200 nodes, two worker processes: the ledger holds every edge."""
    specs = random_dag(random.Random(23), 200, sleep=0.01)
    started = start_workers(workers, wf_db.url, 2, "-c", "4")
    graph = enqueue_graph(wf_db.url, specs)
    wait_until(lambda: not unended(wf_db), 60, what="the DAG to finish")
    logs = stop_all(started)

    assert wf_db.status_counts() == {"done": 200}
    assert_each_ran_once(list(graph.ids.values()), wf_db)
    checked = assert_no_early_start(graph, wf_db)
    assert checked == sum(len(p) for p in graph.parents.values()) > 200
    assert "Traceback" not in logs
    print(f"\n{checked} edges held; deadlocks in the run: {logs.count('deadlock detected')}")


def fan_in(url: str, parents: int, child: bool = True) -> tuple[list[int], int]:
    """`parents` noop jobs and one `node` that depends on all of them (unless not `child`),
    in one transaction; their ids and the child's (0 without one)."""
    engine = create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            if not session.get(Queue, QUEUE):
                admin.create_queue(session, QUEUE, "keep")
            ids = enqueue_many(
                session,
                [{"task": "noop", "queue": QUEUE, "args": {"n": i}} for i in range(parents)],
            )
            if not child:
                return list(ids), 0
            job = enqueue(session, "node", {"n": -1}, queue=QUEUE, depends_on=list(ids), flush=True)
            return list(ids), job.id
    finally:
        engine.dispose()


def assert_fan_in_ran_once(db: FaultDatabase, ids: list[int], child: int) -> None:
    runs = ledger(db)
    assert list(runs) == [child], "only the child records; it ran"
    assert len(runs[child]) == 1, runs[child]
    assert runs[child][0].ended is not None
    last_parent = db.value(
        "SELECT extract(epoch FROM max(finished_at))::float8 FROM sqla_queue.all_jobs "
        "WHERE id = ANY(%s)",
        ids,
    )
    assert last_parent <= runs[child][0].started
    assert db.status_counts() == {"done": len(ids) + 1}
    # the child ran, so its count reached 0; done, it is in the history, which keeps no count
    assert db.value("SELECT count(*) FROM sqla_queue.jobs_history WHERE id = %s", child) == 1


@pytest.mark.slow  # worker processes' start and stop on a loaded 2-core machine
def test_a_fan_in_of_1000_parents_across_four_workers_runs_the_child_once(
    wf_db: FaultDatabase, workers: StartWorker
) -> None:
    started = start_workers(workers, wf_db.url, 4, "-c", "4")
    began = time.monotonic()
    ids, child = fan_in(wf_db.url, 1000)
    wait_until(lambda: not unended(wf_db), 60, interval=0.05, what="the fan-in to finish")
    took = time.monotonic() - began
    logs = stop_all(started)

    assert_fan_in_ran_once(wf_db, ids, child)
    assert "Traceback" not in logs
    print(f"\nfan-in of 1,000 parents, 4 workers at -c 4: enqueue to child done {took:.2f} s")


def test_a_failure_cancels_dependents_transitively_and_runs_the_clean_ups(
    wf_db: FaultDatabase, workers: StartWorker
) -> None:
    specs = {
        "a": Spec("boom", {"n": 0}),
        "s": Spec("node", {"n": 1}),
        "b": Spec("node", {"n": 2}, ["a"]),
        "c": Spec("node", {"n": 3}, ["b"]),
        "e": Spec("node", {"n": 4}, ["s", "a"]),
        "cleanup": Spec("node", {"n": 5}, [("a", "run")]),
        "cleanup_b": Spec("node", {"n": 6}, [("b", "run"), "s"]),
        "after_cleanup": Spec("node", {"n": 7}, ["cleanup"]),
    }
    started = start_workers(workers, wf_db.url, 1, "-c", "4")
    graph = enqueue_graph(wf_db.url, specs)
    wait_until(lambda: not unended(wf_db), 60, what="the workflow to settle")
    stop_all(started)

    ids, jobs, runs = graph.ids, rows(wf_db), ledger(wf_db)
    status = {name: jobs[ids[name]][0] for name in specs}
    assert status == {
        "a": "failed",
        "s": "done",
        "b": "cancelled",
        "c": "cancelled",
        "e": "cancelled",
        "cleanup": "done",
        "cleanup_b": "done",
        "after_cleanup": "done",
    }
    assert f"job {ids['a']} (boom), which it depends on, ended failed" in str(jobs[ids["b"]][3])
    assert f"job {ids['b']} (node), which it depends on, ended cancelled" in str(jobs[ids["c"]][3])
    assert {ids[n] for n in ("b", "c", "e")}.isdisjoint(runs), "a cancelled node ran"
    assert [len(runs[ids[n]]) for n in ("a", "s", "cleanup", "cleanup_b", "after_cleanup")] == [
        1
    ] * 5
    for parent, child in (("a", "cleanup"), ("b", "cleanup_b"), ("s", "cleanup_b")):
        finished = jobs[ids[parent]][2]
        assert finished is not None
        assert finished <= runs[ids[child]][0].started, (parent, child)
    assert_no_early_start(graph, wf_db)


def test_retrying_a_failed_parent_revives_its_dependents_which_then_run(
    wf_db: FaultDatabase, workers: StartWorker
) -> None:
    specs = {
        "a": Spec("flaky", {"n": 0}),
        "b": Spec("node", {"n": 1}, ["a"]),
        "c": Spec("node", {"n": 2}, ["b"]),
        "d": Spec("node", {"n": 3}, ["a", "b"]),
    }
    started = start_workers(workers, wf_db.url, 1, "-c", "4")
    graph = enqueue_graph(wf_db.url, specs)
    ids = graph.ids
    wait_until(lambda: not unended(wf_db), 60, what="the failure to settle")
    assert {n: rows(wf_db)[ids[n]][0] for n in specs} == {
        "a": "failed",
        "b": "cancelled",
        "c": "cancelled",
        "d": "cancelled",
    }
    engine = create_engine(wf_db.url)
    try:
        with engine.begin() as conn:
            assert list(admin.retry_jobs(conn, [ids["a"]])) == [ids["a"]]
    finally:
        engine.dispose()
    wait_until(lambda: not unended(wf_db), 60, what="the revived workflow to finish")
    stop_all(started)

    assert wf_db.status_counts() == {"done": 4}
    runs = ledger(wf_db)
    assert [a.attempt for a in runs[ids["a"]]] == [1, 2]
    assert_each_ran_once([ids[n] for n in "bcd"], wf_db)
    assert assert_no_early_start(graph, wf_db) == 4


@pytest.mark.slow
def test_sigkilled_workers_mid_workflow_lose_no_node_and_run_no_child_early(
    wf_db: FaultDatabase, workers: StartWorker
) -> None:
    """Chains and diamonds whose handlers sleep; each of the two workers is SIGKILLed once
    while handlers run, and replaced: the reaper brings their jobs back."""
    rng = random.Random(7)
    specs: dict[str, Spec] = {}
    for c in range(12):
        for i in range(4):
            after = [f"c{c}.{i - 1}"] if i else []
            specs[f"c{c}.{i}"] = Spec(
                "node", {"n": len(specs), "sleep": 0.2 + rng.random() / 5}, after
            )
    for d in range(10):
        top, left, right, bottom = (f"d{d}.{x}" for x in ("top", "left", "right", "bottom"))
        sleep = {"sleep": 0.2 + rng.random() / 5}
        specs[top] = Spec("node", {"n": len(specs), **sleep})
        specs[left] = Spec("node", {"n": len(specs), **sleep}, [top])
        specs[right] = Spec("node", {"n": len(specs), **sleep}, [top])
        specs[bottom] = Spec("node", {"n": len(specs), **sleep}, [left, right])
    started = start_workers(workers, wf_db.url, 2, "-c", "4")
    graph = enqueue_graph(wf_db.url, specs)

    def ledger_rows() -> int:
        return int(wf_db.value("SELECT count(*) FROM public.wf_ledger"))

    for victim, after_rows in ((0, 12), (1, 40)):
        wait_until(lambda n=after_rows: ledger_rows() >= n, 60, what=f"{after_rows} starts")
        started[victim].kill()
        started.append(workers(wf_db.url, "-q", QUEUE, "-c", "4", app=APP))
    wait_until(lambda: not unended(wf_db), 90, what="every node to finish after the kills")
    logs = stop_all(started)

    ids = list(graph.ids.values())
    assert wf_db.status_counts() == {"done": len(ids)}, "no node lost"
    runs = ledger(wf_db)
    assert set(runs) == set(ids)
    jobs = rows(wf_db)
    for job_id in ids:
        completing = [a for a in runs[job_id] if a.attempt == jobs[job_id][1]]
        assert completing, (job_id, runs[job_id])
        assert completing[0].ended is not None, (job_id, runs[job_id])
    assert assert_no_early_start(graph, wf_db) == sum(len(p) for p in graph.parents.values())
    again = sum(1 for attempts in runs.values() if len(attempts) > 1)
    assert again >= 1, "a killed worker's node ran again (the kills landed mid-handler)"
    assert "Traceback" not in logs
    print(f"\n{len(ids)} nodes, 2 SIGKILLs: {again} node(s) ran again, none early")


@pytest.mark.slow
def test_workers_mint_no_multixacts_on_a_workflow(private_url: str, workers: StartWorker) -> None:
    """A random DAG with a fan-in, a failing node, cancel and run edges, on the private
    cluster (MultiXact ids are cluster-wide), the default schema (its queue check locks
    nothing)."""
    engine = create_engine(private_url)
    admin_db = admin_engine(private_url)
    db = FaultDatabase(private_url)
    try:
        create_ledger(libpq_dsn(private_url))
        specs = random_dag(random.Random(5), 300)
        specs["fail"] = Spec("boom", {"n": 300}, ["n10"])
        specs["cancelled"] = Spec("node", {"n": 301}, ["fail", "n20"])
        specs["cleanup"] = Spec("node", {"n": 302}, [("fail", "run"), ("cancelled", "run")])
        specs["fan_in"] = Spec("node", {"n": 303}, [f"n{i}" for i in range(300)])
        started = start_workers(workers, private_url, 2, "-c", "8")
        holder: dict[str, Graph] = {}
        minted_enqueue = count_multixacts(
            admin_db, lambda: holder.setdefault("graph", enqueue_graph(private_url, specs))
        )

        def run() -> None:
            wait_until(lambda: not unended(db), 90, what="the workflow to finish")

        minted = count_multixacts(admin_db, run)
        stop_all(started)
        assert db.status_counts() == {"done": 302, "failed": 1, "cancelled": 1}
        assert minted == 0
        print(
            f"\nMultiXacts: workers {minted}, the enqueue of {len(specs)} linked jobs "
            f"{minted_enqueue}"
        )
    finally:
        db.close()
        admin_db.dispose()
        engine.dispose()


class WaitSampler:
    """Samples, every few ms, the backends of one database that wait for a lock on a
    transaction or a tuple (a row lock): how many samples saw any, and at most how many."""

    def __init__(self, url: str) -> None:
        self.engine = admin_engine(url)
        self.samples = 0
        self.waiting: Counter[int] = Counter()
        self.events: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = text(
            "SELECT wait_event FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                events = [row[0] for row in conn.execute(query)]
                self.samples += 1
                self.waiting[len(events)] += 1
                self.events.update(events)
                time.sleep(0.005)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.engine.dispose()

    def summary(self) -> str:
        with_waits = self.samples - self.waiting[0]
        most = max(self.waiting)
        return (
            f"{self.samples} samples, {with_waits} ({100 * with_waits / max(self.samples, 1):.1f}%)"
            f" saw a backend waiting on a lock, at most {most} at once; "
            f"by wait event: {dict(self.events)}"
        )


HOT_PARENTS = 10_000


@pytest.mark.slow
def test_lock_waits_on_a_hot_fan_in_of_16_handlers_are_measured_and_the_child_runs_once(
    wf_db: FaultDatabase, workers: StartWorker
) -> None:
    """10,000 parents of one child, finished by 16 concurrent handlers (4 worker processes
    at -c 4): the last parent's transaction promotes the child, which runs once. Every
    finishing statement decrements the child's counter, so finishers in different
    processes queue on its row lock; the waits are sampled and printed."""
    started = start_workers(workers, wf_db.url, 4, "-c", "4")
    with WaitSampler(wf_db.url) as plain:  # the same drain without the child, to compare
        began = time.monotonic()
        fan_in(wf_db.url, HOT_PARENTS, child=False)
        wait_until(lambda: not unended(wf_db), 120, interval=0.05, what="the plain drain")
        plain_took = time.monotonic() - began
    wf_db.conn.execute("DELETE FROM sqla_queue.jobs")
    wf_db.conn.execute("DELETE FROM sqla_queue.jobs_history")  # the kept jobs are there
    locks_before = deadlocks(wf_db)
    with WaitSampler(wf_db.url) as sampler:
        began = time.monotonic()
        ids, child = fan_in(wf_db.url, HOT_PARENTS)
        enqueued = time.monotonic() - began
        wait_until(lambda: not unended(wf_db), 120, interval=0.05, what="the hot fan-in")
        took = time.monotonic() - began
    logs = stop_all(started)

    assert_fan_in_ran_once(wf_db, ids, child)
    assert "Traceback" not in logs
    print(
        f"\nhot fan-in: {HOT_PARENTS:,} parents, 4 workers at -c 4: enqueue {enqueued:.2f} s, "
        f"enqueue to child done {took:.2f} s; lock waits: {sampler.summary()}; "
        f"deadlocks {deadlocks(wf_db) - locks_before}\nthe same {HOT_PARENTS:,} jobs without "
        f"the child: {plain_took:.2f} s; lock waits: {plain.summary()}"
    )
