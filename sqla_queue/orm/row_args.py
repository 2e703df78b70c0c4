"""ORM rows as a task's arguments: `RowPolicy`, and `load_rows`, which loads them before the
handler is called.

    @registry.task(missing="cancel", changed="skip", for_update=True)
    def ship(order: Order) -> None: ...

    ship.defer(session, order)        # the job keeps {"$row": "orders", "key": [42], ...}

The job core rebuilds each stored reference as a `RowRef` (`sqla_queue.job.arguments`); the
runner asks the task to load them (`Task.load_rows`), here, in the session the handler's
`ctx.session()` then returns: the handler's writes to the row commit with the job's end, and
a row loaded `for_update` stays locked until then. The policies:

- `missing`: a row that is gone. `"cancel"` (the default) ends the job cancelled, its reason
  naming the row (`orders 42 is gone`), without running or retrying it; `"none"` runs the
  handler with None.
- `changed`: with a `version_id_col` on the mapped class, a row whose version is not the
  one it had at enqueue. `"run"` (the default) runs with the row as it is now; `"skip"`
  cancels the job (`orders 42 changed since enqueue (version 1, now 2)`); `"latest"` runs
  it unless a later job of the same task about the same row is not finished, which sees
  the row as it is then (this one is cancelled, naming it): of a burst of changes, one run.
- a task takes at most one row (`sqla_queue.job.arguments.ONE_ROW`: refused when it is
  registered), and the job's reference must name the row the job is `about` (recorded at
  enqueue): a reference changed since, or given with another `about=`, or by name with no
  registry to record it, fails the job for good without loading anything. Every reference
  is checked before any is loaded.
- `for_update=True` loads the rows with `FOR UPDATE SKIP LOCKED`: while another
  transaction holds one, the job snoozes (`ROW_LOCKED_SNOOZE` seconds, its attempt
  refunded) instead of waiting on the lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sqlalchemy import Connection, Select, bindparam, exists, inspect, select
from sqlalchemy.orm import Mapper, Session

from sqla_queue.db import queries
from sqla_queue.db.queries import about as about_queries
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.arguments import RowRef, RowsRefused
from sqla_queue.job.context import JobContext

__all__ = ["ROW_LOCKED_SNOOZE", "RowPolicy", "load_rows"]

ROW_LOCKED_SNOOZE = 1.0
"""Seconds a `for_update` job snoozes while another transaction holds one of its rows."""

MISSING = ("cancel", "none")
CHANGED = ("run", "skip", "latest")


@dataclasses.dataclass(frozen=True)
class RowPolicy:
    """What a task does with its row arguments: see the module's doc."""

    missing: Literal["cancel", "none"] = "cancel"
    changed: Literal["run", "skip", "latest"] = "run"
    for_update: bool = False

    def __post_init__(self) -> None:
        if self.missing not in MISSING:
            raise ConfigurationError(
                detail=f"missing= is 'cancel' or 'none' (a row gone before the run), "
                f"got {self.missing!r}"
            )
        if self.changed not in CHANGED:
            raise ConfigurationError(
                detail=f"changed= is 'run', 'skip' or 'latest' (a row changed since enqueue), "
                f"got {self.changed!r}"
            )
        if not isinstance(self.for_update, bool):
            raise ConfigurationError(
                detail=f"for_update= is True or False, got {self.for_update!r}"
            )


DEFAULT_ROW_POLICY = RowPolicy()

NO_SESSION = (
    "a row argument is loaded in the handler's ctx.session(), which this runner has none of "
    "(drain a Session or a Connection, or a broker worker): run it with a table worker, "
    "drain(engine, registry) or run_until_empty"
)


def load_rows(
    ctx: JobContext, args: Mapping[str, Any], names: Sequence[str], policy: RowPolicy
) -> tuple[Mapping[str, Any], RowsRefused | None]:
    """`args` with each `RowRef` among `names` replaced by its row, loaded in a session the
    handler's next `ctx.session()` returns (`JobContext.hand_over`); or why the handler is
    not called (a cancel is written here, before returning)."""
    refs = [(name, ref) for name in names if isinstance(ref := args.get(name), RowRef)]
    if not refs:
        return args, None
    for name, ref in refs:  # each one, before any load (a task takes one: `ONE_ROW`)
        if ref.about != ctx.about:  # stored args changed, or another about= given
            return args, RowsRefused("failed", not_about(name, ref, ctx.about))
    try:
        session = ctx.session()
    except ConfigurationError:
        return args, RowsRefused("failed", NO_SESSION)
    loaded = dict(args)
    try:
        for name, ref in refs:
            row, refused = _load(session, ctx, ref, policy)
            if refused is not None:
                session.close()  # its locks go before the cancel is written
                if refused.kind == "cancelled":
                    _cancel(session, ctx, refused.reason)
                return args, refused
            loaded[name] = row
    except BaseException:
        session.close()
        raise
    ctx.hand_over(session)
    return loaded, None


