"""The table worker's step journal: a job's durable steps kept in `sqla_queue.job_steps`.

Each read and each record is one statement on an autocommit connection of the worker's
engine (never the claim's connection): one statement is atomic alone, so it needs no
`BEGIN` and no `COMMIT` round trip of its own (a run reads its job's steps once, at its
first step; a plain step then costs the pool's pre-ping and its record). A step with
`session=True` runs its function on a `Session` whose transaction also records the step:
its writes and its record commit together, or neither, so a step that only writes to the
database runs exactly once. Every record is fenced on the job's attempt by a plain read of
the job's row, never a lock (`queries.steps`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue.db.queries import steps as step_queries
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.steps import RecordedStep, StepWrite

__all__ = ["EngineJournal", "ExecuteJournal"]


def _params(write: StepWrite) -> dict[str, Any]:
    params = asdict(write)
    params["result"] = params.pop("result_json")
    return params


def _recorded(row: Any) -> RecordedStep | None:
    if row is None:
        return None
    return RecordedStep(row.kind, row.status, row.result, row.left)


def _by_name(rows: Any) -> dict[str, RecordedStep]:
    return {row.name: RecordedStep(row.kind, row.status, row.result, row.left) for row in rows}


class EngineJournal:
    """A `StepJournal` on `engine` (the worker's): reads and plain records in autocommit,
    a `session=True` step in its session's transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._auto = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._read = step_queries.read_step()
        self._read_all = step_queries.read_steps()
        self._record = step_queries.record_step()

    def read(self, job_id: int, name: str) -> RecordedStep | None:
        with self._auto.connect() as conn:
            row = conn.execute(self._read, {"job_id": job_id, "name": name}).first()
        return _recorded(row)

    def read_all(self, job_id: int) -> dict[str, RecordedStep]:
        with self._auto.connect() as conn:
            rows = conn.execute(self._read_all, {"job_id": job_id}).all()
        return _by_name(rows)

    def record(self, write: StepWrite) -> RecordedStep | None:
        """One fenced `INSERT ... ON CONFLICT ... RETURNING`, committed by itself: psycopg
        returns its result only once the server ended the statement's own transaction, so
        a row returned is a record committed."""
        with self._auto.connect() as conn:
            return _recorded(conn.execute(self._record, _params(write)).first())

    def record_in_session(
        self, write: StepWrite, call: Callable[[Session], str]
    ) -> RecordedStep | None:
        with Session(self.engine) as session:
            result_json = call(session)
            session.flush()  # the step's rows first, then its record, one transaction
            params = {**_params(write), "result": result_json}
            row = session.execute(self._record, params).first()
            if row is None:  # fenced off, or recorded by another attempt: none of it commits
                session.rollback()
                return None
            recorded = _recorded(row)
            session.commit()
        return recorded


class ExecuteJournal:
    """A `StepJournal` over one `execute(statement, params)` callable: `sqla_queue.testing.
    drain`'s, whose jobs are claimed, and their steps recorded, in the caller's transaction.
    A `session=True` step is refused: its session would need a transaction of its own."""

    def __init__(self, execute: Callable[..., Any]) -> None:
        self.execute = execute
        self._read = step_queries.read_step()
        self._read_all = step_queries.read_steps()
        self._record = step_queries.record_step()

    def read(self, job_id: int, name: str) -> RecordedStep | None:
        return _recorded(self.execute(self._read, {"job_id": job_id, "name": name}).first())

    def read_all(self, job_id: int) -> dict[str, RecordedStep]:
        return _by_name(self.execute(self._read_all, {"job_id": job_id}))

    def record(self, write: StepWrite) -> RecordedStep | None:
        return _recorded(self.execute(self._record, _params(write)).first())

    def record_in_session(
        self, write: StepWrite, call: Callable[[Session], str]
    ) -> RecordedStep | None:
        raise ConfigurationError(
            detail=f"step {write.name!r}: a session=True step needs a job run by a worker "
            "(sqla_queue.Worker, or sqla_queue.testing.run_until_empty in tests); drain runs "
            "its jobs in your transaction, where the step's session cannot commit alone"
        )
