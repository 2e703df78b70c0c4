"""The enqueue paths, in one table the enqueue tests share: each writes the job of `row`
(a dict of `Job` fields: task, args and `JobOptions`' fields) its own way.

`PATHS` take a sync `Session` (its transaction is the test's); `EVERY_PATH` takes the
test's engine and writes in a transaction of its own, and holds the paths that need one
of their own kind too: a task's `.enqueue`, the async ones, a Core connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import Job, Registry, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from sqla_queue.enqueue import COPY_MIN_ROWS

Write = Callable[[Session, dict[str, Any]], Any]

PATHS: dict[str, Write] = {
    "enqueue": lambda s, row: enqueue(s, **row, flush=True),
    "session.add": lambda s, row: (s.add(Job(**row)), s.flush()),
    "insert": lambda s, row: enqueue_many(s, [row]),
    "copy": lambda s, row: enqueue_many(s, [row] * COPY_MIN_ROWS),
}
"""The same job written by every sync path: enqueue, Job(...), enqueue_many's INSERT and
its COPY (each flushed, so a refusal by the database shows here)."""


def _in_session(write: Write) -> Callable[[Engine, dict[str, Any]], Any]:
    def run(engine: Engine, row: dict[str, Any]) -> Any:
        with Session(engine) as session, session.begin():
            return write(session, row)

    return run


def _task_enqueue(engine: Engine, row: dict[str, Any]) -> Any:
    fields = dict(row)
    task = Registry().task(name=fields.pop("task"))(lambda **kwargs: None)
    args = fields.pop("args", None)
    with Session(engine) as session, session.begin():
        return task.enqueue(session, args, flush=True, **fields)


def _core(engine: Engine, row: dict[str, Any]) -> Any:
    with engine.begin() as connection:
        return enqueue(connection, **row)


def _async(engine: Engine, row: dict[str, Any], many: bool) -> Any:
    async def scenario() -> Any:
        async_engine = create_async_engine(engine.url.set(drivername="postgresql+psycopg"))
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                if many:
                    return await enqueue_many_async(session, [row])
                job = await enqueue_async(session, **row)
                await session.flush()
                return job
        finally:
            await async_engine.dispose()

    return asyncio.run(scenario())


EVERY_PATH: dict[str, Callable[[Engine, dict[str, Any]], Any]] = {
    **{name: _in_session(write) for name, write in PATHS.items()},
    "task.enqueue": _task_enqueue,
    "connection": _core,
    "enqueue_async": lambda engine, row: _async(engine, row, many=False),
    "enqueue_many_async": lambda engine, row: _async(engine, row, many=True),
}
"""Every path a job is written by, each in its own transaction on the test's engine."""