def not_about(name: str, ref: RowRef, about: str | None) -> str:
    """Why row argument `name`, which names `ref`'s row, is not loaded for a job about
    `about`: a job loads only the row it was enqueued about."""
    job_about = "no row" if about is None else repr(about)
    return (
        f"row argument {name!r} names {ref.about!r} but the job is about {job_about}: a job "
        "loads only the row it was enqueued about (its args were changed after enqueue, or "
        "it was enqueued with another about=, or by name without a registry to record it); "
        "enqueue it again through its task, e.g. task.defer(session, row)"
    )


def _load(
    session: Session, ctx: JobContext, ref: RowRef, policy: RowPolicy
) -> tuple[Any, RowsRefused | None]:
    mapper: Mapper[Any] = inspect(ref.mapped)
    statement, present = _statements(ref.mapped, mapper, policy.for_update)
    key = {
        f"pk_{i}": _typed(column, value)
        for i, (column, value) in enumerate(zip(mapper.primary_key, ref.key, strict=True))
    }
    row = session.scalars(statement, key).one_or_none()
    if row is None:
        if policy.for_update and session.scalar(present, key):
            reason = f"{ref.shown} is locked by another transaction"
            return None, RowsRefused("snoozed", reason, ROW_LOCKED_SNOOZE)
        if policy.missing == "none":
            return None, None
        return None, RowsRefused("cancelled", f"{ref.shown} is gone")
    version_column = mapper.version_id_col
    if version_column is None or ref.version is None or policy.changed == "run":
        return row, None
    now = getattr(row, mapper.get_property_by_column(version_column).key)
    if now == ref.version or str(now) == str(ref.version):
        return row, None
    changed = f"{ref.shown} changed since enqueue (version {ref.version}, now {now})"
    if policy.changed == "skip":
        return None, RowsRefused("cancelled", changed)
    later = session.scalar(
        about_queries.later_job_about(),
        {"about_key": ref.about, "job_task": ctx.task, "job_id": ctx.job_id},
    )
    if later is None:
        return row, None
    return None, RowsRefused("cancelled", f"{changed}; job {later}, enqueued later, runs with it")


_STATEMENTS: dict[tuple[type, bool], tuple[Select[Any], Select[Any]]] = {}
"""Per mapped class and `for_update`: the row's load by primary key and whether it exists,
each built once (building a statement per job cost more than its run, profiled)."""


def _statements(mapped: type, mapper: Mapper[Any], for_update: bool) -> tuple[Any, Any]:
    built = _STATEMENTS.get((mapped, for_update))
    if built is None:
        where = [
            column == bindparam(f"pk_{i}", type_=column.type)
            for i, column in enumerate(mapper.primary_key)
        ]
        load: Select[Any] = select(mapped).where(*where)
        if for_update:
            load = load.with_for_update(skip_locked=True)
        built = _STATEMENTS[(mapped, for_update)] = (load, select(exists().where(*where)))
    return built


def _typed(column: Any, value: Any) -> Any:
    """A key value from JSON as its column's Python type (a UUID's text as a UUID)."""
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return value
    if isinstance(value, str) and kind not in (str, int):
        try:
            return kind(value)
        except (TypeError, ValueError):
            return value
    return value


def _cancel(session: Session, ctx: JobContext, reason: str) -> None:
    """End the job cancelled with `reason`, fenced on its attempt, in a transaction of its
    own (the runner then writes nothing for it)."""
    params = {"job_ids": [ctx.job_id], "job_attempts": [ctx.attempt], "job_errors": [reason]}
    bind = session.get_bind()
    if isinstance(bind, Connection):  # a session on the caller's connection: its transaction
        bind.execute(queries.cancel_running_jobs(), params)
        return
    with bind.begin() as connection:
        connection.execute(queries.cancel_running_jobs(), params)
