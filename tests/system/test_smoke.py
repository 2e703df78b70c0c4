from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from sqla_queue import Job, Registry, enqueue
from sqla_queue.testing import run_until_empty


def test_enqueued_job_runs_once_and_is_deleted(engine: Engine) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.task(name="record")
    def record(n: int) -> None:
        calls.append(n)

    with Session(engine) as session, session.begin():
        enqueue(session, "record", {"n": 7})

    stats = run_until_empty(engine, registry)

    assert calls == [7]
    assert stats.succeeded == 1
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0
