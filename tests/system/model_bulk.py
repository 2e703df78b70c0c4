"""The model's bulk rules (tests/system/test_model.py's `QueueMachine` takes them in): retry,
cancel or delete every job a `JobFilter` drawn from the model's queues, tasks and statuses
matches, in batches of 1, 2 or 1000, and check that exactly the matching jobs the action
takes changed, as the model expects, and that the counts it returned say so."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from sqlalchemy import Engine

from sqla_queue.admin import filters as bulk
from sqla_queue.admin.filters import JobFilter
from sqla_queue.db.models import DEFAULT_MAX_ATTEMPTS
from sqla_queue.errors import ConfigurationError
from system.model_kit import TASKS, Row, key_holders, no_raw_database_error

TAKES = {"retry": ("failed", "cancelled"), "cancel": ("queued", "running", "waiting")}
STATUSES = ("queued", "running", "done", "failed", "cancelled", "waiting")


def takes(action: str, row: Row) -> bool:
    """Whether `action` takes this job, whatever the filter (as the single-job commands).
    Of the finished jobs moved out of `jobs`, a delete takes the history's (a `keep` or
    `archive` queue's succeeded jobs, since sqlaq_0030: `admin.filters.bulk_delete`), not
    those of the unpartitioned archive of older releases; retry and cancel take neither."""
    if row.archived:
        return action == "delete" and not row.old_archive
    if row.held:
        return False
    if action == "delete":
        return row.status != "running"
    return row.status in TAKES[action]


class BulkRules:
    """Rules of `QueueMachine` (they use its `seen`, `jobs`, `parents` and `_settle`)."""

    engine: Engine
    seen: dict[int, Row]
    jobs: dict[int, Any]
    parents: dict[int, list[tuple[int, str]]]
    _observe: Callable[[], dict[int, Row]]
    _settle: Callable[..., None]
    _ends: Callable[..., Any]

    @precondition(lambda self: self.jobs)
    @rule(
        action=st.sampled_from(sorted(bulk.ACTIONS)),
        queue=st.none() | st.sampled_from(["default", "keep", "arch", "lim"]),
        task=st.none() | st.sampled_from(sorted(TASKS)),
        status=st.none() | st.sampled_from(STATUSES),
        batch=st.sampled_from([1, 2, 1000]),
        attempts=st.sampled_from([None, 2]),
    )
    def bulk_act(
        self,
        action: str,
        queue: str | None,
        task: str | None,
        status: str | None,
        batch: int,
        attempts: int | None,
    ) -> None:
        where = JobFilter(queue=queue, task=task, status=status)
        before = self.seen

        def matches(row: Row) -> bool:
            return (
                queue in (None, row.queue)
                and task in (None, row.task)
                and status in (None, row.status)
            )

        expected = {r.id for r in before.values() if matches(r) and takes(action, r)}
        if status is not None and status not in bulk.ACTIONS[action]:
            with (
                no_raw_database_error(f"bulk_{action}"),
                pytest.raises(ConfigurationError, match=f"nothing to {action}"),
            ):
                bulk.BULK_ACTIONS[action](self.engine, where, batch=batch)
            return
        extra = {"attempts": attempts} if action == "retry" else {}
        result = self._ends(
            f"bulk_{action}",
            lambda: bulk.BULK_ACTIONS[action](self.engine, where, batch=batch, **extra),
        )
        after = self._observe()
        what = f"bulk_{action}({where.describe()}, batch={batch})"
        changed = self._check_each(action, expected, before, after, attempts, what)
        followers = self._followers(expected)
        if expected & set(self.parents) or followers:
            # a dependent follows its parent's end within the action: a matched one may be
            # cancelled by an earlier batch's delete or cancel of its parent (and then not
            # match any more), and one a parent's end made due may match a later batch
            assert result.acted + result.skipped <= len(expected | followers), what
        else:
            assert result.acted + result.skipped == len(expected), (
                f"{what} counted {result.acted} acted + {result.skipped} skipped; the model "
                f"expects {len(expected)} matching jobs it takes: {sorted(expected)}"
            )
            assert result.batches == -(-len(expected) // batch), f"{what}: {result.batches}"
            assert result.acted == changed, f"{what} said {result.acted} but {changed} changed"
        assert result.held == result.skipped, f"{what} skipped jobs for another reason"
        # exactly the matching jobs changed (a workflow's dependents follow their parents)
        for row in before.values():
            if row.id in expected or row.id in self.parents:
                continue
            now = after.get(row.id)
            ok = now is not None and now.stable() == row.stable()
            assert ok, f"{what} changed job {row.id}, which it does not match: {row} -> {now}"
        # a dependent its parent's end made queued in an earlier batch matches a later one
        deleted = expected | followers if action == "delete" else set()
        self._settle(after, what, lambda i: "deleted" if i in deleted else None)

    def _followers(self, ids: set[int]) -> set[int]:
        """The jobs that depend on any of `ids`, directly or through other dependents."""
        found: set[int] = set()
        frontier = set(ids)
        while frontier:
            frontier = {
                child
                for child, parents in self.parents.items()
                if child not in found and any(p in frontier for p, _ in parents)
            }
            found |= frontier
        return found

    def _check_each(
        self,
        action: str,
        expected: set[int],
        before: Mapping[int, Row],
        after: Mapping[int, Row],
        attempts: int | None,
        what: str,
    ) -> int:
        """Each matching job as the action leaves it; returns how many it changed."""
        if action == "delete":
            kept = {
                i
                for i in expected & set(after)
                if not (i in self.parents and after[i].status == "cancelled")
            }
            assert not kept, f"{what} left jobs {sorted(kept)} it matched"
            return len(expected)
        if action == "cancel":
            for job_id in expected:
                assert after[job_id].status == "cancelled", f"{what}: job {job_id} not cancelled"
            return len(expected)
        retried = 0
        for job_id in expected:
            row = after[job_id]
            if row.status in ("queued", "waiting") and row.stable() != before[job_id].stable():
                retried += 1
                job = self.jobs[job_id]
                job.spent = 0
                job.budget = attempts or before[job_id].max_attempts or DEFAULT_MAX_ATTEMPTS
                continue
            if job_id in self.parents:
                continue  # its parent's retry may have moved it already
            holders = key_holders(row, after)
            assert holders, f"{what} left job {job_id} ({row.status}) alone; no job holds its key"
            assert row.stable() == before[job_id].stable(), f"{what} changed skipped {job_id}"
        return retried
