"""What the table worker's parts hand each other: a `ClaimedJob` (its `Outcome` is the job
core's, `sqla_queue.job.outcome`)."""

from __future__ import annotations

import json
import json.scanner
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sqla_queue.job.context import JobContext
from sqla_queue.job.outcome import JobAttempt

__all__ = ["ClaimColumns", "ClaimedJob", "ContextParts", "decode_args"]

_scan_once: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed: its context is a decoder's
)
"""The JSON decoder's own scanner (C): `json.loads` without its three Python-level calls and
its two whitespace matches, for the JSON text PostgreSQL writes (a jsonb's, which has no
whitespace around it)."""


def decode_args(args_json: str) -> tuple[dict[str, Any], str | None]:
    """A claimed row's args, decoded from its JSON text: (args, None), or ({}, why not)."""
    try:  # a jsonb's text: one JSON object, nothing around it
        args, end = _scan_once(args_json, 0)
    except (StopIteration, RecursionError, ValueError, TypeError):
        pass  # json.loads says why (or decodes what is around the value)
    else:
        if end == len(args_json) and type(args) is dict:
            return args, None
    try:
        args = json.loads(args_json)
    except (RecursionError, ValueError) as exc:
        return {}, f"args cannot be decoded ({type(exc).__name__}: {exc})"[:500]
    if not isinstance(args, dict):
        return {}, f"args must be a JSON object, got {type(args).__name__}"
    return args, None


class ClaimColumns:
    """Where each column is in the claim's rows (plain tuples), found once per claim."""

    __slots__ = (
        "about",
        "args_json",
        "attempts",
        "id",
        "key",
        "max_attempts",
        "meta_json",
        "queue",
        "status",
        "tags",
        "task",
    )

    def __init__(self, keys: list[str]) -> None:
        self.about: int = keys.index("about")
        self.args_json: int = keys.index("args_json")
        self.attempts: int = keys.index("attempts")
        self.id: int = keys.index("id")
        self.max_attempts: int = keys.index("max_attempts")
        self.meta_json: int = keys.index("meta_json")
        self.queue: int = keys.index("queue")
        self.status: int = keys.index("status")
        self.tags: int = keys.index("tags")
        self.task: int = keys.index("task")


class ContextParts(NamedTuple):
    """What every job's `JobContext` of one worker shares, besides its row's own values."""

    resources: Mapping[str, Any]
    heartbeat: Any = None
    session_factory: Any = None
    parent_results: Any = None
    steps: Any = None
    signals: Any = None
    journal_sink: Any = None


_BUILDING = threading.Lock()
"""Held while a claimed job's context is built: the handler thread that runs it and the
keeper (a heartbeat, a cancel) may ask for it at once, and must get the same one."""


class ClaimedJob(JobAttempt):
    """A job this worker has claimed and not yet finished. Keyed by (id, attempt): a job
    re-claimed by the same worker after a reap is a different `ClaimedJob`.

    Made by the dispatcher from a claimed row with only what the board and the keeper read
    of every job (its id, attempt, task, queue, when claimed); its args are decoded and its
    `JobContext` built on first use (`ctx`, `args`, `decode_error`), which is the handler
    thread's as it starts the job. The dispatcher sends its next claim that much sooner:
    the server works on it while the handler threads make the jobs of the one before."""

    __slots__ = (
        "_args",
        "_ctx",
        "_decode_error",
        "_source",
        "_token",
        "claimed_at",
        "next_report",
        "reported_started",
    )

    def __init__(self, row: Sequence[Any], columns: ClaimColumns, parts: ContextParts) -> None:
        # JobAttempt's fields, set here without a context (`JobAttempt.__init__` reads its)
        self.id: int = (job_id := row[columns.id])
        self.task: str = row[columns.task]
        self.queue: str = row[columns.queue]
        self.attempt: int = (attempt := row[columns.attempts])
        self.max_attempts = row[columns.max_attempts]
        self.key = (job_id, attempt)
        self.deadline = None
        self.started = False
        self.started_at = None
        self.pending = None
        self.gave_up_at = None
        self.future = None
        self.task_handle = None
        self._ctx: JobContext | None = None
        self._source: tuple[Sequence[Any], ClaimColumns, ContextParts] | None = (
            row,
            columns,
            parts,
        )
        self.claimed_at = time.monotonic()
        self.reported_started = False
        self._token = [True]
        self.next_report = 0.0
        """When the keeper reports the overrunning handler next (0: not reported yet)."""

    def _build(self) -> JobContext:
        """Decode the args and build the context, once (whoever asks first)."""
        with _BUILDING:
            ctx = self._ctx
            if ctx is not None:
                return ctx
            assert self._source is not None
            row, columns, parts = self._source
            # Decoded here, one job at a time: a row that cannot be decoded fails alone.
            self._args, self._decode_error = decode_args(row[columns.args_json])
            ctx = self._ctx = JobContext(  # by position: keywords cost more to pass
                self.id,
                self.task,
                self.queue,
                self.attempt,
                parts.heartbeat,
                parts.resources,
                row[columns.tags],
                row[columns.meta_json],
                parts.session_factory,
                parts.parent_results,
                parts.steps,
                parts.signals,
                parts.journal_sink,
                row[columns.about],
            )
            self._source = None  # the row is not needed any more
            return ctx

    @property
    def ctx(self) -> JobContext:  # type: ignore[override]  # JobAttempt's slot, built on use
        ctx = self._ctx
        return ctx if ctx is not None else self._build()

    @property
    def args(self) -> dict[str, Any]:  # type: ignore[override]
        if self._ctx is None:
            self._build()
        return self._args

    @property
    def decode_error(self) -> str | None:  # type: ignore[override]
        """Why the job's args could not be decoded (it fails without running), or None."""
        if self._ctx is None:
            self._build()
        return self._decode_error

    def take(self) -> bool:
        """Become the one who settles this job: True once, for the first caller only (the
        handler thread, the timeout watch, or shutdown)."""
        try:
            self._token.pop()  # atomic: only one caller can take the one element
        except IndexError:
            return False
        return True

    @property
    def settled(self) -> bool:
        """Whether someone has taken the job to settle it."""
        return not self._token
