"""ORM rows as arguments (issue 37) in the models.

The main model (tests/system/test_model.py, `QueueMachine`) enqueues jobs taking a row
(`enqueue_row`: the typed call or a typed row of `enqueue_many`, a row of the table or one
created in the same transaction, committed or rolled back with the job) beside every other
rule, changes, deletes and re-creates the rows (`change_row`), and checks after each worker
step what each row handler got (`_check_rows`: its own row as it was at the load, or None
only under missing='none'; a job whose row was gone or changed ended cancelled naming it,
never run) and after each step that the rows are as the model says and every job is about
its own row (`rows_hold`). Its two row tasks take the policies `missing='cancel',
changed='run'` and `missing='none', changed='skip'`. A random run reaches its row rules
rarely, so the scenarios below drive them, every invariant checked after each step.

The second model below stays: Hypothesis picks a history of typed calls (a row and a
`datetime`, under each of the six `missing` x `changed` policies, `changed='latest'`
among them, which the main model cannot predict beside its cancels, deletes and retries)
mixed with the rows' changes, deletes and re-creations; the jobs then run, and each one's
outcome must be the one its policy predicts (ran, with which version; cancelled, with
which reason), each job about its own row only, its typed value rebuilt. Every example
starts from the same two orders on the test's own database."""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from typing import Any

from helpers.row_models import Order, RowBase
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, select, text
from sqlalchemy.orm import Session

from sqla_queue import Job, Registry
from sqla_queue.testing import drain
from system.model_kit import ROW_TABLE, replay
from system.test_model import QueueMachine

POLICIES = list(itertools.product(("cancel", "none"), ("run", "skip", "latest")))
WHEN = dt.datetime(2026, 5, 1, 9, 30, tzinfo=dt.timezone.utc)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.sampled_from([1, 2]), st.integers(0, len(POLICIES) - 1)),
        st.tuples(st.sampled_from(["change", "delete", "recreate"]), st.sampled_from([1, 2])),
    ),
    max_size=10,
)


@dataclass
class Enqueued:
    job_id: int
    policy: int
    order_id: int
    version: int


def row_policy_registry(ran: dict[int, tuple[int | None, type]]) -> Registry:
    """One task per policy; each records, by job id, the version it got (None: no row)."""
    registry = Registry()
    for index, (missing, changed) in enumerate(POLICIES):

        def handler(ctx: Any, order: Order | None, when: dt.datetime) -> None:
            ran[ctx.job_id] = (None if order is None else order.version, type(when))

        handler.__annotations__ = {"order": Order | None, "when": dt.datetime}
        registry.task(name=f"rows_{index}", pass_context=True, missing=missing, changed=changed)(
            handler
        )
    return registry


def reset(engine: Engine) -> None:
    RowBase.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.execute(text("DELETE FROM sqla_queue.jobs"))
        session.execute(delete(Order))
        session.add_all([Order(id=1), Order(id=2)])


def predict(job: Enqueued, versions: dict[int, int | None], later: int | None) -> tuple[str, Any]:
    """(outcome, detail): ("ran", version given) or ("cancelled", reason); `later`: the
    newest job of the same task about the same row enqueued after this one, if any."""
    missing, changed = POLICIES[job.policy]
    now = versions[job.order_id]
    shown = f"row_orders {job.order_id}"
    if now is None:
        return ("ran", None) if missing == "none" else ("cancelled", f"{shown} is gone")
    if now == job.version or changed == "run":
        return "ran", now
    reason = f"{shown} changed since enqueue (version {job.version}, now {now})"
    if changed == "skip":
        return "cancelled", reason
    if later is None:
        return "ran", now
    return "cancelled", f"{reason}; job {later}, enqueued later, runs with it"


@given(history=ops)
def test_each_job_taking_a_row_ends_as_its_policy_says(
    engine: Engine, history: list[tuple[Any, ...]]
) -> None:
    reset(engine)
    ran: dict[int, tuple[int | None, type]] = {}
    registry = row_policy_registry(ran)
    versions: dict[int, int | None] = {1: 1, 2: 1}
    jobs: list[Enqueued] = []
    for op in history:
        kind, order_id = op[0], op[1]
        with Session(engine) as session, session.begin():
            order = session.get(Order, order_id)
            if kind == "enqueue" and order is not None:
                job = registry[f"rows_{op[2]}"].defer(session, order, WHEN)
                session.flush()
                assert job.about == f"row_orders:{order_id}"
                jobs.append(Enqueued(job.id, op[2], order_id, order.version))
            elif kind == "change" and order is not None:
                order.status = f"v{order.version + 1}"
                session.flush()
                versions[order_id] = order.version
            elif kind == "delete" and order is not None:
                session.delete(order)
                versions[order_id] = None
            elif kind == "recreate" and order is None:
                session.add(Order(id=order_id))
                versions[order_id] = 1
    drain(engine, registry)
    with Session(engine) as session:
        rows = {job.id: job for job in session.scalars(select(Job))}
    for job in jobs:
        later = max(
            (
                o.job_id
                for o in jobs
                if o.job_id > job.job_id and o.policy == job.policy and o.order_id == job.order_id
            ),
            default=None,
        )
        outcome, detail = predict(job, versions, later)
        if outcome == "ran":
            assert ran.get(job.job_id) == (detail, dt.datetime), (job, rows.get(job.job_id))
            assert job.job_id not in rows  # succeeded: deleted by the queue's retention
        else:
            assert job.job_id not in ran, job
            row = rows[job.job_id]
            assert (row.status, row.last_error) == ("cancelled", detail), job


