"""A job's error history: one entry per attempt that ended without success, kept in the
job's `errors` column (jsonb, migration sqlaq_0010), bounded.

What counts: an attempt whose handler raised (retried or failed for good), timed out, or
failed without running (its args could not be decoded, its result could not be kept, its
outcome could not be stored), and one the reaper found lost (class `JobLost`). A snooze or a
deferral (no worker has the task) is not an error: it spends no attempt and keeps no entry.

Each entry holds the attempt number, the worker, when the attempt started and ended, the
error's class and message, and its traceback without the queue's own frames on top (it
starts at the user's code: a middleware, else the handler), at most `MAX_TRACEBACK_CHARS`
(its head and its tail). A job keeps at most `MAX_ENTRIES` entries: its first one and the
latest `MAX_ENTRIES - 1` (the first failure often says what went wrong; the latest say what
goes wrong now). The statements that retry and fail jobs build and trim the array in the
same UPDATE (`sqla_queue.db.queries.jobs`); this module computes what the worker sends.
"""

from __future__ import annotations

import functools
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from sqla_queue.job.outcome import storable

if TYPE_CHECKING:
    from sqla_queue.job.outcome import Outcome

__all__ = [
    "LOST_CLASS",
    "MAX_ENTRIES",
    "MAX_MESSAGE_CHARS",
    "MAX_TRACEBACK_CHARS",
    "error_class",
    "error_entry",
    "handler_traceback",
]

MAX_ENTRIES = 20
"""Entries a job keeps at most: its first and its latest 19."""
MAX_MESSAGE_CHARS = 2_000
"""Characters of an error's message an entry keeps (its head)."""
MAX_TRACEBACK_CHARS = 4_000
"""Characters of a traceback an entry keeps: its head and its tail, the middle cut."""
_HEAD_CHARS = 1_000
LOST_CLASS = "JobLost"
"""The class of the entry the reaper adds for a job whose worker stopped heartbeating."""
NO_EXCEPTION_CLASS = "JobFailed"
"""The class of a failure without an exception (and without a class of its own)."""

_PACKAGE = str(Path(__file__).resolve().parent.parent)


@functools.lru_cache(maxsize=1024)
def _ours(filename: str) -> bool:
    """Whether a frame's file is inside the sqla_queue package."""
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return path == _PACKAGE or path.startswith(_PACKAGE + "/")


def error_class(exc: BaseException) -> str:
    """`exc`'s class as a name: `ValueError` for a builtin, else `module.QualName`."""
    kind = type(exc)
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not lose the entry
        text = f"<exception str() failed: {type(exc).__name__}>"
    return storable(text[:MAX_MESSAGE_CHARS])


def _trim(te: traceback.TracebackException, seen: set[int]) -> None:
    """Drop the leading frames inside sqla_queue from `te` and each exception it chains to
    (all of them if no frame is the user's: then the error is the queue's own)."""
    if id(te) in seen:
        return
    seen.add(id(te))
    frames = list(te.stack)
    first = next((i for i, frame in enumerate(frames) if not _ours(frame.filename)), None)
    if first:
        te.stack = traceback.StackSummary.from_list(frames[first:])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _trim(chained, seen)


def bounded(text: str, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """`text`, or its head and tail with the middle cut (saying how much) if longer."""
    if len(text) <= limit:
        return text
    tail = limit - _HEAD_CHARS
    cut = len(text) - _HEAD_CHARS - tail
    return f"{text[:_HEAD_CHARS]}\n[... {cut} characters cut ...]\n{text[-tail:]}"


def handler_traceback(exc: BaseException) -> str:
    """`exc`'s traceback with its chain, from the user's code down (the queue's own frames
    on top dropped), bounded (`bounded`) and storable."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    _trim(te, set())
    return storable(bounded("".join(te.format())))


def error_entry(outcome: Outcome) -> tuple[str, str, str | None]:
    """(class, message, traceback) of a failed attempt's history entry."""
    exc = outcome.exception
    if exc is not None:
        return outcome.error_class or error_class(exc), _message(exc), handler_traceback(exc)
    text = outcome.error or ""
    first, _, rest = text.strip().partition("\n")
    return (
        outcome.error_class or NO_EXCEPTION_CLASS,
        storable(first[:MAX_MESSAGE_CHARS]),
        storable(bounded(text)) if rest else None,
    )
