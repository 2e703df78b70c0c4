"""What the dashboard reads and does, as calls on a `Connection` (no HTTP here).

One job, retry, delete and cancel are `sqla_queue.admin.jobs`'s. The job list is the dashboard's
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
from sqla_queue.admin import partitions
from sqla_queue.admin.filters import JobFilter as JobFilter
from sqla_queue.db import rollup
from sqla_queue.db.models import JobStatus
from sqla_queue.db.queries import dashboard as statements
from sqla_queue.job.states import CLAIMED

PAGE_SIZE = 50


@dataclass
class QueueRow:
    """One queue on the queues page: counts, oldest due job, its series from the rollup."""

    name: str
    paused: bool | None
    retention: str | None
    counts: dict[str, int]
    oldest_due_age: float | None
    route: str | None = None
    """The broker its jobs are routed to (`nats:...`, `amqp:...`), None for table workers."""
    estimated: frozenset[str] = frozenset()
    """Statuses whose count is the planner's estimate (finished ones, on a big table)."""
    capped: frozenset[str] = frozenset()
    """Statuses whose count stopped at the cap (there may be more)."""
    hour: rollup.Series | None = None
    """Jobs ended per minute over the last hour (`job_counts`); None: none ended."""
    day: rollup.Series | None = None
    """Jobs ended per 10 minutes over the last day."""

    @property
    def finished_last_hour(self) -> int:
        return 0 if self.hour is None else sum(self.hour.finished)


COUNT_CAP = 10_000
"""Where a bounded count of queued, running or waiting jobs stops."""
ESTIMATED = tuple(s.value for s in JobStatus if s.finished)


def exact_rows(conn: Connection) -> list[QueueRow]:
    """Every queue (with a row or only jobs) with its exact counts: reads every job."""
    settings = {q.name: q for q in admin.list_queues(conn)}
    rows: list[QueueRow] = []
    for s in admin.stats(conn):
        info = settings.get(s.queue)
        retention, route = (info.retention, info.route) if info else (None, None)
        rows.append(QueueRow(s.queue, s.paused, retention, s.counts, s.oldest_due_age, route))
    return rows


def bounded_rows(conn: Connection, cap: int = COUNT_CAP) -> list[QueueRow]:
    """The queues of the queues table, each count bounded whatever the table holds: queued,
    running and waiting counted up to `cap` from their partial indexes; done, failed and
    cancelled the planner's estimates (no row read). Queues with jobs but no row (once the
    foreign key is dropped) are not listed."""
    settings = {q.name: q for q in admin.list_queues(conn)}
    rows: list[QueueRow] = []
    conn.execute(statements.NO_JIT)  # this transaction's only
    for name, paused, queued, running, claimed, waiting, age in conn.execute(
        statements.BOUNDED_COUNTS, {"cap": cap}
    ):
        counts = {
            "queued": int(queued),
            "running": int(running),
            CLAIMED: int(claimed),
            "waiting": int(waiting),
        }
        capped = frozenset(status for status, n in counts.items() if n >= cap)
        for status in ESTIMATED:
            params = {"queue": name, "status": status}
            counts[status] = rollup.plan_rows(conn, statements.ESTIMATED_COUNT, params)
        info = settings.get(name)
        rows.append(
            QueueRow(
                name,
                paused,
                info.retention if info else None,
                counts,
                None if age is None else float(age),
                route=info.route if info else None,
                estimated=frozenset(ESTIMATED),
                capped=capped,
            )
        )
    return rows


def queue_rows(conn: Connection) -> list[QueueRow]:
    """Every queue with its counts by status (exact on a small table, bounded from
    `rollup.BIG_TABLE` jobs on) and its last hour and day of ended jobs from the rollup."""
    rows = bounded_rows(conn, COUNT_CAP) if rollup.big_table(conn) else exact_rows(conn)
    hour, day = rollup.recent(conn, rollup.HOUR), rollup.recent(conn, rollup.DAY)
    for row in rows:
        row.hour, row.day = hour.get(row.name), day.get(row.name)
    return rows


TOP_PARTITIONS = 10
"""Partitions a fair or partition-limited queue's page shows (the deepest)."""
HELD_SHOWN = 50
"""Held sequences a queue's page shows at most (the longest held)."""


@dataclass
class QueueTurns:
    """A queue's page beyond its tasks: its settings, its deepest partitions (a fair or
    partition-limited queue), the sequences its failed jobs hold, its aged jobs (aging)."""

    info: admin.QueueInfo | None
    """None: no row in the queues table."""
    depths: list[partitions.PartitionDepth]
    held: list[partitions.HeldSequence]
    aged: int | None
    """None: the queue does not age."""
    weights: dict[str, float] = field(default_factory=dict)
    """The weights given to its partitions (`queues weight`), by partition; others weigh 1."""


def queue_turns(conn: Connection, name: str) -> QueueTurns:
    """What the queue page shows of `name`'s settings, partitions, held sequences and aged
    jobs: each read bounded (the queue's queued and running rows, `HELD_SHOWN` held)."""
    conn.execute(statements.NO_JIT)  # this transaction's only: see `metrics`
    info = next((q for q in admin.list_queues(conn) if q.name == name), None)
    takes_turns = info is not None and (info.fair or info.partition_limit is not None)
    depths = partitions.top_partitions(conn, [name], TOP_PARTITIONS) if takes_turns else []
    aging = info is not None and info.aging is not None
    weights = {
        partition: weight
        for (queue, partition), weight in partitions.partition_weights(conn).items()
        if queue == name
    }
    return QueueTurns(
        info,
        depths,
        partitions.held_sequences(conn, HELD_SHOWN, queue=name),
        partitions.aged_jobs(conn).get(name, 0) if aging else None,
        weights,
    )


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
