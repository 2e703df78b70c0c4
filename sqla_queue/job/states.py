"""A job's states in one table: what each one means to uniqueness, pruning, retry and the reaper.

Everything that asks "is this state finished?", "does it block a unique key?", "may retry
put it back?" reads `STATES` or a predicate built from it here; nothing depends on the
order of `JobStatus`. Adding a state is one edit here (a member and its row) plus a
migration for the CHECK constraint and the partial indexes whose predicates change.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, literal_column
from sqlalchemy.sql.elements import ColumnElement


class JobStatus(str, enum.Enum):
    """Where a job is in its life."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"
    waiting = "waiting"
    """Enqueued with `depends_on`: not claimable until every job it depends on has ended
    (see `sqla_queue.enqueue.workflows`); then `queued`, in the transaction that ended the last.
    Or parked by `ctx.wait_for_signal` (its `signal_key` set, its `run_at` the deadline):
    `queued` again in the transaction that sends the signal, or by a worker's keeper once
    the deadline has passed (see `sqla_queue.enqueue.signals`)."""

    @property
    def state(self) -> State:
        """This status's row of `STATES`."""
        return STATES[self]

    @property
    def finished(self) -> bool:
        """Whether a job in this status has ended (done, failed, cancelled)."""
        return STATES[self].finished


@dataclass(frozen=True)
class State:
    """What one status means to the rest of the queue."""

    unique_bit: int
    """Its bit in `jobs.unique_states`: stored in rows and in the index predicate, so a
    state's bit never changes once released, and a new state takes an unused bit."""
    finished: bool
    """Its job has ended: `finished_at` is set, `prune` may delete it, `ix_jobs_finished`
    holds it, and deleting its queue without `--force` deletes it too."""
    retry: bool
    """`retry` by queue or task puts it back to queued."""
    retry_by_id: bool
    """`retry` of named ids puts it back to queued (a cancelled job only when asked for)."""
    cancel: bool
    """`cancel` ends it (a running one's handler is told)."""
    delete: bool
    """`jobs delete` removes it (a running one must be cancelled first)."""
    reap: bool
    """The reaper requeues or fails it once its lease expires or its worker is gone."""


# fmt: off
STATES: dict[JobStatus, State] = {
    #                      unique_bit finished retry  retry_by_id cancel delete reap
    JobStatus.queued:    State(1,     False,   False, False,      True,  True,  False),
    JobStatus.running:   State(2,     False,   False, False,      True,  False, True),
    JobStatus.done:      State(4,     True,    False, False,      False, True,  False),
    JobStatus.failed:    State(8,     True,    True,  True,       False, True,  False),
    JobStatus.cancelled: State(16,    True,    False, True,       False, True,  False),
    JobStatus.waiting:   State(32,    False,   False, False,      True,  True,  False),
}
# fmt: on
"""The one table of states. Its `unique_bit`s are what migrations sqlaq_0005 and sqlaq_0009
(waiting) stored."""


def _check_table() -> None:
    """Refuse at import a table that lacks a status or reuses a bit (a new state half-added)."""
    missing = [status.value for status in JobStatus if status not in STATES]
    bits = [state.unique_bit for state in STATES.values()]
    if missing or len(set(bits)) != len(bits) or any(b <= 0 or b & (b - 1) for b in bits):
        raise RuntimeError(
            f"sqla_queue.job.states.STATES must give every JobStatus (missing {missing}) "
            f"its own power-of-two unique_bit (got {bits})"
        )


_check_table()


def statuses(**wanted: bool) -> tuple[str, ...]:
    """The status values whose `State` fields equal `wanted`, in `JobStatus` order:
    `statuses(finished=True)` is ('done', 'failed', 'cancelled')."""
    return tuple(
        status.value
        for status, state in STATES.items()
        if all(getattr(state, name) == value for name, value in wanted.items())
    )


