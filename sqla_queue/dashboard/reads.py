"""What the dashboard reads and does, as calls on a `Connection` (no HTTP here).

One job, retry, delete and cancel are `sqla_queue.admin`'s. The job list is the dashboard's
own: unlike `admin.list_jobs`, a page searches a bounded window of jobs, so a filter that
matches few jobs or none still answers in milliseconds on a table of millions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from sqla_queue import admin
from sqla_queue.bulk import JobFilter as JobFilter
from sqla_queue.models import JobStatus
from sqla_queue.queries import dashboard as statements

PAGE_SIZE = 50
MINUTES = 60


@dataclass
class QueueRow:
    """One queue on the queues page: counts, oldest due job, last hour per minute."""

    name: str
    paused: bool | None
    retention: str | None
    counts: dict[str, int]
    oldest_due_age: float | None
    route: str | None = None
    """The broker its jobs are routed to (`nats:...`, `amqp:...`), None for table workers."""
    per_minute: list[int] = field(default_factory=lambda: [0] * MINUTES)
    failed_per_minute: list[int] = field(default_factory=lambda: [0] * MINUTES)

    @property
    def finished_last_hour(self) -> int:
        return sum(self.per_minute)


def queue_rows(conn: Connection) -> list[QueueRow]:
    """Every queue with its counts by status and its last hour of finished jobs."""
    settings = {q.name: q for q in admin.list_queues(conn)}
    rows: dict[str, QueueRow] = {}
    for s in admin.stats(conn):
        info = settings.get(s.queue)
        rows[s.queue] = QueueRow(
            s.queue,
            s.paused,
            info.retention if info else None,
            s.counts,
            s.oldest_due_age,
            route=info.route if info else None,
        )
    for queue, ago, status, count in conn.execute(statements.throughput()):
        row = rows.get(queue)
        if row is None or not 0 <= ago < MINUTES:
            continue
        # Index 0 is the oldest minute, so the chart reads left to right.
        row.per_minute[MINUTES - 1 - ago] += int(count)
        if status == JobStatus.failed.value:
            row.failed_per_minute[MINUTES - 1 - ago] += int(count)
    return list(rows.values())


@dataclass
class JobPage:
    jobs: list[dict[str, Any]]
    next_before: int | None
    """The `before` of the next (older) page: set only when the page is full and at least
    one more job matches (the Older link never leads to an empty page)."""
    searched: int = 0
    """When the page is short: how many jobs were searched for it (the window), else 0."""
    search_before: int | None = None
    """When the page is short because its window ran out: where a further search would
    start (older jobs were not searched); None when no older job exists."""


SEARCH_WINDOW = 20_000
"""Jobs one page searches at most: a filter matching few jobs costs a bounded read."""


def list_jobs(
    conn: Connection,
    where: JobFilter,
    before: int | None = None,
    limit: int = PAGE_SIZE,
    window: int = SEARCH_WINDOW,
) -> JobPage:
    """A page of jobs newest first, older than job `before` if given (keyset pagination).

    A page searches at most `window` jobs. When more than `limit` match, `next_before` is
    the next page's start. When fewer match and older jobs exist, the page is short and
    `search_before` is where searching the next window would start: asked for, not
    offered as the next page (each such search reads another window, perhaps for nothing).
    """
    statement = statements.job_page(where, before is not None)
    params: dict[str, Any] = {"limit": limit + 1, "window": window}
    if before is not None:
        params["before_id"] = before
    rows = [dict(row) for row in conn.execute(statement, params).mappings()]
    if len(rows) > limit:
        return JobPage(rows[:limit], int(rows[limit - 1]["id"]))
    oldest, searched = conn.execute(statements.window_end(before is not None), params).one()
    if searched < window:
        return JobPage(rows, None)
    return JobPage(rows, None, int(searched), int(oldest))


MAX_TREE_ROWS = 2000
"""Rows a workflow's tree shows at most: a job under each of its parents is a row each."""
DEEPEST_DRAWN = 40
"""Levels of a tree drawn as branches; a deeper row says its depth instead."""


@dataclass(frozen=True)
class TreeRow:
    """One row of a workflow's tree: a job under one of its parents (or a root)."""

    job: admin.WorkflowJob
    depth: int
    branch: str
    """The tree's lines before it ("│  ├─ "), plain text."""
    parents_shown: int
    """How many of its parents are in the tree: more than one, it appears under each."""
    first: bool
    """Its first row: its children follow this one; a later row refers back to it."""


@dataclass
class Tree:
    rows: list[TreeRow]
    cut: bool
    """Rows were left out (more than `MAX_TREE_ROWS`)."""


def workflow_tree(found: Sequence[admin.WorkflowJob], max_rows: int = MAX_TREE_ROWS) -> Tree:
    """The jobs `found` as an indented tree: roots (no parent among them) by id, each job's
    children (by id) under it. A job with several parents appears under each; its
    children follow its first row only, so a diamond-rich graph stays linear in its edges."""
    by_id = {job.id: job for job in found}
    children: dict[int, list[int]] = {}
    shown: dict[int, int] = {}
    for job in found:
        parents = [p for p in dict.fromkeys(job.parents) if p in by_id]
        shown[job.id] = len(parents)
        for parent in parents:
            children.setdefault(parent, []).append(job.id)
    roots = [job.id for job in found if not shown[job.id]]
    rows: list[TreeRow] = []
    seen: set[int] = set()
    # (job, depth, its branch, the lines its children's branches continue)
    stack = [(job_id, 0, "", "") for job_id in reversed(roots)]
    while stack and len(rows) < max_rows:
        job_id, depth, branch, below = stack.pop()
        first = job_id not in seen
        seen.add(job_id)
        if depth > DEEPEST_DRAWN:
            branch = f"… level {depth} ─ "
        rows.append(TreeRow(by_id[job_id], depth, branch, shown[job_id], first))
        kids = children.get(job_id, []) if first else []
        for i, kid in reversed(list(enumerate(kids))):
            last = i == len(kids) - 1
            kid_branch = below + ("└─ " if last else "├─ ")
            kid_below = below + ("   " if last else "│  ") if depth < DEEPEST_DRAWN else below
            stack.append((kid, depth + 1, kid_branch, kid_below))
    return Tree(rows, bool(stack))


def seconds_between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()
