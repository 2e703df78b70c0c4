"""The model's race rule (tests/system/test_model.py's `QueueMachine` takes it in): one
transaction is held at a chosen point, after its statements and before its commit
(tests/helpers/races.py), while another command runs beside it on a thread of its own; then
the held one commits or rolls back, and the other must return within the race's deadline (a
wedge fails the test, naming what each session waits on, instead of hanging it).

The two commands are drawn from: a worker's claim (as a killed worker's: its jobs stay
running until reaped), a `replace`/`replace_args` enqueue (debounce), a cancel, a retry, a
worker's finish of a running job (done or failed for good), an enqueue with `depends_on`,
and (beside only) a delete. Each works on the same jobs (the same picks), so they meet.
The model then takes what each committed command did, and every invariant runs: the safety
ones (no two of a sequence running, partition limits, workflows) and the progress ones.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from helpers.races import DEADLINE, Race
from sqlalchemy import Connection, Engine

from sqla_queue import Dependency, Registry, SqlaQueueError, Unique, admin, enqueue
from sqla_queue.db import queries
from sqla_queue.db.models import DEFAULT_MAX_ATTEMPTS
from system.model_kit import Row, kill_claim

HELD = ("claim", "replace", "cancel", "retry", "finish", "dependent")
"""What the held transaction does before it waits."""
BESIDE = (*HELD, "delete")
"""What runs beside it."""


@dataclasses.dataclass
class Done:
    """What one command of a race did, for the model to take once it committed."""

    kind: str
    job_id: int | None = None
    model: Any = None
    parents: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    claimed: list[Any] = dataclasses.field(default_factory=list)
    retried: set[int] = dataclasses.field(default_factory=set)
    attempts: int | None = None
    deleted: set[int] = dataclasses.field(default_factory=set)
    finished: set[int] = dataclasses.field(default_factory=set)
    refused: str | None = None
    began: float = 0.0
    """When (time.monotonic) its transaction began: the database's now() for its claim's
    lease and its worker's registration."""


@dataclasses.dataclass(frozen=True)
class Draw:
    """What Hypothesis drew for one race: the jobs both commands work on, and their shape."""

    spec: dict[str, Any]
    indices: list[int]
    kinds: list[str]
    limit: int
    mode: str
    outcome: str
    attempts: int | None


