"""A job's journal: its progress (`ctx.progress(0.4, "resized 4 of 10")`) and the log lines
its handler emits, kept with the attempt.

The job core decides what is kept and when it is written; a `JournalSink` (the table
worker's, `sqla_queue.worker.journal`) writes it. Progress is throttled: a write at most
every `PROGRESS_EVERY` seconds per job, the latest value kept in memory between writes and
written when the run ends (`JobJournal.close`), so a tight loop costs at most one write a
second. Log lines are the records made through `logging` (at the levels the loggers'
configuration lets through) while the handler runs, on its own thread or in its
own asyncio task (`JOURNAL_JOB`, a context variable the runner sets): at most
`MAX_LOG_LINES` per attempt (the rest counted as dropped), each at most
`MAX_LOG_LINE_CHARS` characters, written once when the run ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime as dt
import logging
import math
import threading
import time
from typing import Any, Protocol

__all__ = [
    "JOURNAL_JOB",
    "MAX_LOG_LINES",
    "MAX_LOG_LINE_CHARS",
    "MAX_PROGRESS_MESSAGE",
    "PROGRESS_EVERY",
    "JobJournal",
    "JournalSink",
    "JournaledJob",
    "capture_job_logs",
]

log = logging.getLogger("sqla_queue.worker")

PROGRESS_EVERY = 1.0
"""Seconds between two progress writes of one job at most once a second; the latest value
of a run is written when it ends."""
MAX_PROGRESS_MESSAGE = 1000
"""Characters of a progress message kept (the rest cut, with "...")."""
MAX_LOG_LINES = 200
"""Log lines kept per attempt; later ones are counted (`dropped`), not kept."""
MAX_LOG_LINE_CHARS = 4000
"""Characters kept of one log line (its traceback included); the rest cut, with "..."."""


class JournaledJob(Protocol):
    """What a log record is kept by: the job's context (`JobContext.open_journal`)."""

    def open_journal(self) -> JobJournal: ...


JOURNAL_JOB: contextvars.ContextVar[JournaledJob | None] = contextvars.ContextVar(
    "sqla_queue_journal_job", default=None
)
"""The job whose handler runs in this thread or task (set by the runner around the run):
the log records emitted here are that job's."""


