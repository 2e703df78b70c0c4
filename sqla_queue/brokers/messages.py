"""A relayed job as a broker message: a small JSON document; the job id is its message id."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONTENT_TYPE = "application/json"
FORMAT = "sqla-queue/1"


@dataclass(frozen=True)
class JobMessage:
    """What a broker worker needs to run a relayed job."""

    id: int
    task: str
    args: dict[str, Any]
    queue: str
    priority: int = 0
    attempts: int = 0
    """Attempts the job had in PostgreSQL before it was relayed (0 unless it was re-routed)."""
    max_attempts: int | None = None
    created_at: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobMessage:
        """From a row of `queries.brokers.RELAYED_COLUMNS`."""
        job_id, task, args, queue, priority, attempts, max_attempts, created_at = row
        created = created_at.isoformat() if isinstance(created_at, dt.datetime) else None
        return cls(job_id, task, args, queue, priority, attempts, max_attempts, created)

    @property
    def message_id(self) -> str:
        return str(self.id)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "id": self.id,
                "task": self.task,
                "args": self.args,
                "queue": self.queue,
                "priority": self.priority,
                "attempts": self.attempts,
                "max_attempts": self.max_attempts,
                "created_at": self.created_at,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, body: bytes) -> JobMessage:
        """Parse a message body; raises ValueError naming what is wrong with it."""
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(
                f"not a sqla-queue job message: the body is not JSON ({exc})"
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f'not a sqla-queue job message: no "format": "{FORMAT}"')
        try:
            return cls(
                id=int(data["id"]),
                task=str(data["task"]),
                args=dict(data["args"]),
                queue=str(data["queue"]),
                priority=int(data.get("priority") or 0),
                attempts=int(data.get("attempts") or 0),
                max_attempts=data.get("max_attempts"),
                created_at=data.get("created_at"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a sqla-queue job message: bad field {exc}") from None
