"""Helpers shared by the test modules: a task log table, waiting, reading job rows."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.orm import Session

from sqla_queue import Job, Registry, enqueue_many
from sqla_queue.cli import main
from sqla_queue.db import queries
from sqla_queue.db.database import normalize_url
from sqla_queue.worker import Worker, WorkerConfig, WorkerStats

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
SQLA_QUEUE_BIN = str(Path(sys.executable).with_name("sqla-queue"))

# Unlogged: a handler's commit then waits for no WAL flush, which keeps 10,000 jobs quick.
TASK_LOG_DDL = text(
    "CREATE UNLOGGED TABLE public.task_log ("
    " job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
    " thread text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
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
    "INSERT INTO public.task_log (job_id, attempt, pid, thread, at) "
    "VALUES (:j, :a, :p, :t, to_timestamp(:at))"
)


def record_attempt(url: str, job_id: int, attempt: int, at: float | None = None) -> None:
    """Insert (job id, attempt, pid, thread) into `task_log`, on a pooled engine per URL;
    `at` (epoch seconds, e.g. the handler's own start) instead of the insert's clock."""
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


def jobs_by_id(engine: Engine, ids: Sequence[int] | None = None) -> dict[int, Job]:
    """Job rows, detached, by id (all of them when `ids` is None)."""
    with Session(engine, expire_on_commit=False) as session:
        query = select(Job)
        if ids is not None:
            query = query.where(Job.id.in_(list(ids)))
        return {job.id: job for job in session.scalars(query)}


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll `condition` until it returns something truthy; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


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
    """`SELECT count(*) FROM sqla_queue.jobs WHERE <condition>` (test-only literal SQL)."""
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
    """`sqla-queue worker --app apps.tasks:registry ARGS` as a subprocess."""
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

    def stop(self, timeout: float = 20.0) -> WorkerStats:
        """Stop the worker the way another thread of the application would."""
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats
