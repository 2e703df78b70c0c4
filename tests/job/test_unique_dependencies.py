"""A unique duplicate that names dependencies (issue 33, defect 6).

A duplicate writes no job: the key's holder stands for it (`keep`) or takes its args
(`replace`). Its `depends_on` used to be dropped silently, so with `replace` the new args ran
at once, before the job they depend on. Chosen: such a duplicate is refused with one line
(`DependencyError`) unless the holder already depends on each job it names (re-enqueueing
the same workflow stays a quiet duplicate); a running holder under `replace` still lets its
key go, and the call is written as a new job that waits for its dependencies.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers.enqueue_paths import EVERY_PATH
from helpers.statements import claim_all, states
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sqla_queue import DependencyError, Job, Unique, enqueue

REPLACE = Unique(args=["account"], on_conflict="replace")
KEEP = Unique(args=["account"])


def syncs(engine: Engine) -> list[tuple[int, str, int]]:
    with Session(engine) as session:
        rows = session.scalars(select(Job).where(Job.task == "t.sync").order_by(Job.id))
        return [(j.id, j.status, j.args["page"]) for j in rows]


def parent_and_holder(engine: Engine, unique: Unique) -> tuple[int, int]:
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t.charge", {}, flush=True)
        holder = enqueue(session, "t.sync", {"account": 3, "page": 1}, unique=unique)
        return parent.id, holder.id


@pytest.mark.parametrize("path", sorted(EVERY_PATH))
@pytest.mark.parametrize("unique", [REPLACE, KEEP], ids=["replace", "keep"])
def test_a_duplicate_naming_dependencies_its_holder_lacks_is_refused_and_nothing_changes(
    engine: Engine, path: str, unique: Unique
) -> None:
    parent, holder = parent_and_holder(engine, unique)
    row: dict[str, Any] = {
        "task": "t.sync",
        "args": {"account": 3, "page": 2},
        "unique": unique,
        "depends_on": [parent],
    }
    with pytest.raises(
        DependencyError,
        match=rf"job {holder} holds its unique key and does "
        rf"not depend on job {parent}: .*Unique\(key=\.\.\.\)",
    ):
        EVERY_PATH[path](engine, row)
    assert syncs(engine) == [(holder, "queued", 1)]  # not given the args it would run early


def test_the_refusal_leaves_the_callers_transaction_usable(engine: Engine) -> None:
    parent, holder = parent_and_holder(engine, REPLACE)
    with Session(engine) as session, session.begin():
        with pytest.raises(DependencyError):
            enqueue(
                session, "t.sync", {"account": 3, "page": 2}, unique=REPLACE, depends_on=[parent]
            )
        other = enqueue(session, "t.sync", {"account": 4, "page": 1}, unique=REPLACE)
        assert other.duplicate is False
        other_id = other.id
    assert [s[:2] for s in syncs(engine)] == [(holder, "queued"), (other_id, "queued")]


@pytest.mark.parametrize("unique", [REPLACE, KEEP], ids=["replace", "keep"])
def test_enqueueing_the_same_workflow_again_is_a_quiet_duplicate(
    engine: Engine, unique: Unique
) -> None:
    def workflow(page: int) -> list[tuple[int, bool]]:
        with Session(engine) as session, session.begin():
            charge = enqueue(session, "t.charge", {"order": 7}, unique=True)
            sync = enqueue(
                session, "t.sync", {"account": 3, "page": page}, unique=unique, depends_on=[charge]
            )
            return [(charge.id, charge.duplicate), (sync.id, sync.duplicate)]

    (charge, sync) = [job_id for job_id, _ in workflow(1)]
    assert workflow(2) == [(charge, True), (sync, True)]
    page = 2 if unique is REPLACE else 1
    assert syncs(engine) == [(sync, "waiting", page)]


def test_a_running_holder_lets_its_key_go_and_the_new_job_waits_for_its_dependency(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        holder = enqueue(session, "t.sync", {"account": 3, "page": 1}, unique=REPLACE).id
    assert list(claim_all(engine)) == [holder]
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t.charge", {}, flush=True)
        new = enqueue(
            session, "t.sync", {"account": 3, "page": 2}, unique=REPLACE, depends_on=[parent]
        )
        assert new.duplicate is False
        ids = (parent.id, new.id)
    assert syncs(engine) == [(holder, "running", 1), (ids[1], "waiting", 2)]
    assert states(engine, ids[1]) == [("waiting", 1)]
