"""Helpers shared by the test modules: a task log table, waiting, reading job rows."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from click.testing import CliRunner, Result
from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import Dependency, Job, JobContext, Registry, admin, enqueue, enqueue_many
from sqla_queue.admin import partitions
from sqla_queue.cli import main
from sqla_queue.db import queries
from sqla_queue.db.database import normalize_url
from sqla_queue.testing import enqueued_jobs, run_until_empty
from sqla_queue.worker import Worker, WorkerConfig, WorkerStats

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
SQLA_QUEUE_BIN = str(Path(sys.executable).with_name("sqla-queue"))

# Unlogged: a handler's commit then waits for no WAL flush, which keeps 10,000 jobs quick.
TASK_LOG_DDL = text(
    "CREATE UNLOGGED TABLE public.task_log ("
    " job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
    " thread text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(),"
    " claimed_at timestamptz)"
)
_INSERT_LOG = text(
    "INSERT INTO public.task_log (job_id, attempt, pid, thread) VALUES (:j, :a, :p, :t)"
)

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def create_task_log(engine: Engine) -> None:
    """The test's own table where handlers record every attempt they run."""
    with engine.begin() as conn:
        conn.execute(TASK_LOG_DDL)


_INSERT_LOG_AT = text(
    "INSERT INTO public.task_log (job_id, attempt, pid, thread, at, claimed_at) "
    "SELECT :j, :a, :p, :t, to_timestamp(:at),"
    " (SELECT locked_at FROM sqla_queue.jobs WHERE id = :j AND attempts = :a)"
)


def record_attempt(url: str, job_id: int, attempt: int, at: float | None = None) -> None:
    """Insert (job id, attempt, pid, thread) into `task_log`, on a pooled engine per URL;
    `at` (epoch seconds, e.g. the handler's own start) instead of the insert's clock, and
    then also the time the claim took the job (its `locked_at`, the claim's own clock)."""
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = create_engine(
                normalize_url(url), pool_size=10, max_overflow=10, isolation_level="AUTOCOMMIT"
            )
    with engine.connect() as conn:  # one round trip: the INSERT commits by itself
        row = {"j": job_id, "a": attempt, "p": os.getpid(), "t": threading.current_thread().name}
        if at is None:
            conn.execute(_INSERT_LOG, row)
        else:
            conn.execute(_INSERT_LOG_AT, {**row, "at": at})


def dispose_engines() -> None:
    """Close the handler engines (so a test's database can be dropped cleanly)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def restored_logging_and_engines() -> Iterator[None]:
    """For an autouse fixture (`yield from`) of a module whose tests run `sqla-queue
    worker`, which configures the root logger: the next test gets its own back, and the
    handler engines are closed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    dispose_engines()


def task_log(engine: Engine) -> list[tuple[int, int]]:
    """Every (job id, attempt) the handlers recorded, in the order they recorded them."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, attempt FROM public.task_log ORDER BY at"))
        return [(job_id, attempt) for job_id, attempt in rows]


def cli(
    *args: str,
    url: str | None = None,
    answer: str | None = None,
    catch: bool = False,
    **env: str | None,
) -> Result:
    """`sqla-queue ARGS` in this process (CliRunner), with SQLA_QUEUE_DATABASE_URL set to `url`
    and the other `env` variables; `answer` is typed at its prompts. An exception the command
    lets out is raised here (failing the test with its traceback) unless `catch`: then it is
    the result's `exception`, as for a user, who sees an exit code."""
    environment = {"SQLA_QUEUE_DATABASE_URL": url, **env}
    return CliRunner().invoke(
        main, list(args), env=environment, input=answer, catch_exceptions=catch
    )


def enqueue_jobs(engine: Engine, task: str, count: int, **fields: Any) -> list[int]:
    """Commit `count` jobs of `task` (same extra fields each) and return their ids."""
    with Session(engine) as session, session.begin():
        return enqueue_many(session, [{"task": task, **fields} for _ in range(count)])


def enqueue_numbered(engine: Engine, task: str, count: int, queue: str = "default") -> None:
    """Commit `count` jobs of `task` into `queue`, numbered by their `n` arg (0, 1, ...)."""
    with Session(engine) as session, session.begin():
        rows = [{"task": task, "args": {"n": n}, "queue": queue} for n in range(count)]
        enqueue_many(session, rows)


def every_job(conn: Connection) -> str:
    """The relation of every job, live or finished: `sqla_queue.all_jobs` (the jobs table and
    the history), or `sqla_queue.jobs` on a schema older than sqlaq_0030_history (an
    upgrade test's), where every job is in it."""
    found = conn.scalar(text("SELECT to_regclass('sqla_queue.all_jobs') IS NOT NULL"))
    return "sqla_queue.all_jobs" if found else "sqla_queue.jobs"


