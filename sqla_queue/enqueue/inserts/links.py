"""Linking just-inserted jobs to the jobs they depend on (`depends_on`), in the same
transaction.

Every enqueue path inserts a job as it always does, then, before its transaction ends,
`link_jobs` runs three statements for the whole batch: it locks and flags the parents
(`queries.workflows.flag_parents`), writes the edges, and gives each new job its status:
`waiting` with the count of parents that have not ended, `queued` when all had succeeded,
or `cancelled` when one had already failed (unless its edge says `on_failure="run"`).
From then on the triggers of migration sqlaq_0009 move it, in the transaction that ends
each parent. Nothing here runs for a job without dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from sqla_queue.db import queries
from sqla_queue.db.models import Job
from sqla_queue.errors import DependencyError
from sqla_queue.job.states import FINISHED, JobStatus
from sqla_queue.job.validation import ON_FAILURE, check_on_failure

_FLAG = queries.workflows.flag_parents()
_RECORDED = queries.workflows.recorded_outcomes()
_EDGES = queries.workflows.insert_edges()
_PLACE = queries.workflows.set_waiting()

MAX_DEPENDENCIES = 100_000
"""The most jobs one job may depend on (a fan-in of that many parents is one job's list)."""


@dataclass(frozen=True)
class Dependency:
    """One entry of `depends_on` with its own `on_failure`: "run" lets the dependent run
    even when this job ends failed or cancelled (a clean-up job), "cancel" cancels it.
    None: the dependent's own `on_failure` (the task's, else "cancel").

        enqueue(session, "orders.release_stock", {...},
                depends_on=[Dependency(charge, on_failure="run")])
    """

    job: Job | int
    on_failure: str | None = None

    def __post_init__(self) -> None:
        check_on_failure(self.on_failure, _error("Dependency(...)"))


@dataclass
class Link:
    """A new job and what it depends on: parent ids in `depends_on` order, each with its
    edge's on_failure."""

    child_id: int
    task: str
    parents: list[tuple[int, str]] = field(default_factory=list)
    workflow_id: str | None = None


def _error(task: object) -> Any:
    def make(detail: str) -> DependencyError:
        return DependencyError(task=task, detail=detail)

    return make


def resolve(task: object, depends_on: object, on_failure: object) -> list[tuple[int, str]]:
    """`depends_on` as (parent id, on_failure) pairs in order, each parent once; refuses
    what is not a job, an id or a `Dependency`, and a `Job` not written yet."""
    error = _error(task)
    check_on_failure(on_failure, error)
    default = "cancel" if on_failure is None else str(on_failure)
    if isinstance(depends_on, (str, bytes, Mapping)) or not isinstance(depends_on, Iterable):
        raise error(
            f"depends_on must be a list of jobs or job ids, got {depends_on!r:.80}; "
            "write depends_on=[job]"
        )
    pairs: list[tuple[int, str]] = []
    seen: set[int] = set()
    for entry in depends_on:
        edge = default
        if isinstance(entry, Dependency):
            edge = entry.on_failure or default
            entry = entry.job
        job_id = _job_id(entry, error)
        if job_id not in seen:
            seen.add(job_id)
            pairs.append((job_id, edge))
    if len(pairs) > MAX_DEPENDENCIES:
        raise error(f"depends on {len(pairs)} jobs; at most {MAX_DEPENDENCIES}")
    return pairs


def _job_id(entry: object, error: Any) -> int:
    if isinstance(entry, Job):
        if entry.id is None:
            raise error(
                f"depends_on names {entry!r}, which has no id yet: add it to the same "
                "session before this job (the flush writes it first), or flush it"
            )
        return int(entry.id)
    if isinstance(entry, int) and not isinstance(entry, bool) and entry > 0:
        return entry
    raise error(f"depends_on takes jobs, job ids or sqla_queue.Dependency, got {entry!r:.80}")


def link_jobs(connection: Connection, links: Sequence[Link]) -> None:
    """Link the just-inserted jobs of `links` to their parents, in `connection`'s
    transaction (see the module's docstring). Raises `DependencyError` for a parent that
    does not exist (and whose end was not recorded), one in a queue routed to a broker, a
    job that depends on itself, or a cycle among the new jobs."""
    links = [link for link in links if link.parents]
    if not links:
        return
    _refuse_cycles(links)
    workflows: dict[int, str | None] = {}
    for link in links:
        for parent_id, _ in link.parents:
            if workflows.get(parent_id) is None:
                workflows[parent_id] = link.workflow_id
    parent_ids = sorted(workflows)
    found = {
        row.id: row
        for row in connection.execute(
            _FLAG,
            {"parent_ids": parent_ids, "parent_workflows": [workflows[p] for p in parent_ids]},
        )
    }
    status = {parent_id: row.status for parent_id, row in found.items()}
    workflow = {parent_id: row.workflow_id for parent_id, row in found.items()}
    routed = [parent_id for parent_id, row in found.items() if row.routed]
    if routed:
        raise DependencyError(
            task=_task_of(links, routed[0]),
            detail=f"job {routed[0]} is in a queue routed to a broker, whose outcome "
            "does not come back to the table: depend only on jobs of table queues",
        )
    missing = [p for p in parent_ids if p not in found]
    if missing:
        for row in connection.execute(_RECORDED, {"job_ids": missing}):
            status[row.id] = row.status
        unknown = [p for p in missing if p not in status]
        if unknown:
            raise DependencyError(
                task=_task_of(links, unknown[0]),
                detail=f"no job {', '.join(map(str, unknown[:5]))} in the table or the "
                "archive, and no record of how it ended (it never existed, or it was "
                "deleted without dependents: a job's outcome is recorded only when "
                "something depends on it when it ends). Enqueue the dependent before its "
                "dependencies finish (in the same transaction is simplest), or keep them "
                "(retention keep or archive)",
            )
    _write(connection, links, status, _workflows(links, workflow))


def _workflows(links: Sequence[Link], flagged: Mapping[int, str | None]) -> dict[int, str | None]:
    """Each new job's workflow: its own, else its first parent's. A parent enqueued in the
    same batch passes on what it inherits itself (not the id the flag gave it as a parent,
    before it was linked); another parent passes on what the flag returned."""
    new = {link.child_id: link for link in links}
    resolved: dict[int, str | None] = {}
    for link in links:
        chain: list[int] = []
        job_id = link.child_id
        while job_id in new and job_id not in resolved and not new[job_id].workflow_id:
            chain.append(job_id)
            job_id = new[job_id].parents[0][0]
        if job_id in resolved:
            found = resolved[job_id]
        elif job_id in new:
            found = new[job_id].workflow_id
        else:
            found = flagged.get(job_id)
        resolved.update(dict.fromkeys(chain or [link.child_id], found))
    return resolved


def _write(
    connection: Connection,
    links: Sequence[Link],
    status: Mapping[int, str],
    workflows: Mapping[int, str | None],
) -> None:
    edges: dict[str, list[Any]] = {
        "parent_ids": [],
        "child_ids": [],
        "positions": [],
        "on_failures": [],
        "parent_statuses": [],
    }
    places: dict[str, list[Any]] = {
        "child_ids": [],
        "statuses": [],
        "deps_left": [],
        "reasons": [],
        "workflows": [],
    }
    for link in links:
        left, reason = 0, None
        for position, (parent_id, on_failure) in enumerate(link.parents):
            ended = status[parent_id]
            if ended not in FINISHED:
                left += 1
            elif ended != JobStatus.done.value and on_failure == ON_FAILURE[0] and not reason:
                reason = (
                    f"cancelled: job {parent_id}, which it depends on, ended {ended} "
                    "before it was enqueued"
                )
            edges["parent_ids"].append(parent_id)
            edges["child_ids"].append(link.child_id)
            edges["positions"].append(position)
            edges["on_failures"].append(on_failure)
            edges["parent_statuses"].append(ended if ended in FINISHED else None)
        state = JobStatus.cancelled if reason else JobStatus.waiting if left else JobStatus.queued
        places["child_ids"].append(link.child_id)
        places["statuses"].append(state.value)
        places["deps_left"].append(left)
        places["reasons"].append(reason)
        places["workflows"].append(workflows[link.child_id])
    connection.execute(_EDGES, edges)
    connection.execute(_PLACE, places)


def _task_of(links: Sequence[Link], parent_id: int) -> str:
    return next(link.task for link in links if any(p == parent_id for p, _ in link.parents))


def _refuse_cycles(links: Sequence[Link]) -> None:
    """Refuse a job that depends on itself, or new jobs that depend on each other in a
    circle (possible only among jobs of one flush): none of them could ever run."""
    new = {link.child_id: link for link in links}
    for link in links:
        if any(parent_id == link.child_id for parent_id, _ in link.parents):
            raise DependencyError(task=link.task, detail=f"job {link.child_id} depends on itself")
    done: set[int] = set()
    for start in new:
        path: list[int] = []
        on_path: set[int] = set()
        stack: list[tuple[int, Iterable[int]]] = [(start, iter(_new_parents(new, start)))]
        on_path.add(start)
        path.append(start)
        while stack:
            node, parents = stack[-1]
            parent = next(iter(parents), None)
            if parent is None:
                stack.pop()
                on_path.discard(node)
                path.pop()
                done.add(node)
                continue
            if parent in on_path:
                circle = " -> ".join(map(str, [*path[path.index(parent) :], parent]))
                raise DependencyError(
                    task=new[node].task, detail=f"the new jobs depend on each other: {circle}"
                )
            if parent not in done:
                on_path.add(parent)
                path.append(parent)
                stack.append((parent, iter(_new_parents(new, parent))))


def _new_parents(new: Mapping[int, Link], child_id: int) -> list[int]:
    return [parent_id for parent_id, _ in new[child_id].parents if parent_id in new]


__all__ = ["MAX_DEPENDENCIES", "Dependency", "Link", "link_jobs", "resolve"]
