"""What the signal tests share: the mailbox's contents, and jobs parked waiting for a key."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from helpers.support import enqueue_jobs
from sqla_queue import JobContext, Registry
from sqla_queue.testing import drain


def mailbox(engine: Engine) -> list[tuple[str, Any, str]]:
    """(key, payload, wake) of every signal in the mailbox, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT key, payload, wake FROM sqla_queue.signals ORDER BY id"))
        return [tuple(row) for row in rows]


def park_jobs(engine: Engine, key: str, count: int = 1) -> list[int]:
    """Commit `count` jobs whose handler waits for signal `key`, run them (they park), and
    return their ids."""
    registry = Registry()

    @registry.task(name="waiter", pass_context=True)
    def waiter(ctx: JobContext) -> None:
        ctx.wait_for_signal(key, timeout=3600)

    ids = enqueue_jobs(engine, "waiter", count)
    assert drain(engine, registry).waiting == count
    return ids
