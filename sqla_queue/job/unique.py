"""Unique jobs: at most one job per key among jobs in chosen states, held by the database.

    enqueue(session, "app.send_receipt", {"order_id": 7}, unique=True)
    enqueue(session, "app.sync", {"account": 3, "page": 1}, unique=Unique(args=["account"]))

A job's key is a SHA-256 hash of its task, its queue (unless `by_queue=False`), the chosen
args (all by default, or the named ones), a caller's own `key` text if given, and the
current time slot when a `period` is set. A unique partial index over (key) admits one row
per key among the rows whose status is one of the job's own `states`; every enqueue path
writes with `INSERT ... ON CONFLICT DO NOTHING`, so a duplicate is skipped inside the
statement: no advisory lock, no read-then-write, no error in the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqla_queue.errors import ConfigurationError
from sqla_queue.job.states import UNIQUE_BITS, JobStatus

STATE_BITS = UNIQUE_BITS
"""Each status's bit in a job's `unique_states`: `sqla_queue.job.states.UNIQUE_BITS`."""
DEFAULT_STATES = frozenset({JobStatus.queued.value, JobStatus.running.value})
"""The states every unique job blocks in (the worker moves jobs between them)."""
EVERY_STATE = frozenset(STATE_BITS)
ON_CONFLICT = ("keep", "replace", "replace_args")
"""What a duplicate does to the job holding its key: nothing (`keep`), or give it its args
and run_at (`replace`: debounce) or its args only (`replace_args`: throttle)."""
"""`states=EVERY_STATE`: once ever, while the row is kept (see the retention note)."""


@dataclass(frozen=True)
class Unique:
    """How a job's uniqueness key is made, and among which states it holds.

    `args`: None for all the job's args, or the names of the ones that count (a name the
    args lack counts as null). `by_queue`: whether the same job in another queue is another
    job. `key`: your own text, added to the key. `period`: seconds (or a timedelta): at most
    one job per key per period, by UTC time slots of that length from the epoch. `states`:
    the statuses in which a job blocks its duplicates: queued and running (the default)
    and any of done, failed, cancelled. `on_conflict`: what a duplicate does to the job
    holding its key, if that job has not started (queued, or waiting on dependencies):
    `keep` leaves it as it is; `replace` gives it the duplicate's args and run_at, so it
    runs `delay` after the last call (debounce); `replace_args` gives it the args and keeps
    its run_at (throttle: at most one run per window, with the latest args). A holder that
    already runs is never touched, except that it lets its key go so the duplicate is
    written as a new job, to run after it; a finished holder (finished `states`) is kept.
    A done job stays in the jobs table only under retention `keep` (which leaves there a
    job whose `states` include done; its other jobs move to the history, as an `archive`
    queue's): "once ever" (adding done, failed and cancelled) holds as long as the row does.
    """

    args: Sequence[str] | None = None
    by_queue: bool = True
    key: str | None = None
    period: float | dt.timedelta | None = None
    states: Collection[str] = field(default=DEFAULT_STATES)
    on_conflict: str = "keep"
    about: bool = False

    def __post_init__(self) -> None:
        if self.on_conflict not in ON_CONFLICT:
            raise ConfigurationError(
                detail=f"Unique(on_conflict=...) is one of {', '.join(ON_CONFLICT)}, got "
                f"{self.on_conflict!r}: 'replace' to debounce (the last call's args and "
                "run_at win), 'replace_args' to throttle (its args, the first run_at)"
            )
        if self.args is not None and (
            isinstance(self.args, str) or not all(isinstance(a, str) for a in self.args)
        ):
            raise ConfigurationError(
                detail=f"Unique(args=...) takes a list of arg names, got {self.args!r}"
            )
        states = frozenset(self.states)
        bad = sorted(states - EVERY_STATE)
        if bad or not states or isinstance(self.states, str):
            raise ConfigurationError(
                detail=f"Unique(states=...) takes statuses among {sorted(EVERY_STATE)}, "
                f"got {self.states!r}"
            )
        if not states >= DEFAULT_STATES:
            # The worker moves jobs between queued and running (claim, retry, release,
            # reap): a key that blocked in one and not the other could refuse that move.
            raise ConfigurationError(
                detail=f"Unique(states=...) must include 'queued' and 'running' (a job "
                f"moves between them), got {sorted(states)}; add finished statuses for "
                "'once ever'"
            )
        object.__setattr__(self, "states", states)
        seconds = self.period_seconds
        if seconds is not None and not seconds >= 1:
            raise ConfigurationError(
                detail=f"Unique(period=...) is at least 1 second, got {self.period!r}"
            )
        if self.key is not None and not isinstance(self.key, str):
            raise ConfigurationError(detail=f"Unique(key=...) is a str, got {self.key!r}")

    @property
    def period_seconds(self) -> float | None:
        if self.period is None:
            return None
        if isinstance(self.period, dt.timedelta):
            return self.period.total_seconds()
        if isinstance(self.period, bool) or not isinstance(self.period, int | float):
            raise ConfigurationError(
                detail=f"Unique(period=...) is seconds or a timedelta, got {self.period!r}"
            )
        return float(self.period)

    @property
    def state_bits(self) -> int:
        """The states as the bitmask stored in `jobs.unique_states`. A job blocking while
        queued blocks while waiting too (a job with dependencies moves from one to the other)."""
        return sum(STATE_BITS[s] for s in frozenset(self.states) | {JobStatus.waiting.value})

    def key_for(
        self,
        task: str,
        queue: str,
        args: Mapping[str, Any],
        now: float | None = None,
        about: str | None = None,
    ) -> bytes:
        """The job's uniqueness key: 32 bytes of SHA-256 over its canonical JSON parts
        (with `about=True`, the row the job is about: `about`, its `<table>:<key>` text)."""
        if self.args is not None:
            chosen = {name: args.get(name) for name in self.args}
        else:
            chosen = {} if self.about else dict(args)
        slot = None
        seconds = self.period_seconds
        if seconds is not None:
            slot = int((time.time() if now is None else now) // seconds)
        parts = {
            "task": task,
            "queue": queue if self.by_queue else None,
            "args": chosen,
            "key": self.key,
            "slot": slot,
        }
        if self.about:
            if about is None:
                raise ConfigurationError(
                    detail=f"Unique(about=True) makes a job of task {task!r} unique per row it "
                    "is about, but it was enqueued without about=: pass the row (about=order)"
                )
            parts["about"] = about
        canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).digest()


UniqueOption = bool | Unique | None
"""What `unique=` takes: True (the defaults), a `Unique`, False (not unique), or None (the
task's own default)."""


def resolve_unique(value: object, task_default: Unique | None = None) -> Unique | None:
    """`unique=` as given (None: the task's default) as a `Unique`, or None for not unique."""
    if value is None:
        return task_default
    if value is True:
        return Unique()
    if value is False:
        return None
    if isinstance(value, Unique):
        return value
    raise ConfigurationError(
        detail=f"unique= takes True, False or a sqla_queue.Unique(...), got {value!r}"
    )
