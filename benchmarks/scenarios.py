"""The scenarios of issue 4. Each takes the database, the plan and a `say` callback, and
returns a JSON-ready dict. Warm-up runs are never counted; repetitions give median and spread.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine, pool
from sqlalchemy.orm import Session

from sqla_queue import enqueue, enqueue_many
from sqla_queue.db import queries
from sqla_queue.worker import Worker, WorkerConfig

from . import peers, tasks
from .database import JOBS, UNFINISHED, BenchDatabase
from .processes import stop_process, supervised_workers
from .stats import latency_summary, summary

REPO = Path(__file__).resolve().parent.parent


def _ceiling_script() -> Path:
    """$SQLA_QUEUE_CEILING, else `shared/bench/ceiling/run` beside the checkout or beside one
    of its parents (a git worktree may sit deeper than the main checkout)."""
    if os.environ.get("SQLA_QUEUE_CEILING"):
        return Path(os.environ["SQLA_QUEUE_CEILING"])
    for parent in REPO.parents:
        candidate = parent / "shared" / "bench" / "ceiling" / "run"
        if candidate.exists():
            return candidate
    return REPO.parent / "shared" / "bench" / "ceiling" / "run"


CEILING_SCRIPT = _ceiling_script()
CEILING_LINE = re.compile(
    r"ceiling batch=(?P<batch>\d+)(?: finish=(?P<finish>\w+))? "
    r"clients=(?P<clients>\d+) jobs_per_s=(?P<rate>\d+)"
)

Say = Callable[[str], None]

NAMES = (
    "ceiling",
    "enqueue_single",
    "bulk_enqueue",
    "drain",
    "processes",
    "backlog",
    "latency",
    "multixacts",
    "table_size",
)
"""Every scenario, in the order of a run (each a function of this module)."""


@dataclass
class Plan:
    """Sizes and durations of one run."""

    is_quick: bool = False
    """Built by `Plan.quick()` (smaller sizes; optional sections scale down too)."""
    seconds: float = 3.0
    """Length of one measured repetition of a timed scenario."""
    repeat: int = 3
    warmup: float = 1.0
    ceiling_seconds: int = 5
    skip_ceiling: bool = False
    warm: bool = False
    """ANALYZE each backlog between its insert and its drain (the old way, `--warm`). Cold by
    default: an application's burst is drained with whatever statistics the table has."""
    drain_jobs: int = 100_000
    concurrencies: tuple[int, ...] = (1, 4, 16, 64)
    batches: tuple[int, ...] = (1, 10, 50)
    bulk_batch: int = 1_000
    latency_jobs: int = 1_000
    latency_load_probes: int = 300
    load_rate: float = 1_000.0
    """Background jobs/s enqueued (one per transaction) while latency is probed under load."""
    load_producers: int = 4
    """Processes sharing `load_rate` (one enqueue() process reaches a few hundred jobs/s)."""
    multixact_jobs: int = 10_000
    health_jobs: int = 1_000_000
    health_timeout: float = 240.0
    producers: tuple[int, ...] = (1, 8)
    backlog_small: int = 10_000
    backlog_large: int = 1_000_000
    """Deep backlog: jobs waiting when the drain starts (ours and every peer's)."""
    small_window: float = 15.0
    """The longest a small-backlog repetition is timed (a slow peer does not empty it)."""
    backlog_concurrency: int = 16
    backlog_batch: int = 50
    """Concurrency and batch of every system's worker in the backlog and peer comparison."""
    deep_seconds: float = 60.0
    """How long our large-backlog drain runs while claim latency is sampled (autovacuum on
    the jobs table comes by once per autovacuum_naptime, 60 s on a stock server)."""
    claim_probe_interval: float = 0.1
    peers: tuple[str, ...] = ("pgqueuer", "procrastinate")
    processes: int = 2
    """Worker processes of the `worker --processes N` drain line (when the CLI has it)."""
    processes_concurrency: int = 4
    """Concurrency of each of those processes."""
    server_data: str | None = None
    """The private cluster's data directory (its processes' CPU is read from /proc), else
    None (a server given by --database-url)."""
    ceiling_best: float | None = None
    """The run's best batch-50 ceiling line, once the ceiling has run (the ratios of
    `benchmarks.hot_path`)."""

    @classmethod
    def quick(cls, **overrides: Any) -> Plan:
        base = cls(
            is_quick=True,
            seconds=1.0,
            warmup=0.5,
            ceiling_seconds=2,
            drain_jobs=20_000,
            latency_jobs=200,
            latency_load_probes=100,
            multixact_jobs=2_000,
            health_jobs=50_000,
            health_timeout=60.0,
            backlog_large=100_000,
            deep_seconds=15.0,
        )
        for key, value in overrides.items():
            setattr(base, key, value)
        return base

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- processes -------------------------------------------------------------------------------