class JournalSink(Protocol):
    """Where a job's journal is written (the worker's: the `job_progress` and `job_logs`
    tables, each write fenced on the attempt); `keeps_logs`: whether log lines are taken."""

    keeps_logs: bool

    def write_progress(
        self, job_id: int, attempt: int, fraction: float | None, message: str | None
    ) -> None: ...

    def write_logs(
        self, job_id: int, attempt: int, lines: list[dict[str, Any]], dropped: int
    ) -> None: ...


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class JobJournal:
    """One attempt's progress and log lines, written through `sink`."""

    __slots__ = (
        "_clock",
        "_inflight",
        "_lock",
        "_next_write",
        "_pending",
        "_sink",
        "attempt",
        "dropped",
        "job_id",
        "lines",
        "progress_value",
        "progress_writes",
    )

    def __init__(
        self, sink: JournalSink, job_id: int, attempt: int, clock: Any = time.monotonic
    ) -> None:
        self._sink = sink
        self.job_id = job_id
        self.attempt = attempt
        self._clock = clock
        self._lock = threading.Lock()
        self._inflight: concurrent.futures.Future[None] | None = None
        """An async handler's progress write, made on a thread of `_background_writes`."""
        self._next_write = 0.0
        self._pending = False
        """A progress value is held that is not written yet."""
        self.progress_value: tuple[float | None, str | None] | None = None
        """The latest progress reported: (fraction, message)."""
        self.progress_writes = 0
        """Progress writes sent so far (for tests and metrics)."""
        self.lines: list[dict[str, Any]] = []
        self.dropped = 0

    def progress(self, fraction: float | None, message: str | None) -> None:
        """Hold (`fraction`, `message`) and write it unless a write went out less than
        `PROGRESS_EVERY` seconds ago."""
        value = (checked_fraction(fraction), None if message is None else _checked_message(message))
        on_a_loop = _on_an_event_loop()
        with self._lock:
            self.progress_value = value
            now = self._clock()
            busy = on_a_loop and self._inflight is not None and not self._inflight.done()
            if now < self._next_write or busy:  # one write in flight per job, in order
                self._pending = True
                return
            self._next_write = now + PROGRESS_EVERY
            self._pending = False
            if on_a_loop:  # an async handler: the loop is every async job's, never block it
                self._inflight = _background_writes().submit(self._write_progress, value)
                return
        self._write_progress(value)

    def record(self, record: logging.LogRecord) -> None:
        """Keep a log record the handler emitted, as one line (up to the caps)."""
        if len(self.lines) >= MAX_LOG_LINES:
            self.dropped += 1
            return
        try:
            message = record.getMessage()
        except Exception as exc:  # a bad format string: keep what there is, as logging does
            message = f"{record.msg!r} (not formatted: {type(exc).__name__})"
        if record.exc_info and record.exc_info[1] is not None:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
        self.lines.append(
            {
                "at": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
                "level": record.levelname,
                "logger": record.name,
                "message": _cut(message, MAX_LOG_LINE_CHARS),
            }
        )

    def close(self) -> None:
        """The run ended: write the latest progress if it is not written yet, and the log
        lines if any. A failed write is logged, never raised (the job's outcome stands)."""
        inflight = self._inflight
        if inflight is not None:  # an async handler's last write lands before the final one
            concurrent.futures.wait([inflight])
        with self._lock:
            pending, self._pending = self._pending, False
            value = self.progress_value
        if pending and value is not None:
            self._write_progress(value)
        if self.lines or self.dropped:
            try:
                self._sink.write_logs(self.job_id, self.attempt, self.lines, self.dropped)
            except Exception as exc:
                log.warning("job %s: its log lines were not kept: %s", self.job_id, exc)

    def _write_progress(self, value: tuple[float | None, str | None]) -> None:
        self.progress_writes += 1
        try:
            self._sink.write_progress(self.job_id, self.attempt, *value)
        except Exception as exc:
            log.warning("job %s: its progress was not written: %s", self.job_id, exc)


def _on_an_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


_writers: list[concurrent.futures.ThreadPoolExecutor] = []


def _background_writes() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that write async handlers' progress (made on first use)."""
    with _install_lock:
        if not _writers:
            _writers.append(
                concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="sqla-queue-progress")
            )
        return _writers[0]


def checked_fraction(fraction: object) -> float | None:
    """`fraction` as a float from 0 to 1, or None; else a `ValueError` saying what it takes."""
    if fraction is None:
        return None
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ValueError(
            f"ctx.progress(fraction) must be a number from 0 to 1 (or None), got {fraction!r}"
        )
    value = float(fraction)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"ctx.progress(fraction) must be from 0 to 1 (0.4 is 40%), got {value}")
    return value


def _checked_message(message: object) -> str:
    if not isinstance(message, str):
        raise ValueError(f"ctx.progress(message) must be text (or None), got {message!r}")
    return _cut(message, MAX_PROGRESS_MESSAGE)


_installed: list[Any] = []
_install_lock = threading.Lock()


def capture_job_logs() -> None:
    """Keep the log records made while a job's handler runs with that job (once per
    process; the worker calls it when it starts: nothing is installed at import).

    A log record factory (`logging.setLogRecordFactory`, chained to the one in place), not
    a handler: it sees each record its logger's level lets through, whatever handlers the
    application configured, and adding it leaves logging's own fallback (the last-resort
    handler of a process that configured none) as it was."""
    with _install_lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            job = JOURNAL_JOB.get()
            if job is not None:  # one thread or task per job: no lock needed
                job.open_journal().record(record)
            return record

        logging.setLogRecordFactory(make_record)
        _installed.append(make_record)
