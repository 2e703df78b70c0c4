"""Workflows, at the level of the statements: a job with `depends_on` waits; the statement
that ends its last parent makes it due, in its own transaction; a failure cancels the
dependents transitively (or lets an `on_failure="run"` one run); a retry revives them.
Every enqueue path links; bad dependencies are refused with what to do."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from helpers.plans import explained, rows_scanned
from helpers.statements import claim_all, fail, states, status_of, succeed
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Dependency, DependencyError, Job, admin, enqueue, enqueue_many
from sqla_queue.db import queries
from sqla_queue.enqueue.inserts.links import Link, link_jobs
from sqla_queue.orm import cancel_jobs_about


def retry(engine: Engine, job_id: int) -> None:
    with engine.begin() as conn:
        assert job_id in admin.retry_jobs(conn, job_ids=[job_id])


def test_a_dependent_waits_and_is_due_in_the_transaction_that_ends_its_last_parent(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {})
        c = enqueue(session, "t.c", {}, depends_on=[a, b])
        session.flush()
        ids = (a.id, b.id, c.id)
    assert states(engine, *ids)[2] == ("waiting", 2)
    first = claim_all(engine)
    assert set(first) == {ids[0], ids[1]}  # the waiting job is never claimed
    succeed(engine, {ids[0]: first[ids[0]]})
    assert states(engine, ids[2])[0] == ("waiting", 1)
    succeed(engine, {ids[1]: first[ids[1]]})
    assert states(engine, ids[2])[0] == ("queued", 0)
    assert set(claim_all(engine)) == {ids[2]}


def test_a_failed_parent_cancels_its_dependents_transitively_naming_it(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a])
        c = enqueue(session, "t.c", {}, depends_on=[b])
        cleanup = enqueue(session, "t.cleanup", {}, depends_on=[Dependency(b, on_failure="run")])
        session.flush()
        ids = (a.id, b.id, c.id, cleanup.id)
    fail(engine, claim_all(engine))
    assert [s for s, _ in states(engine, *ids)] == ["failed", "cancelled", "cancelled", "queued"]
    with engine.connect() as conn:
        errors = dict(
            conn.execute(
                text("SELECT id, last_error FROM sqla_queue.jobs WHERE id = ANY(:ids)"),
                {"ids": [ids[1], ids[2]]},
            ).all()
        )
    assert f"job {ids[0]} (t.a), which it depends on, ended failed" in errors[ids[1]]
    assert f"job {ids[1]} (t.b), which it depends on, ended cancelled" in errors[ids[2]]


def test_retrying_a_failed_parent_revives_its_cancelled_dependents(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a])
        c = enqueue(session, "t.c", {}, depends_on=[b])
        session.flush()
        ids = (a.id, b.id, c.id)
    fail(engine, claim_all(engine))
    retry(engine, ids[0])
    assert states(engine, *ids) == [("queued", None), ("waiting", 1), ("waiting", 1)]
    succeed(engine, claim_all(engine))
    succeed(engine, claim_all(engine))
    assert status_of(engine, ids[2]) == "queued"


def test_a_retried_dependent_waits_again_for_a_parent_that_has_not_succeeded(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a])
        session.flush()
        ids = (a.id, b.id)
    fail(engine, claim_all(engine))
    retry(engine, ids[1])
    assert states(engine, ids[1]) == [("waiting", 1)]
    retry(engine, ids[0])
    succeed(engine, claim_all(engine))
    assert states(engine, ids[1]) == [("queued", 0)]


def test_a_dependency_on_a_job_deleted_by_retention_counts_only_if_it_succeeded(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a])
        session.flush()
        ids = (a.id, b.id)
    succeed(engine, claim_all(engine))  # a is deleted (retention delete), its end recorded
    assert status_of(engine, ids[0]) == "gone"
    with Session(engine) as session, session.begin():
        late = enqueue(session, "t.late", {}, depends_on=[ids[0]], flush=True)
        late_id = late.id
    assert status_of(engine, late_id) == "queued"
    with Session(engine) as session, session.begin():
        enqueue(session, "t.x", {})
    x = next(iter(claim_all(engine)))
    succeed(engine, {x: 1})  # no dependents when it ended: nothing recorded
    with (
        pytest.raises(DependencyError, match="no record of how it ended"),
        Session(engine) as session,
        session.begin(),
    ):
        enqueue(session, "t.never", {}, depends_on=[x], flush=True)


def test_a_dependent_of_a_failed_job_enqueued_later_is_cancelled_at_once(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {}, flush=True)
        a_id = a.id
    fail(engine, claim_all(engine))
    with Session(engine) as session, session.begin():
        b = enqueue(session, "t.b", {}, depends_on=[a_id], flush=True)
        c = enqueue(session, "t.c", {}, depends_on=[a_id], on_failure="run", flush=True)
        ids = (b.id, c.id)
    assert [s for s, _ in states(engine, *ids)] == ["cancelled", "queued"]


def test_every_enqueue_path_links(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t.parent", {}, flush=True)
        added = Job(task="t.added", depends_on=[parent])
        session.add(added)
        many = enqueue_many(session, [{"task": "t.many", "depends_on": [parent]}] * 3)
        unique = enqueue(session, "t.unique", {}, unique=True, depends_on=[parent])
        session.flush()
        ids = [added.id, *many, unique.id]
        parent_id = parent.id
    with engine.begin() as conn:
        core_id = enqueue(conn, "t.core", {}, depends_on=[parent_id])
    assert [s for s, _ in states(engine, *ids, core_id)] == ["waiting"] * 6
    succeed(engine, claim_all(engine))
    assert [s for s, _ in states(engine, *ids, core_id)] == ["queued"] * 6


def test_jobs_of_one_flush_may_depend_on_each_other_in_any_add_order(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        parent = Job(task="t.parent")
        child = Job(task="t.child", depends_on=[parent])
        session.add(child)
        session.add(parent)
        session.flush()
        child_id = child.id
    assert states(engine, child_id)[0] == ("waiting", 1)


@pytest.mark.parametrize(
    ("depends_on", "message"),
    [
        ("42", "must be a list of jobs"),
        ([0], "takes jobs, job ids"),
        ([True], "takes jobs, job ids"),
        ([{"id": 1}], "takes jobs, job ids"),
    ],
)
def test_bad_dependencies_are_refused_naming_the_fix(
    engine: Engine, depends_on: Any, message: str
) -> None:
    with Session(engine) as session, pytest.raises(DependencyError, match=message):
        enqueue(session, "t.bad", {}, depends_on=depends_on, flush=True)


def test_an_unknown_on_failure_is_refused() -> None:
    with pytest.raises(DependencyError, match="on_failure must be 'cancel' or 'run'"):
        Dependency(1, on_failure="ignore")


def test_a_cycle_among_new_jobs_is_refused(engine: Engine) -> None:
    later: list[Job] = []
    with Session(engine) as session:
        a = Job(task="t.a", depends_on=later)
        b = Job(task="t.b", depends_on=[a])
        later.append(b)
        session.add_all([a, b])
        with pytest.raises(DependencyError, match="depend on each other"):
            session.flush()
    itself: list[Job] = []
    with Session(engine) as session:
        c = Job(task="t.c", depends_on=itself)
        itself.append(c)
        session.add(c)
        with pytest.raises(DependencyError, match="depends on itself"):
            session.flush()


def test_a_job_with_no_dependencies_costs_no_statement(engine: Engine) -> None:
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM sqla_queue.job_deps")).scalar_one()
    with Session(engine) as session, session.begin():
        enqueue(session, "t.plain", {})
    with engine.connect() as conn:
        after = conn.execute(text("SELECT count(*) FROM sqla_queue.job_deps")).scalar_one()
        flagged = conn.execute(
            text("SELECT count(*) FROM sqla_queue.jobs WHERE has_dependents")
        ).scalar_one()
    assert before == after == 0
    assert flagged == 0


def test_a_run_edge_waits_again_for_a_retried_parent_and_counts_its_end_once(
    engine: Engine,
) -> None:
    """A clean-up that counted its failed parent (or a parent cancelled by it) as ended
    waits for it again once that is retried or revived: the parent's second end counts
    once, and the clean-up still waits for its other parent."""
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a])
        other = enqueue(session, "t.other", {})
        direct = enqueue(session, "t.direct", {}, depends_on=[Dependency(a, "run"), other])
        deep = enqueue(session, "t.deep", {}, depends_on=[Dependency(b, "run"), other])
        session.flush()
        ids = (a.id, b.id, other.id, direct.id, deep.id)
    claimed = claim_all(engine)
    fail(engine, {ids[0]: claimed[ids[0]]})
    assert states(engine, ids[3], ids[4]) == [("waiting", 1), ("waiting", 1)]
    retry(engine, ids[0])  # a runs again, b waits for it again
    assert states(engine, ids[3], ids[4]) == [("waiting", 2), ("waiting", 2)]
    succeed(engine, claim_all(engine))  # a
    succeed(engine, claim_all(engine))  # b
    assert states(engine, ids[3], ids[4]) == [("waiting", 1), ("waiting", 1)]
    succeed(engine, {ids[2]: claimed[ids[2]]})
    assert states(engine, ids[3], ids[4]) == [("queued", 0), ("queued", 0)]


def test_a_clean_up_due_on_its_failed_parent_waits_again_when_that_is_retried(
    engine: Engine,
) -> None:
    """Queued (not started) because its only parent failed through a run edge: retrying
    the parent sends it back to waiting for the parent's new end (found by the model)."""
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        cleanup = enqueue(session, "t.cleanup", {}, depends_on=[Dependency(a, "run")])
        session.flush()
        ids = (a.id, cleanup.id)
    fail(engine, claim_all(engine))
    assert states(engine, ids[1]) == [("queued", 0)]
    retry(engine, ids[0])
    assert states(engine, ids[1]) == [("waiting", 1)]
    assert set(claim_all(engine)) == {ids[0]}
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'done' WHERE id = :id"), {"id": ids[0]}
        )
    assert states(engine, ids[1]) == [("queued", 0)]