def jobs_by_id(engine: Engine, ids: Sequence[int] | None = None) -> dict[int, Any]:
    """The jobs, live or finished (`every_job`: the jobs table and the history), as rows
    with the jobs table's columns, by id (all of them when `ids` is None)."""
    with engine.connect() as conn:
        query = f"SELECT * FROM {every_job(conn)}"
        if ids is None:
            rows = conn.execute(text(query))
        else:
            rows = conn.execute(text(f"{query} WHERE id = ANY(:ids)"), {"ids": list(ids)})
        return {row.id: row for row in rows}


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05) -> Any:
    """Poll `condition` until it returns something truthy; fail the test after `timeout` s.
    A deadline only matters when the test fails, so it is generous: a loaded machine (CI runs
    4 xdist workers on 2 cores) may take many seconds for what a quiet one does at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


def until_told(ctx: JobContext, at_most: float = 60.0) -> bool:
    """Hold a handler until the worker tells its context it timed out or was cancelled (the
    worker's own decision, however late a loaded producer makes it), `at_most` seconds;
    whether it was told. For a handler that must overrun: a fixed sleep may end first."""
    deadline = time.monotonic() + at_most
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    return ctx.cancelled


def database_clock(engine: Engine) -> dt.datetime:
    """The database's clock now (`clock_timestamp()`, not a transaction's start)."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()


