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

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    false,
    func,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.db.models import NO_TAGS
from sqla_queue.db.queries.admin import LISTED_COLUMNS
from sqla_queue.db.queries.common import cancelled_held, history, jobs, status_is
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
    @property
    def waiting_for(self) -> str | None: ...


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
    if where.waiting_for is not None:  # parked for that signal (ix_jobs_signal_key's predicate)
        if "signal_key" in table.c:
            found += [
                status_is(JobStatus.waiting, table),
                table.c.signal_key.is_not(None),
                table.c.signal_key == where.waiting_for,
            ]
        else:  # the archive: its jobs have ended, none waits
            found.append(false())
    return found


def _reads_history(statuses: Sequence[JobStatus]) -> bool:
    """Whether jobs in `statuses` may be in the history too (a succeeded job of a `keep` or
    `archive` queue is there): any status, or `done` among them."""
    return not statuses or JobStatus.done in statuses


def batch_ids(where: Filter, statuses: Sequence[JobStatus], *, held: bool) -> Select[Any]:
    """Ids of up to `:batch` jobs matching `where` in `statuses`, above `:after_id`, by id,
    from the jobs table (locked, FOR UPDATE: the conditions are checked again on a row
    another transaction changed meanwhile) and, for `done`, the history (by its
    partitions' primary keys, merged). Without `held`, a cancelled job whose handler
    still runs is left out (no admin command may requeue or delete it yet)."""
    after = bindparam("after_id", type_=BigInteger)
    limit = bindparam("batch", type_=Integer)
    statement = select(jobs.c.id).where(*conditions(where, jobs, statuses), jobs.c.id > after)
    if not held:
        statement = statement.where(~cancelled_held())
    live = statement.order_by(jobs.c.id).limit(limit).with_for_update(of=jobs)
    if not _reads_history(statuses):
        return live
    kept = (
        select(history.c.id)
        .where(*conditions(where, history, statuses), history.c.id > after)
        .order_by(history.c.id)
        .limit(limit)
    )
    both = union_all(live.subquery().select(), kept.subquery().select()).subquery("ids")
    return select(both.c.id).order_by(both.c.id).limit(limit)


def count(where: Filter, statuses: Sequence[JobStatus], *, held: bool) -> Select[Any]:
    """How many jobs `batch_ids` would go through, over every batch."""
    statement = select(func.count()).select_from(jobs).where(*conditions(where, jobs, statuses))
    if not held:
        statement = statement.where(~cancelled_held())
    if not _reads_history(statuses):
        return statement
    kept = select(func.count()).select_from(history).where(*conditions(where, history, statuses))
    return select(statement.scalar_subquery() + kept.scalar_subquery())


def sample(where: Filter, statuses: Sequence[JobStatus], *, held: bool) -> Select[Any]:
    """(id, task, status, error) of the first `:limit` jobs `batch_ids` would go through, by
    id, unlocked: what a confirmation shows of what matched."""
    limit = bindparam("limit", type_=Integer)

    def first(table: Any) -> Select[Any]:
        statement = select(
            table.c.id, table.c.task, table.c.status, error_headline(table).label("error")
        ).where(*conditions(where, table, statuses))
        if not held and table is jobs:
            statement = statement.where(~cancelled_held())
        return statement.order_by(table.c.id).limit(limit)

    if not _reads_history(statuses):
        return first(jobs)
    both = union_all(first(jobs).subquery().select(), first(history).subquery().select())
    merged = both.subquery("sampled")
    return select(merged).order_by(merged.c.id).limit(limit)


def search(where: Filter, *, before: bool) -> Select[Any]:
    """Up to `:limit` jobs matching `where`, newest first, below `:before` if `before` (the
    keyset cursor: each page costs the same, however deep), from the jobs table and, when
    the filter may match a `done` job, the history (each read newest first, merged)."""
    limit = bindparam("limit", type_=Integer)

    def newest(table: Any) -> Select[Any]:
        statement = select(*(table.c[c.name] for c in LISTED_COLUMNS)).where(
            *conditions(where, table)
        )
        if before:
            statement = statement.where(table.c.id < bindparam("before", type_=BigInteger))
        return statement.order_by(table.c.id.desc()).limit(limit)

    if not _reads_history(where.statuses):
        return newest(jobs)
    both = union_all(newest(jobs).subquery().select(), newest(history).subquery().select())
    merged = both.subquery("found")
    return select(merged).order_by(merged.c.id.desc()).limit(limit)