def test_a_failure_at_the_head_of_a_long_chain_cancels_it_all_in_one_statement(
    engine: Engine,
) -> None:
    # 3,000 links: one nested trigger per link would exhaust the server's stack depth
    with engine.begin() as conn:
        ids = enqueue_many(conn, [{"task": "t.link"} for _ in range(3_000)])
        link_jobs(
            conn, [Link(child, "t.link", [(parent, "cancel")]) for parent, child in pairwise(ids)]
        )
    fail(engine, claim_all(engine))
    with engine.connect() as conn:
        counts = dict(
            conn.execute(text("SELECT status, count(*) FROM sqla_queue.jobs GROUP BY status")).all()
        )
        last_error = conn.execute(
            text("SELECT last_error FROM sqla_queue.jobs WHERE id = :id"), {"id": ids[-1]}
        ).scalar_one()
    assert counts == {"failed": 1, "cancelled": 2_999}
    assert f"job {ids[-2]} (t.link), which it depends on, ended cancelled" in last_error


def test_a_fan_in_child_is_updated_once_per_finishing_statement(engine: Engine) -> None:
    with engine.begin() as conn:
        parents = enqueue_many(conn, [{"task": "t.parent"} for _ in range(200)])
        (child,) = enqueue_many(conn, [{"task": "t.child", "depends_on": parents}])
    claimed = claim_all(engine)
    ids = list(claimed)
    # PostgreSQL 15's pg_stat_xact_* hold this connection's counts not yet flushed: compare
    updated = text("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'jobs'")
    with engine.begin() as conn:
        before = conn.execute(updated).scalar_one()
        for batch in (ids[:150], ids[150:]):
            conn.execute(
                queries.complete_jobs(),
                {"job_ids": batch, "job_attempts": [claimed[i] for i in batch]},
            )
        after = conn.execute(updated).scalar_one()
    assert after - before == 2  # the child, once per statement, not once per parent
    assert states(engine, child) == [("queued", 0)]


