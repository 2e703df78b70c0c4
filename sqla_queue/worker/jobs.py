"""What the table worker's parts hand each other: a `ClaimedJob` (its `Outcome` is the job
core's, `sqla_queue.job.outcome`)."""

from __future__ import annotations

import json
import json.scanner
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqla_queue.job.context import JobContext
from sqla_queue.job.outcome import JobAttempt

__all__ = ["ClaimColumns", "ClaimedJob", "decode_args"]

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


class ClaimedJob(JobAttempt):
    """A job this worker has claimed and not yet finished. Keyed by (id, attempt): a job
    re-claimed by the same worker after a reap is a different `ClaimedJob`."""

    __slots__ = ("_token", "claimed_at", "next_report", "reported_started")

    def __init__(
        self,
        row: Sequence[Any],
        columns: ClaimColumns,
        resources: Mapping[str, Any],
        heartbeat: Any = None,
        session_factory: Any = None,
        parent_results: Any = None,
        steps: Any = None,
        signals: Any = None,
        journal_sink: Any = None,
    ) -> None:
        # Decoded here, one job at a time: a row that cannot be decoded fails alone.
        args, decode_error = decode_args(row[columns.args_json])
        ctx = JobContext(  # by position: one per job, and keywords cost more to pass
            row[columns.id],
            row[columns.task],
            row[columns.queue],
            row[columns.attempts],
            heartbeat,
            resources,
            row[columns.tags],
            row[columns.meta_json],
            session_factory,
            parent_results,
            steps,
            signals,
            journal_sink,
            row[columns.about],
        )
        JobAttempt.__init__(self, ctx, args, row[columns.max_attempts], decode_error)
        self.claimed_at = time.monotonic()
        self.reported_started = False
        self._token = [True]
        self.next_report = 0.0
        """When the keeper reports the overrunning handler next (0: not reported yet)."""

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
