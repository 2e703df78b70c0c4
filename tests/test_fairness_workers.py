"""Fair queues, partition limits, priority aging, sequences and debounce (issue 24) with real
`sqla-queue worker` processes (tests/fault_kit.py), whose handlers (tests/fault_app.py, task
`keyed`) note each attempt's start and end in `public.fault_runs`, the test's own ledger.

The claim statement enforces all of it (tests/test_fairness.py checks it claim by claim);
these tests check what a user sees of it across worker processes: killed ones included.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from fault_kit import (
    FaultDatabase,
    WorkerProcess,
    holding_workers,
    run_cli,
    wait_until,
)
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from sqla_queue import enqueue_many

StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def ledger(fault_db: FaultDatabase) -> FaultDatabase:
    """`fault_db` whose `fault_runs` rows also carry `n`, the order in which they were
    written: a sequence's nextval, taken when the insert runs, so a write that happened
    after another (causally: the end of a job, then its successor's claim and start) has
    the higher `n`, whatever the clock did."""
    fault_db.conn.execute("ALTER TABLE public.fault_runs ADD COLUMN n bigserial")
    return fault_db


@pytest.fixture
def queue_engine(fault_db: FaultDatabase) -> Iterator[Engine]:
    engine = create_engine(fault_db.url)
    yield engine
    engine.dispose()


def create_queue(db: FaultDatabase, name: str, *settings: str) -> None:
    """`sqla-queue queues create NAME --retention keep SETTINGS` (kept rows are counted)."""
    result = run_cli(["queues", "create", name, "--retention", "keep", *settings], db.url)
    assert result.returncode == 0, result.stderr


def enqueue_rows(engine: Engine, rows: list[dict[str, Any]]) -> list[int]:
    with Session(engine) as session, session.begin():
        return list(enqueue_many(session, rows))


def starts_and_ends(db: FaultDatabase, queue: str) -> list[tuple[Any, ...]]:
    """(n, job id, attempt, pid, event word, the handler's `n` arg, partition, sequence,
    seconds since the epoch) of every note of the `keyed` jobs of `queue`, in write order."""
    rows = db.rows(
        "SELECT r.n, r.job_id, r.attempt, r.pid, split_part(r.event, ' ', 1),"
        " split_part(r.event, ' ', 2)::int, j.partition, j.sequence, extract(epoch FROM r.at)"
        " FROM public.fault_runs r JOIN sqla_queue.jobs j ON j.id = r.job_id"
        " WHERE j.queue = %s ORDER BY r.n",
        queue,
    )
    return [(*row[:8], float(row[8])) for row in rows]


def wait_drained(db: FaultDatabase, queue: str, timeout: float) -> None:
    wait_until(
        lambda: (
            not db.value(
                "SELECT count(*) FROM sqla_queue.jobs WHERE queue = %s"
                " AND status IN ('queued', 'running')",
                queue,
            )
        ),
        timeout,
        interval=0.2,
        what=f"queue {queue} to drain",
    )


def stop_all(pool: list[WorkerProcess]) -> None:
    for worker in pool:
        worker.wait_started()
        assert worker.stop() == 0, worker.log()[-2000:]


# -- 1. sequences under faults -----------------------------------------------------------------

SEQ_KEYS = 1000
SEQ_JOBS_PER_KEY = 20
SEQ_WORKERS = 4
KILL_EVERY = 3.0  # seconds between two SIGKILLs
SEQ_DEADLINE = 220.0
SEQ_LEASE = "2"


def check_sequences(
    events: list[tuple[Any, ...]], ids_by_key: dict[str, list[int]], killed_pids: set[int]
) -> dict[str, int]:
    """Order violations and overlaps in the ledger, key by key (see the test's docstring)."""
    by_key: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for event in events:
        by_key[event[7]].append(event)
    figures = Counter[str]()
    problems: list[str] = []
    for key, ids in ids_by_key.items():
        rank = {job_id: i for i, job_id in enumerate(ids)}
        ended: set[int] = set()  # jobs of the key with an end
        highest_started = -1
        open_attempt: tuple[int, int, int] | None = None  # (job id, attempt, pid)
        for n, job_id, attempt, pid, word, _, _, _, _ in by_key[key]:
            if word == "started":
                figures["starts"] += 1
                if open_attempt is not None:
                    if open_attempt[0] != job_id or open_attempt[2] not in killed_pids:
                        problems.append(f"overlap in {key}: {open_attempt} open at start #{n}")
                    figures["killed attempts closed by their job's next start"] += 1
                missing = [j for j in ids[: rank[job_id]] if j not in ended]
                if missing or rank[job_id] < highest_started:
                    problems.append(f"order in {key}: job {job_id} started (#{n}) before {missing}")
                highest_started = max(highest_started, rank[job_id])
                open_attempt = (job_id, attempt, pid)
            else:
                if open_attempt != (job_id, attempt, pid):
                    problems.append(f"overlap in {key}: end #{n} of {job_id} not the open attempt")
                ended.add(job_id)
                open_attempt = None
        if open_attempt is not None:
            problems.append(f"{key}: attempt {open_attempt} never ended nor ran again")
        if ended != set(ids):
            problems.append(f"{key}: jobs {sorted(set(ids) - ended)} never ended")
    assert not problems, f"{len(problems)} violations, first: {problems[:5]}"
    return dict(figures)


@pytest.mark.slow
def test_sequences_run_in_order_one_at_a_time_while_workers_are_killed(
    ledger: FaultDatabase,
    queue_engine: Engine,
    workers: StartWorker,
    record_property: Callable[[str, Any], None],
) -> None:
    """1,000 keys x 20 jobs, 4 workers, one SIGKILLed every few seconds and restarted.

    Enqueued interleaved (the first job of every key, then the second of every key, ...):
    the order events of many keys arrive in, and the cheap order for the claim, which reads
    due jobs by id and skips the ones whose sequence an earlier job holds. Interleaved, the
    first rows it reads are the keys' next jobs; key-major, every key it passes would make
    it step over up to 19 held jobs of that key first.

    The ledger is `fault_runs` in write order (`n`). Per key, walking it:
    - order: a job starts only when every lower-id job of its key has an end, and never
      after a higher-id job of its key started;
    - overlap: between a start and its end (same job, attempt and pid) no other start of
      the key. A SIGKILLed attempt has no end: its job stays `running` (holding its
      sequence, so nothing later of the key can be claimed) until its lease expires, the
      reaper requeues it and a claim runs it again. That next start of the same job is
      the first note of the key after the killed one, so it closes the killed attempt;
      the test checks that the attempt so closed was that job's and ran in a process it
      SIGKILLed (any other unended attempt is an overlap). An attempt killed after its
      end was noted, before its success was written, runs again, after its end: allowed
      (at least once), unless a later job of the key had started meanwhile (order).
    """
    create_queue(ledger, "seqs")
    rows = [
        {
            "task": "keyed",
            "queue": "seqs",
            "sequence": f"k{key}",
            "args": {"key": f"k{key}", "n": position},
        }
        for position in range(SEQ_JOBS_PER_KEY)
        for key in range(SEQ_KEYS)
    ]
    ids = enqueue_rows(queue_engine, rows)
    ids_by_key: dict[str, list[int]] = defaultdict(list)
    for row, job_id in zip(rows, ids, strict=True):
        ids_by_key[row["sequence"]].append(job_id)

    options = ["-q", "seqs", "-c", "4", "--lease", SEQ_LEASE, "--poll-interval", "0.5"]
    pool = [workers(ledger.url, *options) for _ in range(SEQ_WORKERS)]
    killed_pids: set[int] = set()
    start = time.monotonic()
    next_kill = start + KILL_EVERY
    while ledger.unfinished():
        assert time.monotonic() - start < SEQ_DEADLINE, f"not drained: {ledger.status_counts()}"
        time.sleep(0.2)
        if time.monotonic() >= next_kill:
            holders = holding_workers(ledger, pool) or pool
            victim = holders[len(killed_pids) % len(holders)]
            killed_pids.add(victim.pid)
            victim.kill()
            victim.start()
            next_kill = time.monotonic() + KILL_EVERY
    elapsed = time.monotonic() - start
    stop_all(pool)

    assert ledger.status_counts() == {"done": len(ids)}
    figures = check_sequences(starts_and_ends(ledger, "seqs"), ids_by_key, killed_pids)
    reaped = ledger.value(
        "SELECT count(*) FROM sqla_queue.jobs WHERE last_error LIKE 'lease expired%%'"
    )
    figures |= {"jobs": len(ids), "kills": len(killed_pids), "reaped": reaped}
    record_property("figures", figures)
    print(f"\nsequences under kills: {figures} in {elapsed:.1f} s")
    assert reaped > 0, "no kill orphaned a job: the reaper was not exercised"
    assert figures["killed attempts closed by their job's next start"] > 0


def ledger_note(n: int, job_id: int, word: str, pid: int = 10, attempt: int = 1) -> tuple[Any, ...]:
    """A synthetic ledger row of key `k` (as `starts_and_ends` returns them)."""
    return (n, job_id, attempt, pid, word, 0, None, "k", 0.0)


STARTED_ENDED_STARTED = [
    ledger_note(1, 1, "started"),
    ledger_note(2, 1, "finished"),
    ledger_note(3, 2, "started"),
]


def test_the_sequence_check_closes_a_killed_attempt_at_its_jobs_next_start() -> None:
    rerun = [ledger_note(4, 2, "started", 11, 2), ledger_note(5, 2, "finished", 11, 2)]
    figures = check_sequences([*STARTED_ENDED_STARTED, *rerun], {"k": [1, 2]}, killed_pids={10})
    assert figures == {"starts": 3, "killed attempts closed by their job's next start": 1}


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([ledger_note(1, 1, "started"), ledger_note(2, 2, "started")], id="overlap"),
        pytest.param([ledger_note(1, 2, "started"), ledger_note(2, 2, "finished")], id="order"),
        pytest.param(STARTED_ENDED_STARTED, id="never ended"),
        # an attempt without an end in a process the test did not kill: an overlap
        pytest.param(
            [*STARTED_ENDED_STARTED, ledger_note(4, 2, "started", attempt=2)], id="not killed"
        ),
    ],
)
def test_the_sequence_check_finds_overlaps_order_violations_and_lost_attempts(
    events: list[tuple[Any, ...]],
) -> None:
    with pytest.raises(AssertionError, match="violations"):
        check_sequences(events, {"k": [1, 2]}, killed_pids=set())


# -- 2. partition limit --------------------------------------------------------------------------

PARTITION_LIMIT = 2
PARTITIONS = 5
JOBS_PER_PARTITION = 80
HANDLER_SECONDS = 0.05


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The most intervals (start, end) open at one point of the ledger's order."""
    steps = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = most = 0
    for _, step in steps:
        open_now += step
        most = max(most, open_now)
    return most


@pytest.mark.slow
def test_no_partition_runs_more_than_its_limit_across_three_workers(
    ledger: FaultDatabase, queue_engine: Engine, workers: StartWorker
) -> None:
    create_queue(ledger, "tenants", "--partition-limit", str(PARTITION_LIMIT))
    pool = [workers(ledger.url, "-q", "tenants", "-c", "8") for _ in range(3)]
    for worker in pool:
        worker.wait_started()
    samples: list[dict[str, int]] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(ledger.dsn, autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute(
                    "SELECT partition, count(*) FROM sqla_queue.jobs WHERE status = 'running'"
                    " GROUP BY partition"
                ).fetchall()
                samples.append(dict(rows))
                time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rows = [
            {
                "task": "keyed",
                "queue": "tenants",
                "partition": f"t{p}",
                "args": {"key": f"t{p}", "n": n, "seconds": HANDLER_SECONDS},
            }
            for n in range(JOBS_PER_PARTITION)
            for p in range(PARTITIONS)
        ]
        started = time.monotonic()
        ids = enqueue_rows(queue_engine, rows)
        wait_drained(ledger, "tenants", 120)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        sampler.join(10)
    stop_all(pool)

    assert ledger.status_counts() == {"done": len(ids)}
    peak = Counter[str]()
    for counts in samples:
        for partition, running in counts.items():
            peak[partition] = max(peak[partition], running)
    opened: dict[tuple[int, int], int] = {}
    intervals: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for n, job_id, attempt, _, word, _, partition, _, _ in starts_and_ends(ledger, "tenants"):
        if word == "started":
            opened[job_id, attempt] = n
        else:
            intervals[partition].append((opened.pop((job_id, attempt)), n))
    assert not opened, "every attempt ended (no worker was killed)"
    in_ledger = {partition: most_at_once(spans) for partition, spans in intervals.items()}
    print(
        f"\n{len(ids)} jobs in {elapsed:.1f} s; {len(samples)} samples, most running by "
        f"partition: sampled {dict(peak)}, ledger {in_ledger}"
    )
    assert len(samples) > 50
    assert Counter(len(spans) for spans in intervals.values()) == {JOBS_PER_PARTITION: PARTITIONS}
    assert max(peak.values()) <= PARTITION_LIMIT, peak
    assert max(in_ledger.values()) <= PARTITION_LIMIT, in_ledger
    assert set(in_ledger.values()) == {PARTITION_LIMIT}, "every partition reached its limit"