def test_doctor_names_waiting_jobs_held_by_a_failed_dependency_and_orphans(
    engine: Engine,
) -> None:
    from sqla_queue.doctor import DoctorOptions, Severity, diagnose

    def finding() -> Any:
        found = {f.name: f for f in diagnose(engine, DoctorOptions(sample=0))}
        return found["waiting_jobs"]

    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a])
        session.flush()
        ids = (a.id, b.id)
    assert finding().severity is Severity.ok
    assert finding().details == {"waiting": 1, "held": 0, "orphaned": 0}
    fail(engine, claim_all(engine))
    retry(engine, ids[1])  # the dependent alone: it waits for a failed job
    assert finding().severity is Severity.warn
    assert finding().details["held"] == 1
    with engine.begin() as conn:  # by hand: its edge says the parent succeeded
        conn.execute(text("UPDATE sqla_queue.job_deps SET parent_status = 'done'"))
    assert finding().severity is Severity.critical
    assert "can never run" in finding().value


@pytest.mark.slow
def test_a_wide_fan_out_is_promoted_by_its_parent_without_a_runaway_plan(engine: Engine) -> None:
    """Statistics taken while no job waited say ix_jobs_waiting holds one row; a nested loop
    over it and the 10,000 dependents (10^8 rows filtered) took 35 s to finish the parent.
    Not a speed target (those are in benchmarks/workflows.py): the rows the plans of the
    finishing statement and of the triggers it fires scanned, counted by EXPLAIN ANALYZE
    (no clock: a loaded machine changes the time, not the plan)."""
    with engine.begin() as conn:
        enqueue_many(conn, [{"task": "t.later", "delay": 3600} for _ in range(2_000)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE sqla_queue.jobs"))
    with engine.begin() as conn:
        (root,) = enqueue_many(conn, [{"task": "t.root"}])
        kids = enqueue_many(conn, [{"task": "t.kid"} for _ in range(10_000)])
        link_jobs(conn, [Link(kid, "t.kid", [(root, "cancel")]) for kid in kids])
    claimed = claim_all(engine)
    ids = list(claimed)
    params = {
        "job_ids": ids,
        "job_attempts": [claimed[i] for i in ids],
        "job_results": [None] * len(ids),
    }
    with engine.begin() as conn, explained(conn) as plans:
        conn.execute(queries.complete_jobs(), params)
    scanned = [rows_scanned(plan) for plan in plans]
    print(f"\nrows scanned by each plan: {scanned}")
    assert len(plans) > 1, "the triggers' statements were explained too"
    # 10,000 dependents promoted: some tens of thousands of rows; the runaway plan, 10^8
    assert sum(scanned) < 1_000_000, scanned
    with engine.connect() as conn:
        queued = conn.execute(
            text("SELECT count(*) FROM sqla_queue.jobs WHERE status = 'queued'")
        ).scalar_one()
    assert queued == 12_000


def test_a_retried_parent_leaves_a_dependent_cancelled_by_hand_cancelled(engine: Engine) -> None:
    """Only the dependents its own failure cancelled wait again (issue 33, defect 4)."""
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a])
        c = enqueue(session, "t.c", {}, depends_on=[a])
        session.flush()
        ids = (a.id, b.id, c.id)
    claimed = claim_all(engine)
    with engine.begin() as conn:  # the operator cancels b while a runs
        assert admin.cancel_jobs(conn, [ids[1]]) == {ids[1]: "waiting"}
    fail(engine, claimed)
    assert [s for s, _ in states(engine, *ids)] == ["failed", "cancelled", "cancelled"]
    retry(engine, ids[0])
    assert states(engine, *ids) == [("queued", None), ("cancelled", 1), ("waiting", 1)]
    succeed(engine, claim_all(engine))  # (a done job is deleted: its queue keeps none)
    assert [s for s, _ in states(engine, *ids)] == ["gone", "cancelled", "queued"]