def delay_chosen(engine: Engine, job_id: int, before: dt.datetime, after: dt.datetime) -> Bounds:
    """The delay (seconds) the statement that wrote the job's `run_at = now() + delay` chose,
    as bounds: that statement ran between `before` and `after` (`database_clock` read around
    the step that wrote it), so the delay is within them however long the step took. A test
    asserts the delay the code decided with `in`, never a wait measured after the fact."""
    with engine.connect() as conn:
        run_at = conn.execute(
            text("SELECT run_at FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    return Bounds((run_at - after).total_seconds(), (run_at - before).total_seconds())


def age_bounds(seconds: float, before: dt.datetime, after: dt.datetime) -> Bounds:
    """The age (seconds) the code reads of a time the test wrote `seconds` in the past: at
    least that, at most that plus the time from `before` the write to `after` the read
    (`database_clock`), however long the steps between took."""
    return Bounds(seconds, seconds + (after - before).total_seconds())


class Bounds(tuple[float, float]):
    """(low, high) seconds; `x in bounds` allows the microsecond PostgreSQL rounds to."""

    def __new__(cls, low: float, high: float) -> Bounds:
        return super().__new__(cls, (low, high))

    def __contains__(self, value: object) -> bool:
        assert isinstance(value, int | float)
        return self[0] - 1e-6 <= value <= self[1] + 1e-6


def count_where(engine: Engine, condition: str) -> int:
    """How many jobs, live or finished (`every_job`: the jobs table and the history), match
    `<condition>` (test-only literal SQL)."""
    with engine.connect() as conn:
        sql = f"SELECT count(*) FROM {every_job(conn)} WHERE {condition}"
        return int(conn.scalar(text(sql)))


def count_hot_where(engine: Engine, condition: str) -> int:
    """`SELECT count(*) FROM sqla_queue.jobs WHERE <condition>`: the hot table only, which
    holds the jobs still to run (and the finished ones no queue keeps in the history)."""
    with engine.connect() as conn:
        return int(conn.scalar(text(f"SELECT count(*) FROM sqla_queue.jobs WHERE {condition}")))


def subprocess_env(database_url: str | None, **extra: str) -> dict[str, str]:
    """The environment for a `sqla-queue` subprocess: apps importable, URL set (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "SQLA_QUEUE_DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    if database_url is not None:
        env["SQLA_QUEUE_DATABASE_URL"] = database_url
    env.update(extra)
    return env


def start_worker_process(database_url: str, *args: str) -> subprocess.Popen[str]:
    """`sqla-queue worker --app helpers.apps.tasks:registry ARGS` as a subprocess."""
    return subprocess.Popen(
        [
            SQLA_QUEUE_BIN,
            "worker",
            "--app",
            "helpers.apps.tasks:registry",
            "--log-level",
            "warning",
            *args,
        ],
        env=subprocess_env(database_url),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stall_and_reap(engine: Engine) -> int:
    """Make every running job look abandoned after it started, reap it, and claim it again
    as another worker.

    One transaction: until it commits, the reaped row stays locked, so no worker's claim
    (SKIP LOCKED) can take it first.
    """
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET started_at = coalesce(started_at, now()), "
                "heartbeat_at = now() - interval '1 hour', "
                "lease_expires_at = now() - interval '1 hour'"
            )
        )
        reaped = conn.execute(queries.reap_stale_jobs(), {"lease": 60}).all()
        claimed = conn.execute(
            queries.claim_jobs(None), {"limit": 10, "worker_id": "successor"}
        ).all()
    assert len(reaped) == 1
    assert len(claimed) <= 1  # none when the reaper failed a job on its last attempt
    return int(claimed[0][3]) if claimed else 0


class WorkerThread:
    """A `Worker` running in a thread of its own; `stop()` asks it to stop and waits."""

    def __init__(self, engine: Engine, registry: Registry, **config: Any) -> None:
        config.setdefault("poll_only", True)
        self.worker = Worker(engine, registry, WorkerConfig(**config))
        self.stats: WorkerStats | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.stats = self.worker.run(install_signal_handlers=False)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 60.0) -> WorkerStats:
        """Stop the worker the way another thread of the application would."""
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats


class AtOnce:
    """The most handlers that ran at once: `with at_once:` around a handler's work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0

    def __enter__(self) -> AtOnce:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.running -= 1


def make_queue(engine: Engine, name: str = "tenants", **settings: Any) -> None:
    """Create queue `name` with `settings`: concurrency, rate, fair, partition_limit, aging,
    sequence_on_failure."""
    unknown = set(settings) - {
        "concurrency",
        "rate",
        "fair",
        "partition_limit",
        "aging",
        "sequence_on_failure",
    }
    assert not unknown, f"make_queue: no setting {sorted(unknown)}"
    with engine.begin() as conn:
        admin.create_queue(conn, name)
        if "concurrency" in settings:
            admin.set_max_running(conn, name, settings["concurrency"])
        if "rate" in settings:
            admin.set_rate(conn, name, settings["rate"])
        if settings.get("fair"):
            partitions.set_fair(conn, name, True)
        if "partition_limit" in settings:
            partitions.set_partition_limit(conn, name, settings["partition_limit"])
        if "aging" in settings:
            partitions.set_aging(conn, name, settings["aging"])
        if "sequence_on_failure" in settings:
            partitions.set_sequence_on_failure(conn, name, settings["sequence_on_failure"])


def set_status(
    engine: Engine,
    ids: list[int],
    status: str,
    error: str = "boom",
    attempts: int = 1,
    max_attempts: int | None = None,
) -> None:
    """Test-only: put jobs where a worker would have left them: `status` after `attempts` of
    `max_attempts` (default: `attempts`), `error` as last error; a running one locked by "w1"
    with an hour's lease."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = :status, attempts = :attempts, "
                "max_attempts = :max_attempts, "
                "last_error = :error, finished_at = CASE WHEN :status IN "
                "('done', 'failed', 'cancelled') THEN now() END, locked_by = CASE WHEN "
                ":status = 'running' THEN 'w1' END, lease_expires_at = CASE WHEN "
                ":status = 'running' THEN now() + interval '1 hour' END WHERE id = ANY(:ids)"
            ),
            {
                "status": status,
                "ids": ids,
                "error": error,
                "attempts": attempts,
                "max_attempts": attempts if max_attempts is None else max_attempts,
            },
        )


def statuses(engine: Engine, ids: list[int] | None = None) -> dict[int, str]:
    """Each job's status by id (every job when `ids` is None)."""
    return {job_id: job.status for job_id, job in jobs_by_id(engine, ids).items()}


def task_statuses(target: Session | Connection | Engine) -> list[tuple[str, str, int]]:
    """(task, status, attempts) of every job, oldest first."""
    jobs = enqueued_jobs(target, status=None)
    return [(job.task, job.status, job.attempts) for job in jobs]


def count_jobs(engine: Engine) -> int:
    """How many jobs the table holds."""
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(Job)) or 0)


def order_count(engine: Engine) -> int:
    """How many rows the applications' `public.orders` table holds."""
    with engine.connect() as conn:
        return int(conn.scalar(text("SELECT count(*) FROM public.orders")) or 0)


def jobs_of_task(engine: Engine, task: str = "sync") -> list[Any]:
    """The jobs of `task`, live or finished (`every_job`: a kept job is in the history), as
    rows with the jobs table's columns, oldest first."""
    with engine.connect() as conn:
        query = f"SELECT * FROM {every_job(conn)} WHERE task = :task ORDER BY id"
        return list(conn.execute(text(query), {"task": task}))


def really_failed(engine: Engine) -> tuple[int, int, int]:
    """(a KeyError of task `smtp_send`, an SMTP error of task `mail`, a job cancelled with a
    reason), the first two failed by a real worker: their last_error is the traceback."""
    registry = Registry()

    @registry.task(name="smtp_send", max_attempts=1)
    def smtp_send(order: int) -> None:
        raise KeyError("order")

    @registry.task(name="mail", max_attempts=1)
    def mail() -> None:
        raise ConnectionError("SMTP server said 421: try later")

    (key_error,) = enqueue_jobs(engine, "smtp_send", 1, args={"order": 1}, max_attempts=1)
    (smtp,) = enqueue_jobs(engine, "mail", 1, max_attempts=1)
    run_until_empty(engine, registry, WorkerConfig(poll_only=True))
    (reason,) = enqueue_jobs(engine, "report", 1)
    set_status(engine, [reason], "cancelled", "cancelled: the row it was about was deleted")
    assert statuses(engine) == {key_error: "failed", smtp: "failed", reason: "cancelled"}
    return key_error, smtp, reason


def keep_jobs(engine: Engine, queue: str = "default") -> None:
    """Keep `queue`'s finished jobs (retention keep), creating it if it is not there."""
    with engine.begin() as conn:
        if not admin.create_queue(conn, queue, retention="keep"):
            admin.set_retention(conn, queue, "keep")


def signal_now(engine: Engine, key: str, payload: Any = None, **kwargs: Any) -> int:
    """`sqla_queue.signal` in a transaction of its own; the jobs it woke."""
    with Session(engine) as session, session.begin():
        return sqla_queue.signal(session, key, payload, **kwargs)


def make_due(engine: Engine) -> None:
    """Pretend the retry delay has passed: every queued job is due now."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET run_at = now() WHERE status = 'queued'"))


def received(
    conn: psycopg.Connection[Any],
    wait: float = 0.3,
    first_within: float | None = None,
    expect: int = 0,
) -> list[str]:
    """Payloads of the notifications that arrive within `wait` seconds (after the first, when
    `first_within` bounds the wait for that one; after the first `expect`, waited for with a
    60 s deadline: deadlines, never a duration asserted, so a loaded server's late delivery
    is not a missing notification)."""
    got: list[str] = []
    if first_within is not None:
        got += [n.payload for n in conn.notifies(timeout=first_within, stop_after=1)]
    deadline = time.monotonic() + 60
    while len(got) < expect and (left := deadline - time.monotonic()) > 0:
        got += [n.payload for n in conn.notifies(timeout=left, stop_after=expect - len(got))]
    return got + [n.payload for n in conn.notifies(timeout=wait)]


def nested(depth: int, leaf: Any = 1) -> Any:
    """`leaf` inside `depth` lists."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def record_run(engine: Engine, task: str, slot: dt.datetime) -> None:
    """Test-only: the periodic table as a worker that ran `slot` leaves it."""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO sqla_queue.periodic_slots (task, slot) VALUES (:t, :s)"),
            {"t": task, "s": slot},
        )


def diamond(engine: Engine, workflow_id: str = "wf-1", task: str = "t") -> dict[str, int]:
    """a -> (b, c) -> d, c run on a's failure."""
    with Session(engine) as session, session.begin():
        a = enqueue(session, f"{task}.a", {}, workflow_id=workflow_id)
        b = enqueue(session, f"{task}.b", {}, depends_on=[a])
        c = enqueue(session, f"{task}.c", {}, depends_on=[Dependency(a, on_failure="run")])
        d = enqueue(session, f"{task}.d", {}, depends_on=[b, c])
        session.flush()
        return {"a": a.id, "b": b.id, "c": c.id, "d": d.id}


def seq_jobs(
    engine: Engine, sequence: str, count: int, queue: str = "default", **extra: Any
) -> list[int]:
    with Session(engine) as session, session.begin():
        handles = [
            enqueue(session, "t", {"n": n}, queue=queue, sequence=sequence, **extra)
            for n in range(count)
        ]
        session.flush()
        return [h.id for h in handles]


def http_get(port: int, path: str, timeout: float = 30) -> tuple[int, dict[str, Any]]:
    """GET http://127.0.0.1:PORT/PATH: its status and JSON body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def answers_with(port: int, path: str, status: int) -> bool:
    try:
        return http_get(port, path)[0] == status
    except OSError:
        return False


def end_sleeps(engine: Engine) -> None:
    """Time passes for durable sleeps (`ctx.sleep`): every recorded sleep's end is past,
    and a keeper's look has queued the parked sleepers (due now)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.job_steps SET result = jsonb_build_object('until', "
                "now() - interval '1 second') WHERE kind = 'sleep'"
            )
        )
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET run_at = now() - interval '1 second' "
                "WHERE status = 'waiting' AND signal_key IS NULL AND deps_left IS NULL"
            )
        )
        # imported here: the old-code test loads this module with an older release
        from sqla_queue.db.queries import steps as step_queries

        conn.execute(step_queries.wake_sleeping_jobs(), {"ahead": 0.0})