class RaceRules:
    """The race rule of `QueueMachine` (it uses the machine's model and helpers)."""

    engine: Engine
    races: Race
    registry: Registry
    seen: dict[int, Row]
    jobs: dict[int, Any]
    parents: dict[int, list[tuple[int, str]]]
    orphans: dict[int, Any]
    steps: int
    excused: frozenset[str]
    task_max_attempts: dict[str, int]
    race_deadline: float = DEADLINE
    tally: Counter[str]
    _observe: Callable[[], dict[int, Row]]
    _settle: Callable[..., None]
    _new: Callable[..., tuple[dict[str, Any], Any]]
    _holder: Callable[..., int | None]
    _ids: Callable[[list[int]], list[int]]
    _take_orphans: Callable[..., None]

    def _command(self, kind: str, draw: Draw) -> Callable[[Connection], Done]:
        """The command `kind` of a race, to run on a connection inside a transaction."""
        if kind == "claim":
            self.steps += 1
            worker_id = f"model-race-{self.steps}"
            return lambda conn: Done(
                kind, claimed=kill_claim(conn, worker_id, draw.limit, False, self.task_max_attempts)
            )
        if kind == "replace":
            row, model = self._new({**draw.spec, "letter": draw.spec["letter"] or "a"})
            row["unique"] = Unique(args=[], key=model.letter, on_conflict=draw.mode)
            task, args = row.pop("task"), row.pop("args")

            def replace(conn: Connection) -> Done:
                job_id = enqueue(conn, task, args, registry=self.registry, **row)
                return Done(kind, job_id=job_id, model=model)

            return replace
        if kind == "dependent":
            live = sorted(self.seen)
            parents = sorted({live[i % len(live)] for i in draw.indices}) if live else []
            pairs = list(zip(parents, draw.kinds, strict=False))
            row, model = self._new({**draw.spec, "letter": None})
            task, args = row.pop("task"), row.pop("args")
            depends = [Dependency(p, on_failure=k) for p, k in pairs]

            def dependent(conn: Connection) -> Done:
                try:
                    with conn.begin_nested():
                        job_id = enqueue(
                            conn, task, args, registry=self.registry, depends_on=depends, **row
                        )
                except SqlaQueueError as exc:  # a parent deleted beside it: a clear refusal
                    return Done(kind, parents=pairs, refused=str(exc))
                return Done(kind, job_id=job_id, model=model, parents=pairs)

            return dependent
        ids = self._ids(draw.indices)
        if kind == "cancel":
            return lambda conn: (admin.cancel_jobs(conn, ids), Done(kind))[1]
        if kind == "delete":
            return lambda conn: Done(kind, deleted=set(admin.delete_jobs(conn, ids)))
        if kind == "retry":

            def retry(conn: Connection) -> Done:
                result = admin.retry_jobs(conn, ids, attempts=draw.attempts)
                retried = set(result if isinstance(result, Mapping) else result.retried)
                return Done(kind, retried=retried, attempts=draw.attempts)

            return retry
        assert kind == "finish"
        running = [i for i in ids if i in self.orphans] or sorted(self.orphans)[:1]
        attempts = [self.orphans[i].attempt for i in running]
        return lambda conn: Done(kind, finished=self._finish(conn, running, attempts, draw))

    def _finish(
        self, conn: Connection, ids: list[int], attempts: list[int], draw: Draw
    ) -> set[int]:
        """A worker's finish of jobs it runs: done (by retention) or failed for good."""
        if not ids:
            return set()
        batch = {"job_ids": ids, "job_attempts": attempts}
        if draw.outcome == "done":
            conn.execute(queries.complete_jobs(), {**batch, "job_results": [None] * len(ids)})
        else:
            errors = ["failed beside a race"] * len(ids)
            conn.execute(queries.fail_jobs(), {**batch, "job_errors": errors})
        return set(ids)

    def _race(self, held: str, beside: str, draw: Draw, commit: bool) -> None:
        """Hold `held` after its statements, run `beside` beside it, then commit (or roll
        back) the held one: the other must return within the deadline; then the model takes
        what both committed and the invariants run."""
        before = self.seen
        began = time.monotonic()
        holding = self.races.hold(self._command(held, draw))
        holding.value.began = began
        command = self._command(beside, draw)

        def other() -> Done:
            began = time.monotonic()
            with self.engine.begin() as conn:
                done = command(conn)
            done.began = began
            return done

        running = self.races.beside(other, f"{beside} beside a held {held}")
        blocked = self.races.wait_blocked_by(holding, running, self.race_deadline)
        self.tally[f"races, {beside} {'blocked by' if blocked else 'not blocked by'} {held}"] += 1
        (holding.commit if commit else holding.rollback)()
        other_done = running.result(self.race_deadline)
        self._take([holding.value, other_done] if commit else [other_done], before)

    def _take(self, done: list[Done], before: Mapping[int, Row]) -> None:
        """Take what the committed commands did into the model, then check the jobs."""
        after = self._observe()
        gone: dict[int, str] = {}
        for d in done:
            if d.refused is not None:
                missing = [p for p, _ in d.parents if p not in after]
                assert missing, f"an enqueue with depends_on {d.parents} was refused: {d.refused}"
            if d.kind in ("replace", "dependent") and d.job_id is not None:
                if d.job_id in self.jobs:  # the holder took the new args
                    held = self.jobs[d.job_id]
                    held.behaviour, held.n = d.model.behaviour, d.model.n
                else:
                    d.model.id = d.job_id
                    self.jobs[d.job_id] = d.model
                    if d.kind == "dependent":
                        self.parents[d.job_id] = d.parents
            for job_id in d.retried:
                job = self.jobs[job_id]
                job.spent = 0
                job.budget = d.attempts or before[job_id].max_attempts or DEFAULT_MAX_ATTEMPTS
            gone.update(dict.fromkeys(d.deleted, "deleted"))
            gone.update(dict.fromkeys(d.finished, "finished (retention delete)"))
            if d.claimed:
                self._take_orphans(d.claimed, d.began)
        self._settle(after, "a race", gone.get)
