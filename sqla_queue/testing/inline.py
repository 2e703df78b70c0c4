"""Inline mode: each commit runs the jobs that are then due, before `commit()` returns.

    with inline(registry) as runs:
        client.post("/orders", json={...})     # the view commits; its job runs right there
    assert runs.succeeded == 1

For unit tests of code that enqueues, where running a worker is beside the point. Each
commit calls `drain` on the committing session's database: the jobs are real rows, claimed
and finished by the real statements. What it does not model:

- concurrency and timing: jobs run one at a time, in the committing thread, in priority
  order, before `commit()` returns; NOTIFY/LISTEN, leases, heartbeats and reaping play no
  part, and a sync handler is not interrupted at its `timeout` (as under the worker, one
  that returns past it timed out);
- jobs scheduled for later (`delay`, `run_at`, retries waiting on backoff) do not run at
  the commit that enqueued them, unless `include_scheduled=True`;
- isolation between tests: each commit runs every due job of that database, not only its
  own (give each test its own database, as the plugin's fixtures do); a commit on a
  database without sqla-queue's schema (another of the application's) runs nothing;
- a rolled-back transaction runs nothing (as in production: its jobs never existed).

A handler's exception is raised from `commit()` (after its outcome is written) unless
`reraise=False`. Jobs the handlers enqueue run in the same round, not by a nested one; so do
the jobs of a commit made on another thread while a round runs (one round at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, event
from sqlalchemy.orm import Session

from sqla_queue.db import queries
from sqla_queue.db.models import Job
from sqla_queue.registry import Registry
from sqla_queue.testing.drain import DrainResult, drain

_round = threading.Lock()
"""Held while a round runs, on any thread: a commit made meanwhile (a handler's own, also on
the thread an async handler runs on) leaves its jobs to that round."""


def _holds_the_queue(bind: Connection | Engine) -> bool:
    """False for a database without sqla-queue's schema: another database of the application."""
    if bind.dialect.name != "postgresql":
        return False
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            return _holds_the_queue(connection)
    return bind.execute(queries.schema_revision()).scalar() is not None


@contextmanager
def inline(
    registry: Registry,
    *,
    include_scheduled: bool = False,
    reraise: bool = True,
) -> Iterator[DrainResult]:
    """Run due jobs at every session commit while the block runs; yields the running totals."""
    totals = DrainResult()

    def run_at_commit(session: Session) -> None:
        if not _round.acquire(blocking=False):
            return
        try:
            bind = session.get_bind(mapper=Job)
            if isinstance(bind, Connection | Engine) and _holds_the_queue(bind):
                drain(
                    bind,
                    registry,
                    include_scheduled=include_scheduled,
                    reraise=reraise,
                    into=totals,
                )
        finally:
            _round.release()

    event.listen(Session, "after_commit", run_at_commit)
    try:
        yield totals
    finally:
        event.remove(Session, "after_commit", run_at_commit)
