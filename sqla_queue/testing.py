"""Helpers for tests: databases cloned from a migrated template, and draining the queue.

    databases = TemplateDatabases("postgresql://postgres@127.0.0.1/postgres")
    databases.create_template()          # once per test session: migrated
    url = databases.clone()              # per test: CREATE DATABASE ... TEMPLATE ...
    ...
    databases.drop(url)

`run_until_empty(engine, registry)` runs a burst-mode worker in the calling thread.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url

from .database import normalize_url
from .migrate import upgrade
from .registry import Registry
from .worker import Worker, WorkerConfig, WorkerStats


class TemplateDatabases:
    """Creates one migrated template database and cheap clones of it, one per test."""

    def __init__(
        self,
        admin_url: str,
        prefix: str = "sqlaq_test",
        prepare: Callable[[Engine], None] | None = None,
    ) -> None:
        self.admin_url = normalize_url(admin_url)
        self.prefix = prefix
        self.template = f"{prefix}_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._prepare = prepare
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
            if self._prepare is not None:
                self._prepare(engine)
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


def run_until_empty(
    engine: Engine, registry: Registry, config: WorkerConfig | None = None
) -> WorkerStats:
    """Run a worker in burst mode in this thread until no job is due; return its counts."""
    config = config or WorkerConfig(concurrency=1, batch=50, poll_only=True)
    config.burst = True
    return Worker(engine, registry, config).run(install_signal_handlers=False)
