"""The schema three ways (CLI, this repo's Alembic, the user's Alembic), autogenerate, downgrade."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from helpers.support import REPO_ROOT, SQLA_QUEUE_BIN, subprocess_env
from sqlalchemy import Engine, MetaData, create_engine, inspect, text
from sqlalchemy.orm import Session

from sqla_queue import QueueBase, SchemaMissingError, enqueue
from sqla_queue.db import migrate
from sqla_queue.db.alembic_ext import include_name, include_object
from sqla_queue.db.models import SCHEMA


@pytest.fixture
def empty_engine(empty_database_url: str) -> Iterator[Engine]:
    eng = create_engine(empty_database_url)
    yield eng
    eng.dispose()


def schema_exists(engine: Engine) -> bool:
    return SCHEMA in inspect(engine).get_schema_names()


def assert_usable(engine: Engine) -> None:
    """Migrated: the revision check passes and `enqueue` works on the default queue."""
    with engine.connect() as conn:
        assert migrate.check_schema(conn) == migrate.SCHEMA_REVISION
    with Session(engine) as session, session.begin():
        enqueue(session, "task")
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT queue FROM sqla_queue.jobs")) == "default"


def run(args: list[str], cwd: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=subprocess_env(url), capture_output=True, text=True, timeout=60
    )


# -- three ways to create the schema ----------------------------------------------------------


def test_sqla_queue_migrate_creates_the_schema_without_the_repository(
    empty_database_url: str, empty_engine: Engine, tmp_path: Path
) -> None:
    done = run([SQLA_QUEUE_BIN, "migrate"], tmp_path, empty_database_url)
    assert done.returncode == 0, done.stderr
    assert f"sqla_queue schema at revision {migrate.SCHEMA_REVISION}" in done.stdout
    again = run([SQLA_QUEUE_BIN, "migrate"], tmp_path, empty_database_url)
    assert again.returncode == 0, again.stderr  # idempotent
    assert_usable(empty_engine)


def test_alembic_upgrade_heads_from_the_repository_root(
    empty_database_url: str, empty_engine: Engine
) -> None:
    alembic = str(Path(sys.executable).with_name("alembic"))
    done = run([alembic, "upgrade", "heads"], REPO_ROOT, empty_database_url)
    assert done.returncode == 0, done.stderr
    assert_usable(empty_engine)
    with empty_engine.connect() as conn:
        versions = conn.scalars(
            text(f"SELECT version_num FROM {migrate.VERSION_TABLE_SCHEMA}.{migrate.VERSION_TABLE}")
        ).all()
    assert versions == [migrate.SCHEMA_REVISION]  # shared with `sqla-queue migrate`

    down = run([alembic, "downgrade", "sqla_queue@base"], REPO_ROOT, empty_database_url)
    assert down.returncode == 0, down.stderr
    assert not schema_exists(empty_engine)


# -- autogenerate against a migrated database ---------------------------------------------------


def diff(engine: Engine, metadata: MetaData, **options: Any) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_schemas": True, **options})
        return list(compare_metadata(context, metadata))


def test_models_match_the_shipped_revision(engine: Engine) -> None:
    assert diff(engine, QueueBase.metadata, include_name=migrate.include_ours) == []


def test_user_autogenerate_with_our_filters_sees_nothing_of_ours(engine: Engine) -> None:
    filters = {"include_name": include_name, "include_object": include_object}
    assert diff(engine, MetaData(), **filters) == []
    # Without the filters the same autogenerate would drop our tables: the filters matter.
    unfiltered = diff(engine, MetaData())
    assert any(op[0] == "remove_table" and op[1].schema == SCHEMA for op in unfiltered)


# -- downgrade and revision checks --------------------------------------------------------------


def test_downgrade_to_base_removes_everything_we_created(empty_engine: Engine) -> None:
    """Our tables, our schema and our version table (it lives in our schema) all go."""
    with empty_engine.connect() as conn:
        before = set(inspect(conn).get_schema_names())
        relations = text(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
        )
        relations_before = set(conn.scalars(relations))
    migrate.upgrade(empty_engine)
    assert schema_exists(empty_engine)

    migrate.downgrade(empty_engine)

    with empty_engine.connect() as conn:
        assert set(inspect(conn).get_schema_names()) == before
        assert set(conn.scalars(relations)) == relations_before
    migrate.upgrade(empty_engine)  # and back up again
    assert_usable(empty_engine)


def test_database_without_our_schema_or_an_older_revision_is_refused(
    empty_engine: Engine, engine: Engine
) -> None:
    with pytest.raises(SchemaMissingError, match="sqla-queue migrate"):
        migrate.check_schema(empty_engine)
    with engine.begin() as conn:
        conn.execute(text("COMMENT ON SCHEMA sqla_queue IS 'sqla_queue revision sqlaq_0000'"))
    with pytest.raises(SchemaMissingError, match=r"sqlaq_0000.*sqla-queue migrate"):
        migrate.check_schema(engine)
