"""Fair queues, partition limits, priority aging, sequences and debounce (issue 24) with real
`sqla-queue worker` processes (tests/helpers/fault_kit.py), whose handlers
(tests/helpers/apps/fault_app.py, task `keyed`) note each attempt's start and end in
`public.fault_runs`, the test's own ledger.

The claim statement enforces all of it (tests/worker/test_fairness.py checks it claim by claim);
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
from helpers.fault_kit import (
    FaultDatabase,
    WorkerProcess,
    holding_workers,
    run_cli,
    wait_until,
)
from helpers.multixact_support import admin_engine, count_multixacts
from helpers.support import WorkerThread, count_where, wait_for
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session

from sqla_queue import Registry, Unique, admin, enqueue, enqueue_many
from sqla_queue.admin import create_queue as create_queue_api
from sqla_queue.admin import partitions

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
        " FROM public.fault_runs r JOIN sqla_queue.all_jobs j ON j.id = r.job_id"
        " WHERE j.queue = %s ORDER BY r.n",
        queue,
    )
    return [(*row[:8], float(row[8])) for row in rows]


def wait_drained(db: FaultDatabase, queue: str, timeout: float) -> None:
    wait_until(
        lambda: (
            not db.value(
                "SELECT count(*) FROM sqla_queue.all_jobs WHERE queue = %s"
                " AND status IN ('queued', 'running')",
                queue,
            )
        ),
        timeout,
        interval=0.2,
        what=f"queue {queue} to drain",
    )


def stop_each_once_started(pool: list[WorkerProcess]) -> None:
    for worker in pool:
        worker.wait_started()
        assert worker.stop() == 0, worker.log()[-2000:]


# -- 1. sequences under faults -----------------------------------------------------------------

SEQ_KEYS = 1000
SEQ_JOBS_PER_KEY = 20
SEQ_WORKERS = 4
KILL_EVERY = 3.0  # seconds between two SIGKILLs
SEQ_DEADLINE = 600.0  # a hang guard, not a speed target: CI at load 10-19 drained 2/3 in 220 s
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
@pytest.mark.timeout(SEQ_DEADLINE + 120)
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
    rows: list[dict[str, Any]] = [
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
    stop_each_once_started(pool)

    assert ledger.status_counts() == {"done": len(ids)}
    figures = check_sequences(starts_and_ends(ledger, "seqs"), ids_by_key, killed_pids)
    reaped = ledger.value(
        "SELECT count(*) FROM sqla_queue.all_jobs WHERE last_error LIKE 'lease expired%%'"
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
    stop_each_once_started(pool)

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


# -- 3. aging ----------------------------------------------------------------------------------

AGING = 0.5  # seconds per priority step
CLAIM_ROUND = 1.0
"""One claim round of a worker at -c 1 that claims one job at a time: the 20 ms job in hand,
then the claim; a second of it, for a loaded 2-core machine."""
CLOCK_SLACK = 0.001
"""A millisecond past the 9th interval: a claim at that instant is sure to see priority 0."""
AGING_BOUND = 9 * AGING + CLAIM_ROUND
"""A priority-9 job of an aging queue is at effective priority 0 once it has waited 9
intervals, and then the oldest job at the best priority: the next claim takes it."""
BACKLOG = 60  # priority-0 jobs the producer keeps queued (about 1 s of the worker's work)


def record_rows(queue: str, count: int) -> list[dict[str, Any]]:
    return [{"task": "record", "queue": queue, "args": {"n": 0, "work": 0.02}}] * count


def run_starved(
    ledger: FaultDatabase,
    engine: Engine,
    workers: StartWorker,
    starved: list[str],
    served: list[str],
    deep: list[str],
) -> tuple[dict[str, tuple[float, float]], int, float]:
    """A priority-9 job in each queue of `starved`, one worker (-c 1, one job per claim)
    for each `-q` value of `served`, while a producer keeps each queue of `deep` at
    `BACKLOG` fresh priority-0 jobs, until the starved jobs have waited past `AGING_BOUND`.
    Returns, by queue, when each starved job was due and when a claim took it (epoch
    seconds by the database's clock; none if no claim did), the fewest priority-0 jobs
    a deep queue held at a look, and when the producer stopped (the database's clock:
    the workers drain the backlog left after it, so a starved job may start then)."""
    options = ["-c", "1", "--batch", "1", "--max-batch", "1", "--poll-interval", "0.2"]
    pool = [workers(ledger.url, "-q", queues, *options) for queues in served]
    for worker in pool:
        worker.wait_started()
    # with their backlog from the start: alone, the jobs would run at once
    first = [
        {"task": "keyed", "queue": queue, "priority": 9, "args": {"key": "p9", "n": 0}}
        for queue in starved
    ]
    ids = enqueue_rows(engine, first + [job for q in deep for job in record_rows(q, BACKLOG)])
    due = "SELECT extract(epoch FROM run_at) FROM sqla_queue.all_jobs WHERE id = %s"
    due_at = [float(ledger.value(due, job_id)) for job_id in ids[: len(starved)]]
    stop = threading.Event()
    least_queued: list[int] = []

    def keep_deep() -> None:
        """Top the deep queues up to `BACKLOG` queued priority-0 jobs every 50 ms."""
        while not stop.is_set():
            depth = dict(
                ledger.rows(
                    "SELECT queue, count(*) FROM sqla_queue.jobs WHERE status = 'queued'"
                    " AND priority = 0 GROUP BY queue"
                )
            )
            least_queued.append(min(depth.get(q, 0) for q in deep))
            fresh = [job for q in deep for job in record_rows(q, BACKLOG - depth.get(q, 0))]
            if fresh:
                enqueue_rows(engine, fresh)
            time.sleep(0.05)

    producer = threading.Thread(target=keep_deep)
    producer.start()
    try:
        waited = "SELECT extract(epoch FROM now() - run_at) FROM sqla_queue.all_jobs WHERE id = %s"
        wait_until(
            lambda: ledger.value(waited, ids[0]) > AGING_BOUND + 0.5,
            AGING_BOUND + 30,
            what="the bound to pass",
        )
    finally:
        stop.set()
        producer.join(10)
    deep_until = float(ledger.value("SELECT extract(epoch FROM now())"))
    stop_each_once_started(pool)
    aged = dict(zip(starved, due_at, strict=True))
    started = dict(
        ledger.rows(
            "SELECT r.job_id, extract(epoch FROM r.claimed_at)::float FROM public.fault_runs r"
            " WHERE r.job_id = ANY(%s) AND r.event LIKE 'started%%'",
            ids[: len(starved)],
        )
    )
    taken = {
        queue: (aged[queue], started[job_id])
        for queue, job_id in zip(starved, ids, strict=False)
        if job_id in started
    }
    return taken, min(least_queued), deep_until


def claims_between(ledger: FaultDatabase, queues: list[str], after: float, before: float) -> int:
    """How many claims of `queues` took a `record` job between two times (epoch seconds,
    the claims' own clock)."""
    return int(
        ledger.value(
            "SELECT count(*) FROM public.fault_runs r JOIN sqla_queue.all_jobs j ON j.id = r.job_id"
            " WHERE j.queue = ANY(%s) AND r.event = 'ran'"
            " AND r.claimed_at > to_timestamp(%s) AND r.claimed_at < to_timestamp(%s)",
            queues,
            after,
            before,
        )
    )


def claims_after_aging(ledger: FaultDatabase, queues: list[str], due: float, taken: float) -> int:
    """How many claims of `queues` took another job after a priority-9 job due at `due`
    had waited 9 aging intervals (effective priority 0, the oldest at the best priority)
    and before the claim that took it at `taken`; asserts that claims did pass it over
    before it aged (else the count proves nothing)."""
    assert claims_between(ledger, queues, due, due + 9 * AGING) > 0, "nothing passed it over"
    return claims_between(ledger, queues, due + 9 * AGING + CLOCK_SLACK, taken)


@pytest.mark.slow
def test_an_aging_queue_starts_a_starved_low_priority_job_within_its_bound(
    ledger: FaultDatabase, queue_engine: Engine, workers: StartWorker
) -> None:
    """Two queues kept deep in fresh priority-0 jobs by a producer, one worker (-c 1) each:
    the priority-9 job of the aging one is taken by the first claim after it has waited 9
    intervals (its bound: no claim in between took another job, by the claims' own clock);
    that of the queue without aging (the control) has not started by `AGING_BOUND`."""
    create_queue(ledger, "aging", "--aging", f"{AGING}s")
    create_queue(ledger, "plain")
    queues = ["aging", "plain"]
    taken, least, deep_until = run_starved(ledger, queue_engine, workers, queues, queues, queues)
    delays = {queue: at - due for queue, (due, at) in taken.items()}
    print(
        f"\naging {AGING} s: a claim took the priority-9 job {delays.get('aging')} s after it "
        f"was due; control: {delays.get('plain')}; the fewest priority-0 jobs queued at a "
        f"look {least}"
    )
    assert least > 0, "the queues ran dry: nothing starved the job"
    assert "aging" in taken, "the aged job never started"
    # by the claims' own clock: not before it aged, and by the first claim after it had
    # (a count of what the claims decided, not a duration a loaded machine can stretch)
    assert delays["aging"] >= 9 * AGING
    assert claims_after_aging(ledger, ["aging"], *taken["aging"]) == 0
    # the control: not taken while the producer kept its queue deep (once it stopped, the
    # workers drain what is left, the priority-9 job last: a loaded machine's slow stop)
    assert "plain" not in taken or taken["plain"][1] >= deep_until, (
        f"without aging the priority-9 job ran with a backlog: {taken['plain']}, the "
        f"producer stopped at {deep_until}"
    )


@pytest.mark.slow
def test_an_aged_job_is_not_starved_by_another_queue_its_worker_serves(
    ledger: FaultDatabase, queue_engine: Engine, workers: StartWorker
) -> None:
    """As above, but the worker serves the aging queue and a plain one, and only the plain
    one is kept deep: the aged job is at effective priority 0 and the oldest due job after 9
    intervals, yet no claim takes it."""
    create_queue(ledger, "aging", "--aging", f"{AGING}s")
    create_queue(ledger, "busy")
    taken, least, _ = run_starved(
        ledger, queue_engine, workers, ["aging"], ["aging,busy"], ["busy"]
    )
    assert least > 0
    assert "aging" in taken, "the aged job never started"
    due, at = taken["aging"]
    print(f"\naging job of a worker of two queues taken {at - due:.2f} s after it was due")
    assert at - due >= 9 * AGING
    assert claims_after_aging(ledger, ["aging", "busy"], due, at) == 0


# -- 4. debounce and throttle ------------------------------------------------------------------

DEBOUNCE = Unique(args=["key"], on_conflict="replace")
THROTTLE = Unique(args=["key"], on_conflict="replace_args")
CALLS = 50
DELAY = 2.0


def enqueue_keyed(
    engine: Engine, calls: list[tuple[str, int, Unique]], **options: Any
) -> list[tuple[int, bool, float]]:
    """Enqueue `keyed` jobs (key, n, unique) in a transaction of their own; returns (each
    job's id, whether it was a duplicate, the transaction's now() in epoch seconds: `delay`
    counts from it)."""
    with Session(engine) as session, session.begin():
        extra = options.pop("args", {})
        handles = [
            enqueue(session, "keyed", {"key": key, "n": n, **extra}, unique=unique, **options)
            for key, n, unique in calls
        ]
        now = float(session.execute(select(func.extract("epoch", func.now()))).scalar_one())
        return [(handle.id, handle.duplicate, now) for handle in handles]


def test_debounce_and_throttle_with_a_worker_run_once_with_the_last_args(
    ledger: FaultDatabase, queue_engine: Engine, workers: StartWorker
) -> None:
    """50 calls of each key paced over 0.8 s, each with `delay` 2 s: `replace` (debounce)
    runs the handler once, with the last call's args, `delay` after the last call;
    `replace_args` (throttle) runs it once, with the last args, at the first call's run_at."""
    create_queue(ledger, "keys")
    worker = workers(ledger.url, "-q", "keys", "-c", "2", "--poll-interval", "0.1")
    worker.wait_started()
    called: dict[str, list[float]] = {"debounced": [], "throttled": []}
    # Every call must land before either job starts: on a loaded machine the 50 calls can
    # take longer than the throttled job's DELAY, so the queue is paused while they land
    # (a paused queue's jobs are replaced as any queued job) and resumed after the last.
    with queue_engine.begin() as conn:
        admin.set_paused(conn, "keys", True)
    begin = time.monotonic()
    for n in range(CALLS):  # one call of each key per transaction, paced over 0.8 s
        time.sleep(max(0.0, begin + n * 0.8 / CALLS - time.monotonic()))
        calls = [("debounced", n, DEBOUNCE), ("throttled", n, THROTTLE)]
        for (key, _, _), (_, _, now) in zip(
            calls, enqueue_keyed(queue_engine, calls, queue="keys", delay=DELAY), strict=True
        ):
            called[key].append(now)
    with queue_engine.begin() as conn:
        admin.set_paused(conn, "keys", False)
    wait_drained(ledger, "keys", 60)
    time.sleep(1.0)  # a second run would have started by now
    worker.wait_started()
    assert worker.stop() == 0

    key_of = dict(ledger.rows("SELECT id, args->>'key' FROM sqla_queue.all_jobs"))
    runs: dict[str, list[tuple[int, float]]] = {key: [] for key in called}
    for _, job_id, _, _, word, args, _, _, at in starts_and_ends(ledger, "keys"):
        if word == "started":
            runs[key_of[job_id]].append((args, at))
    jobs = dict(ledger.rows("SELECT args->>'key', count(*) FROM sqla_queue.all_jobs GROUP BY 1"))
    due = dict(
        ledger.rows(
            "SELECT args->>'key', extract(epoch FROM run_at)::float FROM sqla_queue.all_jobs"
        )
    )
    first, last = called["debounced"][0], called["debounced"][-1]
    print(
        f"\n{CALLS} calls each in {last - first:.2f} s: debounced ran {runs['debounced']}, "
        f"{runs['debounced'][0][1] - last:.2f} s after the last call; throttled ran "
        f"{runs['throttled']}, {runs['throttled'][0][1] - called['throttled'][0]:.2f} s after "
        "the first"
    )
    assert jobs == {"debounced": 1, "throttled": 1}
    assert ledger.status_counts() == {"done": 2}
    ((args, at),) = runs["debounced"]
    assert args == CALLS - 1
    assert at >= called["debounced"][-1] + DELAY
    ((args, at),) = runs["throttled"]
    assert args == CALLS - 1
    assert due["throttled"] == pytest.approx(called["throttled"][0] + DELAY, abs=0.001)
    assert at >= due["throttled"]  # not pushed back: its stored run_at is the first call's


def test_a_running_job_keeps_its_args_and_a_replacing_call_becomes_a_new_job(
    ledger: FaultDatabase, queue_engine: Engine, workers: StartWorker
) -> None:
    """A `replace` call while the job holding its key runs: the running job keeps its args,
    the call writes a new job. That job is not held back until the running one ends (a
    free slot runs it at once); with the key as its `sequence` too, it waits for the end."""
    create_queue(ledger, "keys")
    worker = workers(ledger.url, "-q", "keys", "-c", "4", "--poll-interval", "0.1")
    first = {"args": {"seconds": 1.5}, "queue": "keys"}
    held = {
        "free": enqueue_keyed(queue_engine, [("free", 1, DEBOUNCE)], **first)[0][0],
        "sequenced": enqueue_keyed(
            queue_engine, [("sequenced", 1, DEBOUNCE)], sequence="sequenced", **first
        )[0][0],
    }
    wait_until(
        lambda: all(ledger.events(job_id) for job_id in held.values()),
        60,
        what="the first jobs to start",
    )
    replacing = {
        "free": enqueue_keyed(queue_engine, [("free", 2, DEBOUNCE)], queue="keys")[0],
        "sequenced": enqueue_keyed(
            queue_engine, [("sequenced", 2, DEBOUNCE)], queue="keys", sequence="sequenced"
        )[0],
    }
    wait_drained(ledger, "keys", 60)
    worker.wait_started()
    assert worker.stop() == 0

    notes = {
        (job_id, word): (args, n)
        for n, job_id, _, _, word, args, *_ in starts_and_ends(ledger, "keys")
    }
    args = dict(ledger.rows("SELECT id, (args->>'n')::int FROM sqla_queue.all_jobs"))
    assert ledger.status_counts() == {"done": 4}
    for key, (new, duplicate, _) in replacing.items():
        old = held[key]
        assert (duplicate, new != old) == (False, True)
        assert (args[old], args[new]) == (1, 2)
        assert [notes[old, "started"][0], notes[old, "finished"][0]] == [1, 1]
        assert [notes[new, "started"][0], notes[new, "finished"][0]] == [2, 2]
        assert notes[new, "started"][1] > notes[old, "started"][1]
    overlapped = notes[replacing["free"][0], "started"][1] < notes[held["free"], "finished"][1]
    print(f"\nwithout a sequence the new job started while the running one ran: {overlapped}")
    assert notes[replacing["sequenced"][0], "started"][1] > notes[held["sequenced"], "finished"][1]


# -- 5. fair against first in, first out ---------------------------------------------------------

NOISY_JOBS = 2000
QUIET_TENANTS = ("b", "c", "d", "e")
QUIET_JOBS = 20


def noisy_done_when_quiet_finished(db: FaultDatabase, queue: str) -> tuple[int, int]:
    """(tenant a's jobs ended before the first, and before the last, quiet job ended)."""
    ends = [
        (partition, n)
        for n, _, _, _, word, _, partition, _, _ in starts_and_ends(db, queue)
        if word == "finished"
    ]
    quiet = [n for partition, n in ends if partition != "a"]
    noisy = [n for partition, n in ends if partition == "a"]
    assert (len(noisy), len(quiet)) == (NOISY_JOBS, QUIET_JOBS * len(QUIET_TENANTS))
    return sum(n < min(quiet) for n in noisy), sum(n < max(quiet) for n in noisy)


@pytest.mark.slow
def test_a_fair_queue_runs_quiet_tenants_before_a_tenth_of_a_noisy_backlog(
    ledger: FaultDatabase, queue_engine: Engine, workers: StartWorker
) -> None:
    """Tenant a's 2,000 jobs, then 20 of each of b..e, in a fair queue and in a plain one,
    a worker each (defaults: -c 4, claims growing to 500): fair, every job of b..e ends
    before a tenth of a's backlog has; first in, first out, they wait behind it."""
    create_queue(ledger, "fair", "--fair")
    create_queue(ledger, "fifo")
    for queue in ("fair", "fifo"):
        noisy = {"task": "keyed", "queue": queue, "partition": "a", "args": {"key": "a", "n": 0}}
        enqueue_rows(queue_engine, [noisy] * NOISY_JOBS)
        enqueue_rows(
            queue_engine,
            [
                {"task": "keyed", "queue": queue, "partition": t, "args": {"key": t, "n": 0}}
                for t in QUIET_TENANTS
                for _ in range(QUIET_JOBS)
            ],
        )
    pool = [workers(ledger.url, "-q", queue) for queue in ("fair", "fifo")]
    for queue in ("fair", "fifo"):
        wait_drained(ledger, queue, 180)
    stop_each_once_started(pool)

    fair = noisy_done_when_quiet_finished(ledger, "fair")
    fifo = noisy_done_when_quiet_finished(ledger, "fifo")
    print(
        f"\njobs of tenant a ended before the first and the last of b..e: fair {fair}, "
        f"first in first out {fifo} (of {NOISY_JOBS})"
    )
    assert ledger.status_counts() == {"done": 2 * (NOISY_JOBS + QUIET_JOBS * 4)}
    assert fair[1] < NOISY_JOBS // 10
    assert fifo[0] >= NOISY_JOBS * 9 // 10


def test_a_worker_starts_a_fair_claims_jobs_in_turn_order(
    ledger: FaultDatabase, queue_engine: Engine, workers: StartWorker
) -> None:
    """One worker at -c 1 claiming 100 jobs at a time from a fair queue (tenant a's 200
    jobs, then 20 of each of b..e): a claim takes 20 of each tenant, and one job of each
    should start before a second of any. It starts a's 20 first, then b's 20, ...: the
    fifth tenant's first job starts 81st."""
    create_queue(ledger, "fair", "--fair")
    enqueue_rows(
        queue_engine,
        [{"task": "keyed", "queue": "fair", "partition": "a", "args": {"key": "a", "n": 0}}] * 200,
    )
    enqueue_rows(
        queue_engine,
        [
            {"task": "keyed", "queue": "fair", "partition": t, "args": {"key": t, "n": 0}}
            for t in QUIET_TENANTS
            for _ in range(QUIET_JOBS)
        ],
    )
    worker = workers(ledger.url, "-q", "fair", "-c", "1", "--batch", "100", "--max-batch", "100")
    wait_drained(ledger, "fair", 60)
    worker.wait_started()
    assert worker.stop() == 0
    order = "".join(
        partition
        for _, _, _, _, word, _, partition, _, _ in starts_and_ends(ledger, "fair")
        if word == "started"
    )
    print(f"\nthe first starts by tenant: {order[:100]}")
    assert sorted(order[:5]) == list("abcde")


# -- MultiXacts ----------------------------------------------------------------------------------

MX_PARTITIONS = 8
MX_SEQUENCES = 100
MX_JOBS = 2000
MX_CLAIMERS = 4


def test_fair_partition_limited_sequence_claims_mint_no_multixacts(private_url: str) -> None:
    """4 workers (threads, one claim each at a time) drain a fair queue with a partition
    limit whose jobs are in 8 partitions and 100 sequences: the claim's locks (SKIP LOCKED
    row locks, the queue's advisory lock) and its sequence probes mint no MultiXact."""
    engine = create_engine(private_url, pool_size=10, max_overflow=10)
    admin = admin_engine(private_url)
    try:
        with engine.begin() as conn:
            create_queue_api(conn, "mx")
            partitions.set_fair(conn, "mx")
            partitions.set_partition_limit(conn, "mx", 3)
        enqueue_rows(
            engine,
            [
                {
                    "task": "noop",
                    "queue": "mx",
                    "partition": f"p{n % MX_PARTITIONS}",
                    "sequence": f"s{n % MX_SEQUENCES}",
                }
                for n in range(MX_JOBS)
            ],
        )
        registry = Registry()
        registry.task(name="noop")(lambda: None)
        pool = [
            WorkerThread(engine, registry, concurrency=2, batch=5, lease=5.0, poll_interval=0.1)
            for _ in range(MX_CLAIMERS)
        ]

        def drain() -> None:
            for worker in pool:
                worker.thread.start()
            wait_for(lambda: not count_where(engine, "status IN ('queued', 'running')"), 120, 0.2)
            for worker in pool:
                worker.stop()

        minted = count_multixacts(admin, drain)
        claimed = [worker.stats.claimed for worker in pool if worker.stats]
        print(f"\n{MX_JOBS} jobs claimed by {MX_CLAIMERS} workers ({claimed}): {minted} MultiXacts")
        assert count_where(engine, "true") == 0, "every job done (and deleted)"
        assert minted == 0
    finally:
        engine.dispose()
        admin.dispose()