# -- the main model's row rules, driven -----------------------------------------------------

WORK = {"concurrency": 1, "batch": 5, "served": None}


def row_job(task: str, pick: int | None, b: str = "ok", commit: bool = True) -> Any:
    """`QueueMachine.enqueue_row`'s arguments: row `pick` (an index into the rows; None: a
    row created in the same transaction) in queue "keep", whose jobs stay done."""
    return (
        "enqueue_row",
        {
            "task": task,
            "behaviour": b,
            "pick": pick,
            "queue": "keep",
            "via": "typed",
            "commit": commit,
        },
    )


def ended(machine: QueueMachine) -> list[tuple[str, str | None]]:
    return [(machine.seen[i].status, machine.seen[i].last_error) for i in sorted(machine.jobs)]


def seen_rows(machine: QueueMachine) -> list[tuple[int, int] | None]:
    return [got for _, got in sorted(machine.recorder.row_seen.items())]


def test_a_row_created_in_the_enqueue_transaction_is_the_one_loaded(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        row_job("row", None, commit=False),  # row 3 and its job rolled back together
        row_job("row", None),
        ("enqueue_row", {**row_job("row", None)[1], "via": "many"}),
        ("work", WORK),
    )
    assert ended(machine) == [("done", None), ("done", None)]
    assert seen_rows(machine) == [(4, 1), (5, 1)]
    assert machine.row_versions == {1: 1, 2: 1, 4: 1, 5: 1}


def test_a_row_deleted_before_the_claim_cancels_or_runs_with_none(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        row_job("row", 0),
        row_job("row_skip", 0),
        ("change_row", {"pick": 0, "change": "delete"}),
        ("work", WORK),
    )
    assert ended(machine) == [("cancelled", f"{ROW_TABLE} 1 is gone"), ("done", None)]
    assert seen_rows(machine) == [None]  # missing='none': the handler got None
    replay(  # created again: a retry loads it
        machine,
        ("change_row", {"pick": 0, "change": "recreate"}),
        ("retry", {"indices": [0], "queue": None, "attempts": None}),
        ("work", WORK),
    )
    assert ended(machine)[0][0] == "done"  # its last_error keeps the earlier attempt's
    assert seen_rows(machine) == [(1, 1), None]  # by job: job 1 on its retry, then job 2


def test_a_row_updated_between_enqueue_and_claim_runs_as_it_is_or_is_skipped(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        row_job("row", 1),
        row_job("row_skip", 1),
        ("change_row", {"pick": 1, "change": "change"}),
        ("work", WORK),
    )
    assert ended(machine) == [
        ("done", None),
        ("cancelled", f"{ROW_TABLE} 2 changed since enqueue (version 1, now 2)"),
    ]
    assert seen_rows(machine) == [(2, 2)]


def test_a_touch_commits_the_row_with_the_jobs_end(machine: QueueMachine) -> None:
    replay(
        machine,
        row_job("row", 0, "touch"),
        row_job("row", 0, "touch"),  # loads the row as the first touch left it
        row_job("row_skip", 0),  # enqueued at version 1: skipped, the touches changed it
        row_job("row", 0, "fail"),  # retried a minute later: the row as it is then
        ("work", WORK),
        ("time_passes", {"seconds": 4000.0}),
        ("work", WORK),
    )
    assert ended(machine)[:3] == [
        ("done", None),
        ("done", None),
        ("cancelled", f"{ROW_TABLE} 1 changed since enqueue (version 1, now 3)"),
    ]
    assert machine.seen[4].status == "failed"
    assert seen_rows(machine) == [(1, 1), (1, 2), (1, 3), (1, 3)]
    assert machine.row_versions[1] == 3


def test_touches_of_one_row_at_once_each_count_once_with_their_job(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        *[row_job("row", 0, "touch") for _ in range(3)],
        ("work", {**WORK, "concurrency": 3}),  # a touch of a stale row fails its attempt
        ("time_passes", {"seconds": 4000.0}),
        ("work", {**WORK, "concurrency": 3}),
        ("time_passes", {"seconds": 4000.0}),
        ("work", {**WORK, "concurrency": 3}),
    )
    done = [status for status, _ in ended(machine)].count("done")
    assert done >= 1
    assert machine.row_versions[1] == 1 + done  # rows_hold compared it with the table