def test_a_retried_parent_leaves_a_dependent_whose_row_was_deleted_cancelled(
    engine: Engine,
) -> None:
    """A job cancelled because the row it was about was deleted never runs (defect 4)."""
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {}, depends_on=[a], about="orders:7")
        session.flush()
        ids = (a.id, b.id)
    claimed = claim_all(engine)
    with Session(engine) as session, session.begin():
        assert cancel_jobs_about(session, "orders:7") == [ids[1]]
    fail(engine, claimed)
    retry(engine, ids[0])
    succeed(engine, claim_all(engine))
    assert [s for s, _ in states(engine, *ids)] == ["gone", "cancelled"]


def test_a_dependent_cancelled_by_one_parent_is_revived_by_the_retry_of_the_last_failed_one(
    engine: Engine,
) -> None:
    """Its error names the lower failed parent; retrying that one first, then the other,
    still revives it (the revival matches any parent's cancellation, not only the named)."""
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {})
        b = enqueue(session, "t.b", {})
        c = enqueue(session, "t.c", {}, depends_on=[a, b])
        session.flush()
        ids = (a.id, b.id, c.id)
    fail(engine, claim_all(engine))
    retry(engine, ids[0])
    assert status_of(engine, ids[2]) == "cancelled"
    retry(engine, ids[1])
    assert states(engine, ids[2]) == [("waiting", 2)]


@pytest.mark.slow
def test_cancelling_a_chord_60_000_wide_is_linear_not_quadratic(engine: Engine) -> None:
    """Each ended parent was recorded by copying one growing text (n squared: 80,000 took
    76 s, 60,000 about 43 s); a deadline of 30 s on the one statement fails the old way
    and leaves the linear one (about 1 s) room under any load (defect 12)."""
    width = 60_000
    with engine.begin() as conn:
        parents = enqueue_many(conn, [{"task": "t.part"} for _ in range(width)])
        (callback,) = enqueue_many(conn, [{"task": "t.callback"}])
        link_jobs(conn, [Link(callback, "t.callback", [(p, "cancel") for p in parents])])
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL statement_timeout = '30s'"))
        cancelled = admin.cancel_jobs(conn, parents)
    assert len(cancelled) == width
    with engine.connect() as conn:
        counts = dict(
            conn.execute(text("SELECT status, count(*) FROM sqla_queue.jobs GROUP BY status")).all()
        )
        outcomes = conn.execute(
            text("SELECT count(*) FROM sqla_queue.job_deps WHERE parent_status = 'cancelled'")
        ).scalar_one()
        why = conn.execute(
            text("SELECT last_error FROM sqla_queue.jobs WHERE id = :id"), {"id": callback}
        ).scalar_one()
    assert counts == {"cancelled": width + 1}  # the callback by the trigger
    assert outcomes == width  # every ended parent was recorded on its edge
    assert why.startswith(f"cancelled: job {parents[0]} (t.part), which it depends on, ended")
