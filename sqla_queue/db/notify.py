"""The LISTEN side of NOTIFY, on a connection of its own: what the worker's LISTEN thread
(`sqla_queue.runtime.listener`) and `wait_for` (`sqla_queue.enqueue.results`) hold."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine


@contextmanager
def listening(engine: Engine, statement: str) -> Iterator[Any]:
    """A psycopg connection of its own in autocommit that has sent `statement` (a LISTEN);
    closed, never returned to the pool, at the end."""
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        assert conn is not None
        conn.autocommit = True
        conn.execute(statement)
        yield conn
    finally:
        try:
            raw.invalidate()
        finally:
            raw.close()
