"""Progress checks of the model-based test (tests/system/test_model.py): beside its safety
invariants, something must keep moving.

- `unblocked`: the due, queued jobs of a queue that no rule of the model blocks (its queue
  paused or rate-limited, an earlier job or a running one of its sequence, its partition at
  its queue's limit, its queue at its max-running); a job cancelled while its handler runs
  (`Row.held`) counts as running here, so the model asks no more than the queue promises;
- `stalled_claims`: on a scratch transaction that is rolled back, an idle worker serving
  one queue claims one job at a time (up to `CLAIMS_PER_QUEUE`), as long as the model says
  a job of that queue is claimable; a claim that returns nothing while one is, is a stall;
- `leftover_transactions`: sessions holding a transaction (and so row locks) after the call
  that opened it returned.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import Any

from helpers.races import open_transactions
from sqlalchemy import Engine

from sqla_queue.db import queries
from system.model_kit import Row, sequence_holders

SCRATCH_WORKER = "model-liveness"
CLAIMS_PER_QUEUE = 3
"""Scratch claims per queue and step: each must return a job while the model says one is
claimable (a stall shows at the first empty claim; the steps that follow move the state on,
so a deeper stall shows in a later step), bounded so a step costs milliseconds."""
SCRATCH_LOCK_TIMEOUT = "5s"
"""A scratch claim that waits on a lock longer than this is a wedge, not a wait."""


@dataclasses.dataclass(frozen=True)
class Rules:
    """What the model knows blocks a claim, as the step ends."""

    paused: frozenset[str]
    rated: frozenset[str]
    concurrency: Mapping[str, int | None]
    partition_limit: Mapping[str, int | None]
    skipping: frozenset[str]


def _busy(row: Row) -> bool:
    """Running, or cancelled while its handler runs (it may still hold what it held)."""
    return not row.archived and (row.status == "running" or row.held)


def blocked_by(row: Row, state: Mapping[int, Row], rules: Rules) -> str | None:
    """Why the model says the claim may leave `row` (None: nothing may)."""
    if row.queue in rules.paused:
        return "its queue is paused"
    if row.queue in rules.rated:
        return "its queue has a rate limit"
    if row.sequence is not None:
        if sequence_holders(row, state, set(rules.skipping)):
            return "its sequence is held"
        if any(o.sequence == row.sequence and o.id != row.id and _busy(o) for o in state.values()):
            return "a job of its sequence is still running"
    mates = [o for o in state.values() if o.queue == row.queue and _busy(o)]
    cap = rules.partition_limit.get(row.queue)
    if cap is not None and sum(1 for o in mates if o.partition == row.partition) >= cap:
        return "its partition is at its limit"
    most = rules.concurrency.get(row.queue)
    if most is not None and len(mates) >= most:
        return "its queue is at its max-running"
    return None


def unblocked(queue: str, state: Mapping[int, Row], rules: Rules) -> list[int]:
    """The due, queued jobs of `queue` that the model says a claim may not leave."""
    return sorted(
        r.id
        for r in state.values()
        if r.queue == queue
        and r.status == "queued"
        and r.due
        and not r.archived
        and blocked_by(r, state, rules) is None
    )


def stalled_claims(
    engine: Engine,
    seen: Mapping[int, Row],
    rules: Rules,
    queues: list[str],
    task_max_attempts: dict[str, int],
    tally: Counter[str] | None = None,
) -> list[Stall]:
    """Claim one job at a time for each queue, on one scratch transaction rolled back at the
    end, while the model says a job of the queue is claimable; name every claim that
    returned nothing though one was."""
    stalls: list[Stall] = []
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{SCRATCH_LOCK_TIMEOUT}'")
            state = dict(seen)
            for queue in queues:
                statement = queries.claim_jobs([queue])
                for _ in range(CLAIMS_PER_QUEUE):
                    waiting = unblocked(queue, state, rules)
                    if not waiting:
                        break
                    claimed = (
                        conn.execute(
                            statement,
                            {
                                "worker_id": SCRATCH_WORKER,
                                "limit": 1,
                                "lease": 30.0,
                                "task_leases": {},
                                "task_max_attempts": task_max_attempts,
                                "queues": [queue],
                            },
                        )
                        .mappings()
                        .all()
                    )
                    if tally is not None:
                        tally["scratch claims"] += 1
                    if not claimed:
                        stalls.append(Stall(queue, waiting, dict(state), rules))
                        break
                    for got in claimed:
                        state[got["id"]] = _taken(state[got["id"]], got)
        finally:
            trans.rollback()
    return stalls


def _taken(row: Row, got: Mapping[str, Any]) -> Row:
    return dataclasses.replace(row, status=str(got["status"]), due=False)


@dataclasses.dataclass(frozen=True)
class Stall:
    """A claim by an idle worker serving `queue` that returned nothing while the model said
    jobs `waiting` were claimable; `state` is the model's view as it claimed."""

    queue: str
    waiting: list[int]
    state: Mapping[int, Row]
    rules: Rules

    def __str__(self) -> str:
        others = sorted(
            (r.id, r.partition, r.sequence, r.status, blocked_by(r, self.state, self.rules))
            for r in self.state.values()
            if r.queue == self.queue and r.status in ("queued", "running") and not r.archived
        )
        return (
            f"queue {self.queue!r}: due jobs {self.waiting} are blocked by no rule (sequence, "
            f"partition limit, pause, dependency, max-running, rate), yet an idle worker "
            f"serving {self.queue!r} claimed nothing; the queue's jobs (id, partition, "
            f"sequence, status, blocked by): {others}"
        )

    def held_partitions(self) -> set[str | None]:
        """The partitions of the queue whose due jobs are all held by their sequences."""
        due = [
            r
            for r in self.state.values()
            if r.queue == self.queue and r.status == "queued" and r.due and not r.archived
        ]
        held = {r.partition for r in due if blocked_by(r, self.state, self.rules)}
        return held - {r.partition for r in due if r.id in self.waiting}


def leftover_transactions(engine: Engine) -> list[str]:
    """Sessions of the test database still in a transaction that wrote or locked rows."""
    return open_transactions(engine)
