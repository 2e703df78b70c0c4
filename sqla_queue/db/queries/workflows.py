"""Workflows: linking a job to the jobs it depends on, and reading the graph back.

What happens when a job ends (its dependents promoted, cancelled or revived) is not here:
the triggers of migration sqlaq_0009 do it, in the statement that ends the job, whichever
one that is. This module holds what the enqueue side and the readers send.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Delete,
    Integer,
    Select,
    Table,
    Text,
    Update,
    any_,
    bindparam,
    case,
    delete,
    exists,
    false,
    func,
    literal,
    literal_column,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert

from sqla_queue.db.models import JobDependency
from sqla_queue.db.queries.common import (
    cancelled_held,
    history,
    jobs,
    of_workflow,
    queues,
    unnested,
)
from sqla_queue.job.states import UNFINISHED, JobStatus, sql_literal, status_in, statuses

deps = cast(Table, JobDependency.__table__)


def _ids(name: str) -> Any:
    return bindparam(name, type_=ARRAY(BigInteger))


def _texts(name: str) -> Any:
    return bindparam(name, type_=ARRAY(Text))


def flag_parents() -> Update:
    """Lock the jobs `:parent_ids` (in id order: two linkers never deadlock) and flag them as
    having dependents, so their end fires the workflow triggers; a parent outside any
    workflow joins `:parent_workflows` (its own id as text where that is NULL). Returns
    each one's id, status (`running` for one cancelled while its handler runs), workflow
    and whether its queue is routed to a broker.

    The lock is what makes linking safe against the parent ending meanwhile: a worker's
    finishing statement waits for this transaction, then sees the flag and the edges."""
    given = unnested(
        "given", ("parent_ids", "id", BigInteger), ("parent_workflows", "workflow_id", Text)
    )
    locked = (
        select(jobs.c.id)
        .where(jobs.c.id == any_(_ids("parent_ids")))
        .order_by(jobs.c.id)
        .with_for_update(key_share=True)
    )
    routed = (
        select(queues.c.route.is_not(None)).where(queues.c.name == jobs.c.queue).scalar_subquery()
    )
    return (
        update(jobs)
        .where(jobs.c.id.in_(locked), jobs.c.id == given.c.id)
        .values(
            has_dependents=true(),
            workflow_id=func.coalesce(
                jobs.c.workflow_id, given.c.workflow_id, jobs.c.id.cast(Text)
            ),
        )
        .returning(
            jobs.c.id,
            # cancelled while its handler runs: it ends for its dependents when that returns
            case(
                (cancelled_held(), literal_column(f"'{JobStatus.running.value}'")),
                else_=jobs.c.status,
            ).label("status"),
            jobs.c.workflow_id,
            func.coalesce(routed, False).label("routed"),
        )
    )


def recorded_outcomes() -> Select[Any]:
    """How the jobs `:job_ids`, gone from the jobs table, ended: recorded on an edge of
    theirs when they ended, or kept in the history. (id, status) rows; an id neither knows
    is missing."""
    on_edges = (
        select(deps.c.parent_id.label("id"), func.min(deps.c.parent_status).label("status"))
        .where(deps.c.parent_id == any_(_ids("job_ids")), deps.c.parent_status.is_not(None))
        .group_by(deps.c.parent_id)
    )
    archived = select(history.c.id, history.c.status).where(history.c.id == any_(_ids("job_ids")))
    return select(union_all(on_edges, archived).subquery())


def insert_edges() -> Insert:
    """Write the edges of the arrays `:parent_ids`, `:child_ids`, `:positions`,
    `:on_failures`, `:parent_statuses` (NULL for a parent that has not ended)."""
    rows = select(
        unnested(
            "e",
            ("parent_ids", "parent_id", BigInteger),
            ("child_ids", "child_id", BigInteger),
            ("positions", "position", Integer),
            ("on_failures", "on_failure", Text),
            ("parent_statuses", "parent_status", Text),
        )
    )
    return (
        pg_insert(deps)
        .from_select(["parent_id", "child_id", "position", "on_failure", "parent_status"], rows)
        .on_conflict_do_nothing()
    )


def set_waiting() -> Update:
    """Give the just-inserted jobs `:child_ids` their place in the graph: `:statuses`
    (waiting, queued, or cancelled when a job they depend on already failed), `:deps_left`,
    `:reasons` (the cancelled ones' error) and `:workflows` (each one's own or inherited;
    where NULL, the one it has: a job flagged as a parent in the same batch has its own id
    until then)."""
    given = unnested(
        "given",
        ("child_ids", "id", BigInteger),
        ("statuses", "status", Text),
        ("deps_left", "deps_left", Integer),
        ("reasons", "reason", Text),
        ("workflows", "workflow_id", Text),
    )
    cancelled = given.c.status == literal_column(sql_literal(JobStatus.cancelled), Text)
    return (
        update(jobs)
        .where(jobs.c.id == given.c.id)
        .values(
            status=given.c.status,
            deps_left=given.c.deps_left,
            last_error=func.coalesce(given.c.reason, jobs.c.last_error),
            finished_at=case((cancelled, func.now()), else_=null()),
            workflow_id=func.coalesce(given.c.workflow_id, jobs.c.workflow_id),
        )
    )


def parent_results() -> Select[Any]:
    """The job `:job_id`'s parents in `depends_on` order: (position, parent_id,
    parent_status, result), the result from the jobs table or the archive (NULL if none
    was kept)."""
    live = select(jobs.c.result).where(jobs.c.id == deps.c.parent_id).scalar_subquery()
    kept = select(history.c.result).where(history.c.id == deps.c.parent_id).scalar_subquery()
    return (
        select(
            deps.c.position,
            deps.c.parent_id,
            deps.c.parent_status,
            func.coalesce(live, kept).label("result"),
        )
        .where(deps.c.child_id == bindparam("job_id", type_=BigInteger))
        .order_by(deps.c.position)
    )


def parents_of() -> Select[Any]:
    """The edges into `:job_id` (its parents), in `depends_on` order."""
    return (
        select(deps)
        .where(deps.c.child_id == bindparam("job_id", type_=BigInteger))
        .order_by(deps.c.position)
    )


def children_of() -> Select[Any]:
    """The edges out of `:job_id` (its dependents), by id."""
    return (
        select(deps)
        .where(deps.c.parent_id == bindparam("job_id", type_=BigInteger))
        .order_by(deps.c.child_id)
    )


def workflow_jobs() -> Select[Any]:
    """The first `:limit` jobs (by id) of the workflow `:workflow_id`, from the jobs table
    and the archive: (id, task, queue, status, deps_left, created_at, finished_at,
    archived). Each side reads its partial index on `workflow_id`, at most `:limit` rows."""
    limit = bindparam("limit", type_=Integer)

    def members(table: Table, deps_left: Any, archived: Any) -> Any:
        columns = [table.c[name] for name in ("id", "task", "queue", "status")]
        return (
            select(*columns, deps_left, table.c.created_at, table.c.finished_at, archived)
            .where(*of_workflow(table))
            .order_by(table.c.id)
            .limit(limit)
            .subquery()
            .select()
        )

    live = members(jobs, jobs.c.deps_left, false().label("archived"))
    kept = members(history, literal(None, Integer).label("deps_left"), true().label("archived"))
    both = union_all(live, kept).subquery("members")
    return select(both).order_by(both.c.id).limit(limit)


def unfinished_in_workflow() -> Select[Any]:
    """The ids of the jobs of workflow `:workflow_id` that a cancel ends (queued, waiting,
    running), from its partial index on `workflow_id`."""
    return (
        select(jobs.c.id)
        .where(*of_workflow(jobs), status_in(jobs.c.status, statuses(cancel=True)))
        .order_by(jobs.c.id)
    )


def edges_into() -> Select[Any]:
    """The edges into the jobs `:job_ids` (their parents): (parent_id, child_id,
    on_failure), by child and `depends_on` order (from `ix_job_deps_child_id`)."""
    return (
        select(deps.c.parent_id, deps.c.child_id, deps.c.on_failure)
        .where(deps.c.child_id == any_(_ids("job_ids")))
        .order_by(deps.c.child_id, deps.c.position)
    )


def _linked(edge_end: Any) -> list[Any]:
    """The task and status of the job at `edge_end` (a column of `deps`): from the jobs
    table, else the archive; NULL for a job in neither."""
    live = jobs.alias("live")
    kept = history.alias("kept")

    def of(name: str) -> Any:
        return func.coalesce(
            select(live.c[name]).where(live.c.id == edge_end).scalar_subquery(),
            select(kept.c[name]).where(kept.c.id == edge_end).scalar_subquery(),
        )

    return [of("task").label("task"), of("status").label("status")]


def job_parents() -> Select[Any]:
    """The job `:job_id`'s parents in `depends_on` order: (id, on_failure, ended, task,
    status); `ended` is how the parent ended as its edge recorded it (NULL while it has
    not), task and status NULL for a parent gone from the jobs table and the archive."""
    return (
        select(
            deps.c.parent_id.label("id"),
            deps.c.on_failure,
            deps.c.parent_status.label("ended"),
            *_linked(deps.c.parent_id),
        )
        .where(deps.c.child_id == bindparam("job_id", type_=BigInteger))
        .order_by(deps.c.position)
    )


def job_children() -> Select[Any]:
    """The first `:limit` of the job `:job_id`'s dependents by id: (id, on_failure, task,
    status), task and status NULL for one gone from the jobs table and the archive."""
    return (
        select(deps.c.child_id.label("id"), deps.c.on_failure, *_linked(deps.c.child_id))
        .where(deps.c.parent_id == bindparam("job_id", type_=BigInteger))
        .order_by(deps.c.child_id)
        .limit(bindparam("limit", type_=Integer))
    )


def cancel_parents_of_queue() -> Update:
    """Cancel the unfinished jobs of queue `:queue_name` that others wait for, before the
    queue is deleted with them: their dependents are cancelled (a running one's row
    deleted would count as succeeded)."""
    return (
        update(jobs)
        .where(
            jobs.c.queue == bindparam("queue_name", type_=Text),
            jobs.c.has_dependents,
            status_in(jobs.c.status, UNFINISHED),
        )
        .values(
            status=JobStatus.cancelled.value,
            finished_at=func.now(),
            last_error=func.concat("cancelled: its queue ", jobs.c.queue, " was deleted"),
        )
    )


def waiting_health() -> Select[Any]:
    """(waiting, held, orphaned, oldest seconds) over the waiting jobs: `held` wait for
    a job that ended failed or cancelled (a dependent retried alone: it runs once that job
    is retried and succeeds); `orphaned` wait for no job that has not ended (should never
    be: the edges or the counter were changed by hand); the oldest waiting job's age. A job
    parked by `ctx.wait_for_signal` (its `signal_key` set) waits for a signal, and one
    parked by `ctx.sleep` (`deps_left` NULL) for its end, not for its parents: neither is
    counted (see `queries.signals`, `queries.steps`)."""
    edge = deps.alias("d")
    unfinished = exists().where(edge.c.child_id == jobs.c.id, edge.c.parent_status.is_(None))
    failed = exists().where(
        edge.c.child_id == jobs.c.id,
        edge.c.on_failure == literal_column("'cancel'", Text),
        status_in(edge.c.parent_status, (JobStatus.failed.value, JobStatus.cancelled.value)),
    )
    columns: list[Any] = [
        func.count(),
        func.count().filter(failed),
        func.count().filter(~unfinished, ~failed),
        func.extract("epoch", func.now() - func.min(jobs.c.created_at)),
    ]
    # deps_left is set on every job waiting for others; NULL on one parked by ctx.sleep
    return select(*columns).where(
        _is_waiting(), jobs.c.signal_key.is_(None), jobs.c.deps_left.is_not(None)
    )


def _is_waiting() -> Any:
    return jobs.c.status == literal_column(sql_literal(JobStatus.waiting), Text)


def prune_edges() -> Delete:
    """Delete the edges whose dependent is gone from both the jobs table and the archive
    (its parents' outcomes are no longer needed by anyone who could read them)."""
    return delete(deps).where(
        ~exists().where(jobs.c.id == deps.c.child_id),
        ~exists().where(history.c.id == deps.c.child_id),
    )


__all__ = [
    "cancel_parents_of_queue",
    "children_of",
    "deps",
    "edges_into",
    "flag_parents",
    "insert_edges",
    "job_children",
    "job_parents",
    "parent_results",
    "parents_of",
    "prune_edges",
    "recorded_outcomes",
    "set_waiting",
    "unfinished_in_workflow",
    "waiting_health",
    "workflow_jobs",
]
