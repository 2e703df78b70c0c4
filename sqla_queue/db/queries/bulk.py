"""Jobs matching a filter (`sqla_queue.admin.filters.JobFilter`): its conditions, a batch of their
ids by keyset on id, and their count.

The filter's values go in as bound parameters; its statuses as literals (`status_is`), as the
partial indexes need. `args` is matched by containment (`args @> :value`): no index on
`args` exists by default; `CREATE INDEX ... ON sqla_queue.jobs USING gin (args
jsonb_path_ops)` serves it (docs/cli.md, "Acting on many jobs at once").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import BigInteger, Integer, Select, and_, bindparam, case, func, or_, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.db.models import NO_TAGS
from sqla_queue.db.queries.admin import LISTED_COLUMNS
from sqla_queue.db.queries.common import cancelled_held, jobs, status_is
from sqla_queue.job.states import JobStatus

LIKE_ESCAPE = "\\"


class Filter(Protocol):
    """What a statement of this module reads of a filter (`sqla_queue.admin.filters.JobFilter`)."""

    @property
    def queue(self) -> str | None: ...
    @property
    def task(self) -> str | None: ...
    @property
    def statuses(self) -> tuple[JobStatus, ...]: ...
    @property
    def tags(self) -> tuple[str, ...]: ...
    @property
    def workflow_id(self) -> str | None: ...
    @property
    def about(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def traceback(self) -> str | None: ...
    @property
    def finished_before(self) -> dt.datetime | None: ...
    @property
    def finished_after(self) -> dt.datetime | None: ...
    @property
    def created_before(self) -> dt.datetime | None: ...
    @property
    def created_after(self) -> dt.datetime | None: ...
    @property
    def args(self) -> Mapping[str, Any] | None: ...


def error_headline(table: Any = jobs) -> ColumnElement[str]:
    """A job's error as a person reads it: the class and message of its latest error-history
    entry (`ValueError: bad input`, `sqla_queue.job.history`) when its last_error is that
    attempt's traceback, else its last_error (a reason: "cancelled: ...", a deferral, or a
    traceback written before the history was kept). Never a file path or function name."""
    latest = table.c.errors[-1]
    error_class = latest["class"].astext
    message = latest["message"].astext
    headline = case(
        (func.coalesce(message, "") == "", error_class),
        else_=func.concat(error_class, ": ", message),
    )
    # the latest entry is the last error only while last_error still holds its message
    current = and_(error_class.is_not(None), func.strpos(table.c.last_error, message) > 0)
    return case((current, headline), else_=table.c.last_error)


def like_pattern(text: str) -> str:
    """`%text%` with LIKE's wildcards in `text` escaped: a substring, taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def conditions(
    where: Filter, table: Any = jobs, statuses: Sequence[JobStatus] | None = None
) -> list[ColumnElement[bool]]:
    """The filter's conditions on `table` (jobs, or a subquery with its columns); the
    status condition is `statuses` when given (the filter's, narrowed to an action's)."""
    found: list[ColumnElement[bool]] = []
    wanted = where.statuses if statuses is None else tuple(statuses)
    if wanted:
        found.append(or_(*(status_is(s, table) for s in wanted)))
    if where.queue is not None:
        found.append(table.c.queue == where.queue)
    if where.task is not None:
        found.append(table.c.task == where.task)
    if where.tags:
        found.append(table.c.tags.contains(list(where.tags)))
        if table is jobs:  # the GIN index's predicate: it holds tagged jobs only
            found.append(table.c.tags != NO_TAGS)
    if where.workflow_id is not None:
        found += [table.c.workflow_id == where.workflow_id, table.c.workflow_id.is_not(None)]
    if where.about is not None:
        found.append(table.c.about == where.about)
    if where.error is not None:
        found.append(error_headline(table).ilike(like_pattern(where.error), escape=LIKE_ESCAPE))
    if where.traceback is not None:
        found.append(table.c.last_error.ilike(like_pattern(where.traceback), escape=LIKE_ESCAPE))
    for name, column in (("finished", table.c.finished_at), ("created", table.c.created_at)):
        before = getattr(where, f"{name}_before")
        after = getattr(where, f"{name}_after")
        if before is not None:
            found.append(column < before)
        if after is not None:
            found.append(column >= after)
    if where.args is not None:
        found.append(table.c.args.op("@>")(bindparam(None, dict(where.args), type_=JSONB)))
    return found


def batch_ids(where: Filter, statuses: Sequence[JobStatus], *, held: bool) -> Select[Any]:
    """Ids of up to `:batch` jobs matching `where` in `statuses`, above `:after_id`, by id,
    locked (FOR UPDATE: the conditions are checked again on a row another transaction
    changed meanwhile). Without `held`, a cancelled job whose handler still runs is left
    out (no admin command may requeue or delete it yet)."""
    statement = select(jobs.c.id).where(
        *conditions(where, jobs, statuses), jobs.c.id > bindparam("after_id", type_=BigInteger)
    )
    if not held:
        statement = statement.where(~cancelled_held())
    return (
        statement.order_by(jobs.c.id)
        .limit(bindparam("batch", type_=Integer))
        .with_for_update(of=jobs)
    )


def count(where: Filter, statuses: Sequence[JobStatus], *, held: bool) -> Select[Any]:
    """How many jobs `batch_ids` would go through, over every batch."""
    statement = select(func.count()).select_from(jobs).where(*conditions(where, jobs, statuses))
    if not held:
        statement = statement.where(~cancelled_held())
    return statement


def sample(where: Filter, statuses: Sequence[JobStatus], *, held: bool) -> Select[Any]:
    """(id, task, status, error) of the first `:limit` jobs `batch_ids` would go through, by
    id, unlocked: what a confirmation shows of what matched."""
    statement = select(
        jobs.c.id, jobs.c.task, jobs.c.status, error_headline(jobs).label("error")
    ).where(*conditions(where, jobs, statuses))
    if not held:
        statement = statement.where(~cancelled_held())
    return statement.order_by(jobs.c.id).limit(bindparam("limit", type_=Integer))


def search(where: Filter, *, before: bool) -> Select[Any]:
    """Up to `:limit` jobs matching `where`, newest first, below `:before` if `before` (the
    keyset cursor: each page costs the same, however deep)."""
    statement = select(*LISTED_COLUMNS).where(*conditions(where))
    if before:
        statement = statement.where(jobs.c.id < bindparam("before", type_=BigInteger))
    return statement.order_by(jobs.c.id.desc()).limit(bindparam("limit", type_=Integer))