FINISHED = statuses(finished=True)
"""The statuses of a job that has ended: done, failed, cancelled."""
UNFINISHED = statuses(finished=False)
"""The statuses of a job that may still run: queued, running, waiting."""
NOT_STARTED = tuple(s for s in UNFINISHED if s != JobStatus.running.value)
"""The statuses of a job no handler has started: queued, waiting (what a debounced
duplicate replaces, and what deleting the row a job is about cancels)."""
CLAIMED = "claimed"
"""Not a status: the `running` rows whose handler has not started (claimed ahead, waiting in
a worker's buffer for a free handler; `started_at` still NULL). Counts show them apart, so
`running` means handlers at work: a worker at concurrency 1 never shows `running 9`."""
COUNTED = tuple(
    name
    for status in JobStatus
    for name in ((status.value, CLAIMED) if status is JobStatus.running else (status.value,))
)
"""What stats, the queues page and the API count per queue: each status, with `CLAIMED`
apart from (and after) `running`."""

HOLDS_SEQUENCE = (*UNFINISHED, JobStatus.failed.value)
"""The statuses in which a job may hold its sequence: queued, running, waiting, and failed
(in a queue whose `sequence_on_failure` is `hold`; see `sqla_queue.admin.partitions`)."""
UNIQUE_BITS = {status.value: state.unique_bit for status, state in STATES.items()}
"""Each status's bit in a job's `unique_states`."""


def sql_literal(value: str | enum.Enum) -> str:
    """A status (or another enum's value) as SQL text: `'queued'`. Only ever of our own
    enums, never of input; a quote in it is refused all the same."""
    text = str(value.value) if isinstance(value, enum.Enum) else value
    if "'" in text:
        raise ValueError(f"not a status: {text!r}")
    return f"'{text}'"


def in_sql(values: Iterable[str | enum.Enum], column: str = "status") -> str:
    """`status IN ('done', 'failed', 'cancelled')` as SQL text, for partial index predicates
    and CHECK constraints (which a statement must repeat to use the index)."""
    return f"{column} IN ({', '.join(sql_literal(v) for v in values)})"


FINISHED_SQL = in_sql(FINISHED)
"""The predicate of `ix_jobs_finished`."""


def status_in(column: Any, values: Iterable[str]) -> ColumnElement[bool]:
    """`column IN ('a', 'b')` with the statuses as literals, never bound parameters: a
    generic plan of `status = ANY($1)` could not prove a partial index's predicate."""
    condition: ColumnElement[bool] = column.in_(
        [literal_column(sql_literal(v), Text) for v in values]
    )
    return condition


def is_finished(column: Any) -> ColumnElement[bool]:
    """`column` holds a finished status (the predicate of `ix_jobs_finished`)."""
    return status_in(column, FINISHED)


def unique_bit_sql(column: str = "status") -> str:
    """The CASE that maps `column` to its unique bit (0 for a status not in the table)."""
    cases = " ".join(
        f"WHEN {sql_literal(status)} THEN {state.unique_bit}" for status, state in STATES.items()
    )
    return f"CASE {column} {cases} ELSE 0 END"


def unique_predicate(table: str = "") -> str:
    """The rows that block their duplicates, over the columns of `table` (an alias) or
    unqualified: a key, and a status among the row's own `unique_states`. It is the
    predicate of `ux_jobs_unique_key`: a statement must spell it the same to use it."""
    of = f"{table}." if table else ""
    return (
        f"{of}unique_key IS NOT NULL AND ({of}unique_states & {unique_bit_sql(f'{of}status')}) <> 0"
    )


__all__ = [
    "FINISHED",
    "FINISHED_SQL",
    "HOLDS_SEQUENCE",
    "NOT_STARTED",
    "STATES",
    "UNFINISHED",
    "UNIQUE_BITS",
    "JobStatus",
    "State",
    "in_sql",
    "is_finished",
    "sql_literal",
    "status_in",
    "statuses",
    "unique_bit_sql",
    "unique_predicate",
]
