"""A job about to be written, as an insert hook sees it (`NewJob`), and the hook's type.

Every enqueue path builds one per job and passes it through the registry's insert hooks
(`sqla_queue.enqueue.hooks.prepare_job`) before it becomes a row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqla_queue.job.unique import Unique


@dataclass
class NewJob:
    """A job about to be written, as an insert hook sees and may change it: its task, its
    args and each of `JobOptions`' fields, with the defaults applied.

    `run_at` is an aware datetime, or None for now plus `delay`; set one of them. `tags`
    and `meta` may be changed in place (a tracing hook adds its context to `meta`).
    """

    task: str
    args: dict[str, Any]
    queue: str
    priority: int
    max_attempts: int | None
    run_at: dt.datetime | None = None
    delay: dt.timedelta | float | None = None
    tags: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    unique: Unique | None = None
    """How the job is unique (None: it is not); a hook may set or clear it."""
    depends_on: Sequence[Any] | None = None
    """The jobs (or ids, or `sqla_queue.Dependency`) it waits for (None: none)."""
    on_failure: str | None = None
    """"cancel" (None) or "run": what a dependency that ends failed or cancelled does to it."""
    workflow_id: str | None = None
    """The workflow it belongs to (None: its first dependency's, or none)."""
    about: str | None = None
    """The row it is about, as `<table>:<key>` text (None: none); see `sqla_queue.orm`."""
    partition: str | None = None
    """The partition (tenant) it is for (None: none); see docs/fairness.md."""
    sequence: str | None = None
    """The sequence it runs in, one job at a time in enqueue order (None: none)."""
    expires_at: dt.datetime | None = None
    """Its start deadline (None: none): not started by then, it is cancelled, never run."""


InsertHook = Callable[[NewJob], None]
"""`def hook(job: NewJob) -> None`: change `job` in place, or raise `ValueError` to refuse it."""