def spawn(*args: object, stdin: bool = False) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.procs", *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        text=True,
    )


@contextmanager
def worker_process(db: BenchDatabase, concurrency: int, batch: int) -> Iterator[Any]:
    proc = spawn("worker", db.url, concurrency, batch)
    try:
        yield proc
    finally:
        stop_process(proc)


# -- 1. ceiling ------------------------------------------------------------------------------


def ceiling(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """pgbench on the same claim/finish SQL, no library in between (run once: it is slow)."""
    if plan.skip_ceiling:
        return {"available": False, "reason": "skipped (--skip-ceiling)"}
    if not CEILING_SCRIPT.exists():
        return {"available": False, "reason": f"{CEILING_SCRIPT} not found"}
    proc = subprocess.Popen(
        [str(CEILING_SCRIPT), db.dsn, str(plan.ceiling_seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: list[dict[str, Any]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        match = CEILING_LINE.search(line)
        if match:
            lines.append(
                {
                    "batch": int(match["batch"]),
                    "finish": match["finish"] or "update",
                    "clients": int(match["clients"]),
                    "jobs_per_s": int(match["rate"]),
                }
            )
            say(line.strip())
    proc.wait()
    if not lines:
        return {"available": False, "reason": f"{CEILING_SCRIPT} printed no ceiling lines"}
    best = {
        str(b): max(x["jobs_per_s"] for x in lines if x["batch"] == b)
        for b in sorted({x["batch"] for x in lines})
    }
    one_client = {
        str(b): max(x["jobs_per_s"] for x in lines if x["batch"] == b and x["clients"] == 1)
        for b in sorted({x["batch"] for x in lines})
    }
    return {
        "available": True,
        "seconds": plan.ceiling_seconds,
        "lines": lines,
        "best": best,
        "one_client": one_client,
    }


# -- 2. one job per transaction --------------------------------------------------------------


def _produce(db: BenchDatabase, kind: str, producers: int, plan: Plan) -> list[float]:
    procs = [
        spawn("produce", kind, db.url, plan.seconds, plan.repeat, stdin=True)
        for _ in range(producers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready"
    start = time.time() + plan.warmup
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start}\n")
        proc.stdin.flush()
    counts = [json.loads(proc.communicate()[0]) for proc in procs]
    return [sum(c[k] for c in counts) / plan.seconds for k in range(plan.repeat)]


def enqueue_single(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """enqueue() in its own Session transaction vs a raw psycopg INSERT + COMMIT loop."""
    result: dict[str, Any] = {}
    for producers in plan.producers:
        row: dict[str, Any] = {}
        for kind in ("raw", "orm"):
            db.reset_jobs()
            row[kind] = summary(_produce(db, kind, producers, plan))
            say(f"enqueue {kind} x{producers}: {row[kind]['median']:,.0f} jobs/s")
        row["ratio_to_raw"] = row["orm"]["median"] / row["raw"]["median"]
        result[str(producers)] = row
    return result


# -- 3. bulk ---------------------------------------------------------------------------------


def _bulk_rate(db: BenchDatabase, rows: list[dict[str, Any]], seconds: float) -> float:
    assert db.engine is not None
    done = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        with Session(db.engine) as session, session.begin():
            enqueue_many(session, rows)
        done += len(rows)
    return done / elapsed


def bulk_enqueue(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """enqueue_many() with `bulk_batch` rows per transaction, one producer."""
    rows = [{"task": "noop", "args": {"n": n}} for n in range(plan.bulk_batch)]
    db.reset_jobs()
    _bulk_rate(db, rows, plan.warmup)
    rates = []
    for _ in range(plan.repeat):
        db.reset_jobs()
        rates.append(_bulk_rate(db, rows, plan.seconds))
    result = summary(rates)
    say(f"bulk enqueue_many x{plan.bulk_batch}: {result['median']:,.0f} jobs/s")
    db.reset_jobs()
    peer_rates: dict[str, Any] = {}
    for name in plan.peers:
        peer_rates[name] = _peer_bulk(db, plan, name)
        say(f"bulk {name} x{plan.bulk_batch}: {_peer_line(peer_rates[name])}")
    return {"batch": plan.bulk_batch, "enqueue_many": result, "peers": peer_rates}


def _peer_line(res: dict[str, Any]) -> str:
    if "error" in res:
        return f"[yellow]not measured: {res['error']}[/]"
    return f"{res['median']:,.0f} jobs/s"


@contextmanager
def peer_database(db: BenchDatabase, name: str) -> Iterator[peers.PeerDatabase]:
    """The peer's own database on the same server, its schema installed; dropped after."""
    reason = peers.unavailable(name)
    if reason:
        raise PeerUnavailable(reason)
    db_name, dsn = db.sibling(name)
    pdb = peers.PeerDatabase(peers.PEERS[name], db.admin_dsn, db_name, dsn)
    try:
        pdb.create()
        yield pdb
    finally:
        pdb.drop()


class PeerUnavailable(Exception):
    """The peer is not installed here (the reason is the message)."""


def _peer_error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, PeerUnavailable):
        return {"error": str(exc)}
    return {"error": f"failed: {type(exc).__name__}: {str(exc).strip()[:300]}"}


def _peer_bulk(db: BenchDatabase, plan: Plan, name: str) -> dict[str, Any]:
    """The peer's bulk enqueue of the same rows, `bulk_batch` per transaction."""
    try:
        with peer_database(db, name) as pdb:
            peers.bulk_rate(name, pdb.dsn, plan.bulk_batch, plan.warmup)
            rates = []
            for _ in range(plan.repeat):
                pdb.reset()
                rates.append(peers.bulk_rate(name, pdb.dsn, plan.bulk_batch, plan.seconds))
            return {**summary(rates), "version": peers.version(name)}
    except Exception as exc:  # reported in BENCHMARKS.md, never dropped silently
        return _peer_error(exc)


# -- 4. drain --------------------------------------------------------------------------------


WARM_UP_LIMIT = 120.0
"""Seconds the warm-up drain may take, a worker's start included."""


def _drain_once(db: BenchDatabase, jobs: int, window: float, warm: bool = False) -> float:
    """Pre-insert `jobs` (ANALYZEd first if `warm`); jobs/s from their commit until the table
    is empty or `window` has passed.

    Timed from the insert's commit, as a user meets it (the worker's wake-up is in the
    figure), with the count polled every few milliseconds on one connection: a tiny backlog
    that drains between two polls still gives its true rate, never 0 (a 500-job drain takes
    about 25 ms here)."""
    db.reset_jobs()
    db.insert_noop_jobs(jobs, analyze=warm)
    t0 = time.monotonic()
    end = t0 + window
    poll = min(0.05, max(0.002, window / 100))
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(UNFINISHED).fetchone()
            left = int(row[0]) if row else 0
            t1 = time.monotonic()
            if left == 0 or t1 >= end:
                break
            time.sleep(min(poll, end - t1))
    return (jobs - left) / (t1 - t0)


def _warm_up(db: BenchDatabase, plan: Plan) -> float:
    """Drain a tenth of the backlog to the end (the worker just spawned is importing, then
    connecting: its first claim may come a second or more later on a busy machine), so the
    timed drains start with a worker that is up; its rate is reported as `warmup`."""
    return _drain_once(db, max(1, plan.drain_jobs // 10), WARM_UP_LIMIT, plan.warm)


def drain_config(
    db: BenchDatabase, plan: Plan, concurrency: int, batch: int, retention: str = "delete"
) -> dict[str, Any]:
    db.set_retention(retention)
    rates: list[float] = []
    try:
        with worker_process(db, concurrency, batch):
            warm = _warm_up(db, plan)
            for _ in range(plan.repeat):
                rate = _drain_once(db, plan.drain_jobs, plan.seconds, plan.warm)
                rates.append(rate)
    finally:
        db.set_retention("delete")
    result = summary(rates)
    result.update(concurrency=concurrency, batch=batch, retention=retention, warmup=warm)
    return result


def drain(db: BenchDatabase, plan: Plan, say: Say, step: Callable[[], None]) -> dict[str, Any]:
    grid: list[dict[str, Any]] = []
    for batch in plan.batches:
        for concurrency in plan.concurrencies:
            row = drain_config(db, plan, concurrency, batch)
            grid.append(row)
            say(
                f"drain c={concurrency:<2} b={batch:<2}: {row['median']:,.0f} jobs/s "
                f"(spread {row['spread']:.0%})"
            )
            step()
    compare = []
    for concurrency in (1, 16):
        if concurrency not in plan.concurrencies or 50 not in plan.batches:
            continue
        row = drain_config(db, plan, concurrency, 50, retention="keep")
        compare.append(row)
        say(
            f"drain c={concurrency} b=50 finish by a move to the history (keep): "
            f"{row['median']:,.0f} jobs/s"
        )
        step()
    db.reset_jobs()
    return {"jobs": plan.drain_jobs, "seconds": plan.seconds, "grid": grid, "keep": compare}


# -- 4b. worker --processes N ----------------------------------------------------------------


def processes(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """Drain at batch 50 by `sqla-queue worker --processes N` (N = plan.processes)."""
    concurrency = plan.processes_concurrency
    rates: list[float] = []
    with supervised_workers(db, plan.processes, 50, concurrency):
        _warm_up(db, plan)
        for _ in range(plan.repeat):
            rate = _drain_once(db, plan.drain_jobs, plan.seconds, plan.warm)
            rates.append(rate)
    db.reset_jobs()
    result = summary(rates)
    result.update(available=True, processes=plan.processes, concurrency=concurrency, batch=50)
    say(f"drain --processes {plan.processes} c={concurrency} b=50: {result['median']:,.0f} jobs/s")
    return result


# -- 4c. deep backlog, ours and the peers' ---------------------------------------------------


class _Ours:
    """sqla-queue as a system under the backlog measurement."""

    name = "sqla_queue"

    def __init__(self, db: BenchDatabase, warm: bool = False) -> None:
        self.db = db
        self.warm = warm

    def pending(self) -> int:
        return self.db.count_jobs()

    def fill(self, count: int) -> None:
        self.db.reset_jobs()
        self.db.insert_noop_jobs(count, analyze=self.warm)

    def start(self, concurrency: int, batch: int) -> subprocess.Popen[str]:
        return spawn("worker", self.db.url, concurrency, batch)


class _Peer:
    def __init__(self, pdb: peers.PeerDatabase, warm: bool = False) -> None:
        self.pdb = pdb
        self.name = pdb.peer.name
        self.warm = warm

    def pending(self) -> int:
        return self.pdb.pending()

    def fill(self, count: int) -> None:
        self.pdb.reset()
        self.pdb.insert_backlog(count, analyze=self.warm)

    def start(self, concurrency: int, batch: int) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        command = peers.worker_command(self.name, self.pdb.dsn, concurrency, batch)
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, text=True)


def _windows(
    system: _Ours | _Peer, backlog: int, plan: Plan, windows: int, window: float, fine: bool
) -> tuple[list[float], float]:
    """Start the worker on a filled backlog; once its first jobs are done, the completion rate
    in up to `windows` consecutive windows (fewer if the backlog empties). Returns the rates
    and the seconds from the worker's start to its first completions.

    `fine`: poll every 20 ms to catch the moment the backlog empties (small backlogs only:
    counting a deep backlog is itself work that would slow the drain it measures, so a deep
    one is counted at the window edges only)."""
    proc = system.start(plan.backlog_concurrency, plan.backlog_batch)
    try:
        begun = time.monotonic()
        t0, left = begun, system.pending()
        while left >= backlog:
            if proc.poll() is not None:
                raise RuntimeError(f"the {system.name} worker exited with {proc.returncode}")
            if time.monotonic() - begun > 120:
                raise TimeoutError(f"the {system.name} worker did no job within 120 s")
            time.sleep(0.005 if fine else 0.5)
            t0, left = time.monotonic(), system.pending()
        startup = t0 - begun
        if left == 0:  # emptied between two polls: time it from the worker's start (a floor)
            return [backlog / startup], startup
        rates: list[float] = []
        for _ in range(windows):
            end = t0 + window
            while True:
                time.sleep(max(0.0, min(0.02 if fine else window, end - time.monotonic())))
                t, count = time.monotonic(), system.pending()
                if count == 0 or t >= end:
                    break
            rates.append((left - count) / (t - t0))
            t0, left = t, count
            if count == 0:
                break
        return rates, startup
    finally:
        stop_process(proc)


def _small_backlog(system: _Ours | _Peer, plan: Plan, say: Say) -> dict[str, Any]:
    """`repeat` times: fill the small backlog, start a worker, time it until empty (or for
    `small_window` seconds, for a system too slow to empty it sooner)."""
    rates = []
    for _ in range(plan.repeat):
        system.fill(plan.backlog_small)
        window_rates, _ = _windows(
            system, plan.backlog_small, plan, 1, plan.small_window, fine=True
        )
        rates.append(window_rates[0])
    small = summary(rates)
    say(f"backlog {plan.backlog_small:,} {system.name}: {small['median']:,.0f} jobs/s")
    return small


def _backlog_runs(system: _Peer, plan: Plan, say: Say) -> dict[str, Any]:
    small = _small_backlog(system, plan, say)
    filled = time.monotonic()
    system.fill(plan.backlog_large)
    fill_s = time.monotonic() - filled
    large_rates, startup = _windows(
        system, plan.backlog_large, plan, plan.repeat, plan.seconds, fine=False
    )
    large = summary(large_rates)
    say(f"backlog {plan.backlog_large:,} {system.name}: {large['median']:,.0f} jobs/s")
    return {"small": small, "large": large, "large_startup_s": startup, "large_fill_s": fill_s}


class _ClaimProbe(threading.Thread):
    """Times the worker's own claim statement every `interval` s on a connection of its own,
    in a transaction rolled back at once (nothing is claimed for good), and notes whether a
    VACUUM of the jobs table was in progress at that moment."""

    def __init__(self, db: BenchDatabase, batch: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.dsn, self.batch, self.interval = db.url, db.dsn, batch, interval
        self.halt = threading.Event()
        self.samples: list[tuple[float, bool]] = []
        self.error: str | None = None

    def run(self) -> None:
        import psycopg

        engine = create_engine(self.url, poolclass=pool.NullPool)
        statement = queries.claim_jobs(None)
        params = {
            "limit": self.batch,
            "worker_id": "bench-claim-probe",
            "lease": 60.0,
            "task_leases": {},
            "task_max_attempts": {},
        }
        try:
            with engine.connect() as conn, psycopg.connect(self.dsn, autocommit=True) as watch:
                while not self.halt.wait(self.interval):
                    vacuuming = bool(
                        watch.execute(
                            "SELECT 1 FROM pg_stat_progress_vacuum "
                            f"WHERE relid = '{JOBS}'::regclass"
                        ).fetchall()
                    )
                    started = time.perf_counter()
                    conn.execute(statement, params).all()
                    elapsed = (time.perf_counter() - started) * 1000
                    conn.rollback()
                    self.samples.append((elapsed, vacuuming))
        except Exception as exc:  # reported with the figures
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            engine.dispose()


def _deep_ours(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """Our large-backlog drain, run for `deep_seconds` with the claim probe alongside."""
    ours = _Ours(db, plan.warm)
    filled = time.monotonic()
    ours.fill(plan.backlog_large)
    fill_s = time.monotonic() - filled
    before = db.vacuum_stats()
    probe = _ClaimProbe(db, plan.backlog_batch, plan.claim_probe_interval)
    probe.start()
    try:
        windows = max(plan.repeat, int(plan.deep_seconds / plan.seconds))
        rates, startup = _windows(ours, plan.backlog_large, plan, windows, plan.seconds, fine=False)
    finally:
        probe.halt.set()
        probe.join(30)
    after = db.vacuum_stats()
    left = db.count_jobs()
    all_ms = [ms for ms, _ in probe.samples]
    during = [ms for ms, v in probe.samples if v]
    outside = [ms for ms, v in probe.samples if not v]
    result = {
        "large": summary(rates[: plan.repeat]),
        "all_windows": rates,
        "large_startup_s": startup,
        "large_fill_s": fill_s,
        "left_at_end": left,
        "claim_latency_ms": latency_summary(all_ms),
        "claim_latency_during_vacuum_ms": latency_summary(during),
        "claim_latency_outside_vacuum_ms": latency_summary(outside),
        "claim_probe_error": probe.error,
        "autovacuum_runs": after["autovacuum_count"] - before["autovacuum_count"],
        "last_autovacuum": after["last_autovacuum"],
        "vacuum_seen_by_probe": bool(during),
    }
    lat = result["claim_latency_ms"]
    say(
        f"deep backlog {plan.backlog_large:,} sqla_queue: {result['large']['median']:,.0f} jobs/s;"
        f" claim p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms; autovacuum ran "
        f"{result['autovacuum_runs']} time(s), {len(during)} probes during a vacuum"
    )
    db.reset_jobs()
    return result


def backlog(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """Drain at a small and a large backlog, ours and each peer's, same concurrency and batch,
    each in its own database on the same server; ours also with claim latency sampled."""
    result: dict[str, Any] = {
        "small": plan.backlog_small,
        "large": plan.backlog_large,
        "concurrency": plan.backlog_concurrency,
        "batch": plan.backlog_batch,
        "systems": {},
    }
    mine: dict[str, Any] = {"small": _small_backlog(_Ours(db, plan.warm), plan, say)}
    mine.update(_deep_ours(db, plan, say))
    result["systems"]["sqla_queue"] = mine
    for name in plan.peers:
        try:
            with peer_database(db, name) as pdb:
                runs = _backlog_runs(_Peer(pdb, plan.warm), plan, say)
                runs["version"] = peers.version(name)
                runs["batch_note"] = pdb.peer.batch_note
                runs["finish_note"] = pdb.peer.finish_note
                result["systems"][name] = runs
        except Exception as exc:  # reported in BENCHMARKS.md, never dropped silently
            result["systems"][name] = _peer_error(exc)
            say(f"backlog {name}: [yellow]not measured: {result['systems'][name]['error']}[/]")
    return result


# -- 5. latency ------------------------------------------------------------------------------


def wait_started(
    seqs: list[int], timeout: float, started: dict[int, float] = tasks.probe_started
) -> None:
    """Wait until every probe of `seqs` has its start time in `started` (filled by the
    handler, which notifies `tasks.probe_event`)."""
    deadline = time.monotonic() + timeout
    with tasks.probe_event:
        while not all(s in started for s in seqs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"probes did not start within {timeout}s")
            tasks.probe_event.wait(left)


class Probes:
    """Plain probes: `send()` enqueues the next `probe` job and commits."""

    def __init__(self, db: BenchDatabase) -> None:
        assert db.engine is not None
        self.engine = db.engine
        self.seq = 0

    def send(self) -> tuple[int, float]:
        """Enqueue one probe and commit; returns (seq, time the COMMIT was sent: the run may
        start before the session's end returns, which gives the connection back)."""
        self.seq += 1
        with Session(self.engine) as session, session.begin():
            enqueue(session, "probe", {"seq": self.seq})
            at = time.perf_counter()
        return self.seq, at


def _latencies(sent: list[tuple[int, float]]) -> list[float]:
    return [(tasks.probe_started[seq] - at) * 1000 for seq, at in sent]


def latency(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """Commit of the enqueueing transaction to handler start (worker: concurrency 4, batch 10)."""
    db.reset_jobs()
    worker = Worker(db.url, tasks.registry, WorkerConfig(concurrency=4, batch=10))
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    probes = Probes(db)
    result: dict[str, Any] = {"worker": {"concurrency": 4, "batch": 10}}
    try:
        time.sleep(0.5)
        idle_runs = []
        for rep in range(plan.repeat + 1):
            sent = []
            for _ in range(plan.latency_jobs if rep else min(100, plan.latency_jobs)):
                seq, at = probes.send()
                wait_started([seq], 10)
                sent.append((seq, at))
            if rep:
                idle_runs.append(latency_summary(_latencies(sent)))
        result["idle"] = _latency_result(idle_runs, plan.latency_jobs)
        say(_latency_line("idle", result["idle"]))

        duration = plan.warmup + 3 + plan.repeat * (plan.latency_load_probes * 0.012 + 1)
        share = plan.load_rate / plan.load_producers
        loads = [spawn("steady", db.url, share, stdin=True) for _ in range(plan.load_producers)]
        for load in loads:  # started and connected: the load runs from here
            assert load.stdout is not None
            load.stdout.readline()
        until = time.time() + duration
        for load in loads:
            assert load.stdin is not None
            load.stdin.write(f"{until}\n")
            load.stdin.flush()
        time.sleep(plan.warmup + 1)
        load_runs = []
        for _ in range(plan.repeat):
            sent = []
            for _ in range(plan.latency_load_probes):
                sent.append(probes.send())
                time.sleep(0.01)
            wait_started([seq for seq, _ in sent], 30)
            load_runs.append(latency_summary(_latencies(sent)))
        achieved = [json.loads(load.communicate()[0]) for load in loads]
        result["load"] = _latency_result(load_runs, plan.latency_load_probes)
        result["load"]["background_jobs_per_s"] = sum(a["jobs"] / a["seconds"] for a in achieved)
        result["load"]["background_target_per_s"] = plan.load_rate
        result["load"]["background_processes"] = plan.load_producers
        say(_latency_line("under load", result["load"]))
    finally:
        worker.stop()
        thread.join(60)
    db.reset_jobs()
    return result


def _latency_result(runs: list[dict[str, float]], per_run: int) -> dict[str, Any]:
    return {
        "probes_per_repetition": per_run,
        "repetitions": runs,
        **{key: summary([run[key] for run in runs]) for key in ("p50", "p95", "p99", "max")},
    }


def _latency_line(label: str, res: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {res[k]['median']:.2f}" for k in ("p50", "p95", "p99", "max"))
    return f"latency {label} (ms): {parts}"


# -- 6. health -------------------------------------------------------------------------------


def _multixacts_once(db: BenchDatabase, jobs: int, producers: int) -> tuple[int, int]:
    db.reset_jobs()
    first = db.next_multixact_id()
    procs = [spawn("enqueue", db.url, jobs // producers) for _ in range(producers)]
    for proc in procs:
        proc.wait()
    enqueued = db.next_multixact_id()
    with worker_process(db, 16, 10):
        db.wait_until_empty(600)
    worked = db.next_multixact_id()
    return enqueued - first, worked - enqueued


def multixacts(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """MultiXacts minted per 10,000 jobs: 8 producers enqueue, then one worker (c=16, b=10)."""
    result: dict[str, Any] = {"jobs": plan.multixact_jobs, "producers": 8}
    scale = 10_000 / plan.multixact_jobs
    try:
        for variant in ("with_fk", "without_fk"):
            if variant == "with_fk":
                db.add_queue_fk()
            else:
                db.drop_queue_fk()
            enq, work = [], []
            for _ in range(plan.repeat):
                e, w = _multixacts_once(db, plan.multixact_jobs, 8)
                enq.append(e * scale)
                work.append(w * scale)
            result[variant] = {"enqueue": summary(enq), "worker": summary(work)}
            say(
                f"multixacts/10k jobs {variant}: enqueue {result[variant]['enqueue']['median']:.0f}"
                f", worker {result[variant]['worker']['median']:.0f}"
            )
    finally:
        db.drop_queue_fk()  # the default schema again (sqlaq_0031: the queue check)
    return result


def table_size(db: BenchDatabase, plan: Plan, say: Say) -> dict[str, Any]:
    """Jobs table + indexes while `health_jobs` jobs flow through a worker (c=16, b=50)."""
    db.reset_jobs()
    chunk = min(10_000, max(1, plan.health_jobs // 20))
    backlog = 5 * chunk
    marks = [plan.health_jobs * f / 10 for f in range(1, 11)]
    samples: list[dict[str, Any]] = []
    inserted = processed = stand_ins = 0
    autovacuums = db.jobs_size()["autovacuums"]
    started = time.monotonic()
    with worker_process(db, 16, 50):
        while processed < plan.health_jobs:
            if time.monotonic() - started > plan.health_timeout:
                break
            left = db.count_jobs()
            processed = inserted - left
            if marks and processed >= marks[0]:
                marks.pop(0)
                sample: dict[str, Any] = {"processed": processed, **db.jobs_size()}
                sample.update(at_s=time.monotonic() - started, stand_in_vacuum=False)
                if sample["autovacuums"] == autovacuums:
                    # Autovacuum did not come by in this tenth: a plain VACUUM stands in for it.
                    db.sql(f"VACUUM {JOBS}")
                    sample["stand_in_vacuum"] = True
                    stand_ins += 1
                autovacuums = sample["autovacuums"]
                samples.append(sample)
            if left < backlog and inserted < plan.health_jobs:
                db.insert_noop_jobs(min(chunk, plan.health_jobs - inserted))
                inserted += min(chunk, plan.health_jobs - inserted)
            else:
                time.sleep(0.05)
    elapsed = time.monotonic() - started
    end = db.jobs_size()
    db.sql(f"VACUUM {JOBS}")
    vacuumed = db.jobs_size()
    result = {
        "target_jobs": plan.health_jobs,
        "processed": processed,
        "complete": processed >= plan.health_jobs,
        "seconds": elapsed,
        "jobs_per_s": processed / elapsed if elapsed else 0.0,
        "samples": samples,
        "end": end,
        "after_vacuum": vacuumed,
        "autovacuums": end["autovacuums"] - samples[0]["autovacuums"] if samples else 0,
        "stand_in_vacuums": stand_ins,
        "max_total_bytes": max([s["total_bytes"] for s in samples] + [end["total_bytes"]]),
    }
    say(
        f"table+index after {processed:,} jobs: {end['total_bytes'] / 1e6:.1f} MB "
        f"(max {result['max_total_bytes'] / 1e6:.1f} MB, after VACUUM "
        f"{vacuumed['total_bytes'] / 1e6:.1f} MB)"
    )
    db.reset_jobs()
    return result
