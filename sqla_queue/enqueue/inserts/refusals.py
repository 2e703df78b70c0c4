"""Clear errors for statements the database refused: an unknown queue, one of our CHECK
constraints, an unmigrated database (`SchemaMissingError`), translated by the engine's
`handle_error` hook (`listen`) when they happen, so no enqueue pays a round trip to check first."""

from __future__ import annotations

import re
import threading

from sqlalchemy import event
from sqlalchemy.engine import Engine, ExceptionContext

from sqla_queue.db.models import (
    SCHEMA,
    SCHEMA_MAX_ARGS_BYTES,
    SCHEMA_MAX_NAME_LENGTH,
    Job,
)
from sqla_queue.errors import InvalidJobError, SchemaMissingError, SqlaQueueError, UnknownQueueError
from sqla_queue.job.validation import PRIORITY_MAX

_QUEUE_FK = "fk_jobs_queue_queues"
_MISSING_KEY = re.compile(r"Key \(queue\)=\((?P<queue>.*)\) is not present")


_ABORTED = (
    "; PostgreSQL has aborted this transaction, so nothing in it can commit: roll it back "
    "and write it again without this job"
)
"""Said of every row the database refused: a caller who catches the error and commits
would otherwise lose the whole transaction without a word (COMMIT of it rolls back)."""


def _ours(exc: BaseException) -> str | None:
    """The name of the constraint `exc` reports, if it is on one of the queue's own tables."""
    diag = getattr(exc, "diag", None)
    if diag is None or getattr(diag, "schema_name", None) != SCHEMA:
        return None  # an application's own `jobs` table may use the same constraint names
    return getattr(diag, "constraint_name", None)


def _unknown_queue(exc: BaseException) -> UnknownQueueError | None:
    """The clear error for a job whose queue does not exist (under the queue FK), if it is one."""
    if _ours(exc) != _QUEUE_FK:
        return None
    match = _MISSING_KEY.search(getattr(exc.diag, "message_detail", None) or "")  # type: ignore[attr-defined]
    if match is None:  # the FK also fires when a queue with jobs is deleted
        return None
    message = (UnknownQueueError.__doc__ or "").strip().rstrip(".") + _ABORTED + "."
    return UnknownQueueError(message, queue=match.group("queue"))


_CHECKS = {
    "ck_jobs_task_name": f"a task name is 1 to {SCHEMA_MAX_NAME_LENGTH} characters",
    "ck_jobs_queue_name": f"a queue name is 1 to {SCHEMA_MAX_NAME_LENGTH} characters",
    "ck_queues_name": f"a queue name is 1 to {SCHEMA_MAX_NAME_LENGTH} characters",
    "ck_jobs_args_object": "args are a JSON object (a dict of keyword arguments)",
    "ck_jobs_args_size": f"args are at most {SCHEMA_MAX_ARGS_BYTES} bytes as jsonb text",
    "ck_jobs_priority": f"priority is between 0 and {PRIORITY_MAX}",
    "ck_jobs_max_attempts": "max_attempts is a positive int or NULL",
}
"""Our CHECK constraints on written rows, each with the rule it holds."""


def _refused_by_check(exc: BaseException, parameters: object) -> InvalidJobError | None:
    """The clear error for a row one of our CHECK constraints refused, if it is one."""
    constraint = _ours(exc) or ""
    rule = _CHECKS.get(constraint)
    if rule is None:
        return None
    task = None
    if isinstance(parameters, dict):
        task = parameters.get("task", parameters.get("job_task"))
    return InvalidJobError(
        task=task if isinstance(task, str) else "(not known)",
        detail=f"the database refused the row: {rule} (CHECK constraint {constraint}, "
        f"which holds for every writer, also Core inserts and later attribute changes){_ABORTED}",
    )


_NOT_THERE = re.compile(rf'^(relation "{SCHEMA}\.[^"]+"|schema "{SCHEMA}") does not exist')
_NOT_THERE_STATES = ("42P01", "3F000")
"""undefined_table and invalid_schema_name: how a statement meets an unmigrated database."""
_NO_COLUMN = re.compile(r'^column "(?P<column>[^"]+)" of relation "(?P<table>[^"]+)" does not')
_NO_COLUMN_STATE = "42703"
"""undefined_column: how a job that uses a newer column (an enqueue names a column only
when its job uses it, `ByOptionsUsed`) meets a database an older release migrated."""


def _schema_missing(exc: BaseException, statement: str | None) -> SchemaMissingError | None:
    """The clear error for a statement on our schema in a database that lacks it (never
    migrated, or an older revision without the table), if it is one: translated when it
    happens, so the enqueue path pays no round trip to check first."""
    state = getattr(exc, "sqlstate", None)
    if state != _NO_COLUMN_STATE and state not in _NOT_THERE_STATES:
        return None
    primary = getattr(getattr(exc, "diag", None), "message_primary", None) or ""
    if state == _NO_COLUMN_STATE:
        found = _missing_column(primary, statement)
    else:
        match = _NOT_THERE.match(primary)
        found = None if match is None else f"{match.group(1)} does not exist"
    if found is None:  # another schema's table: the application's own error
        return None
    from sqla_queue.db.migrate import SCHEMA_REVISION  # imported only on this path

    message = (SchemaMissingError.__doc__ or "").strip().rstrip(".") + (
        "; the statement failed, so PostgreSQL has aborted this transaction and nothing in "
        "it can commit: roll it back, migrate, and run it again."
    )
    return SchemaMissingError(message, found=found, expected=SCHEMA_REVISION)


def _missing_column(primary: str, statement: str | None) -> str | None:
    """What an undefined_column error says is missing, if it is a column of our jobs table
    (one a newer revision added) in a statement on that table; None for any other (the
    error names no schema: an application's own `jobs` table has the same name)."""
    match = _NO_COLUMN.match(primary)
    if match is None or match.group("table") != Job.__tablename__:
        return None
    if statement is None or f"{SCHEMA}.{Job.__tablename__}" not in statement:
        return None
    column = match.group("column")
    if column not in Job.__table__.c:  # an application's own `jobs` table
        return None
    return f"its jobs table has no column {column}, which this job uses"


def explain(
    exc: BaseException, parameters: object, statement: str | None = None
) -> SqlaQueueError | None:
    """Our clear error for `statement` (its SQL text), which the database refused, if `exc`
    is one we know."""
    return (
        _unknown_queue(exc) or _refused_by_check(exc, parameters) or _schema_missing(exc, statement)
    )


def _explain_refusal(context: ExceptionContext) -> BaseException | None:
    error = explain(context.original_exception, context.parameters, context.statement)
    if error is not None:
        error.__cause__ = context.sqlalchemy_exception
    return error


def listen() -> None:
    """Install the `Engine` class's `handle_error` listener that turns these refusals into
    our errors (idempotent): called by the enqueue paths, never at import."""
    if not event.contains(Engine, "handle_error", _explain_refusal):
        with _LISTENING:
            if not event.contains(Engine, "handle_error", _explain_refusal):
                event.listen(Engine, "handle_error", _explain_refusal)


_LISTENING = threading.Lock()
