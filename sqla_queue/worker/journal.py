"""The table worker's `JournalSink`: a job's progress and log lines written to
`job_progress` and `job_logs`, each in a short transaction of its own on the worker's
engine, fenced on the attempt (`sqla_queue.db.queries.journal`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from sqla_queue.db.queries import journal as statements
from sqla_queue.job.journal import MAX_LOG_LINES

__all__ = ["DatabaseJournal"]


class DatabaseJournal:
    """Writes journals on `engine` (a handler thread's write: at most one a second per job
    for progress, one per attempt for its log lines)."""

    def __init__(self, engine: Engine, keeps_logs: bool = True) -> None:
        self.engine = engine
        self.keeps_logs = keeps_logs
        """Whether the handlers' log lines are kept (`WorkerConfig.job_logs`)."""
        self._progress = statements.write_progress()
        self._logs = statements.write_logs()

    def write_progress(
        self, job_id: int, attempt: int, fraction: float | None, message: str | None
    ) -> None:
        params = {"job_id": job_id, "attempt": attempt, "fraction": fraction, "message": message}
        with self.engine.begin() as conn:
            conn.execute(self._progress, params)

    def write_logs(
        self, job_id: int, attempt: int, lines: list[dict[str, Any]], dropped: int
    ) -> None:
        params = {
            "job_id": job_id,
            "attempt": attempt,
            "lines": lines,
            "dropped": dropped,
            "cap": MAX_LOG_LINES,
        }
        with self.engine.begin() as conn:
            conn.execute(self._logs, params)
