"""Database triggers for your own tables, for the changes that bypass the ORM's events
(`session.execute(delete(Order))`, bulk updates, SQL from elsewhere): generated SQL for an
Alembic migration of your application.

    from sqla_queue.orm.triggers import cancel_on_delete, enqueue_on_update

    def upgrade() -> None:
        op.execute(cancel_on_delete("orders", ["id"]).create)
        op.execute(enqueue_on_update("orders", ["id"], "status", "paid", "shop.receipt").create)

    def downgrade() -> None:
        op.execute(enqueue_on_update("orders", ["id"], "status", "paid", "shop.receipt").drop)
        op.execute(cancel_on_delete("orders", ["id"]).drop)

`cancel_on_delete`: deleting a row, by any statement, cancels its queued and waiting jobs
(those enqueued `about=` it), as `sqla_queue.orm.HasJobs` does for ORM deletes (both may
be on: the second finds nothing left to cancel). `enqueue_on_update`: an UPDATE that
changes `column` to `value` enqueues one job about the row, args its primary key, and wakes
the queue's workers. It counts per statement, not per transaction as `Registry.on_change`
does: use one or the other for a rule, not both (both would enqueue two jobs).

Names are quoted (a name with `$` is refused: it could end the function's body); each
rule's trigger and function names carry a hash of the rule, so rules never replace each
other; the queue row is created if missing (as enqueue does). The key columns' text must
match `about=`'s (`sqla_queue.orm`): one
column as its text, several as a JSON array.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.dialects import postgresql

from sqla_queue.db.models import DEFAULT_QUEUE, NOTIFY_CHANNEL, SCHEMA
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.states import NOT_STARTED, JobStatus
from sqla_queue.job.validation import validate_name

_QUOTE: Any = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class TriggerSql:
    """A trigger's `create` and `drop` SQL (each one string of statements, for op.execute)."""

    create: str
    drop: str


def _name(table: str) -> str:
    """`table` ("orders" or "shop.orders") quoted for SQL."""
    return ".".join(_QUOTE.quote(part) for part in table.split("."))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_all(table: str, key_columns: Sequence[str], *more: str) -> None:
    _checked("table", table)
    if isinstance(key_columns, str) or not key_columns:
        raise ConfigurationError(
            detail=f"key_columns is a list of the table's primary key columns, got {key_columns!r}"
        )
    for column in key_columns:
        _checked("a key column", column)
    for value in more:
        _checked("a name or value", value)


def _about(table: str, key_columns: Sequence[str], row: str) -> str:
    """The SQL expression of a row's `about` text (`row` is OLD or NEW)."""
    columns = [f"{row}.{_QUOTE.quote(c)}" for c in key_columns]
    key = (
        f"{columns[0]}::text"
        if len(columns) == 1
        else f"jsonb_build_array({', '.join(columns)})::text"
    )
    return f"{_literal(table + ':')} || {key}"


MAX_IDENTIFIER = 63
"""PostgreSQL's longest identifier, in bytes (a longer one is cut, and two could meet)."""


def _checked(what: str, value: str) -> str:
    """Refuse a name that could end the function's dollar-quoted body or is not text."""
    if not isinstance(value, str) or not value or "$" in value or not value.isprintable():
        raise ConfigurationError(
            detail=f"{what} must be printable text without '$', got {value!r:.80}"
        )
    return value


def _names(table: str, purpose: str, *identity: str) -> tuple[str, str]:
    """The trigger's and its function's names (quoted; the function in the table's schema):
    `sqla_queue_<purpose>_<table>`, with a short hash of `identity` (the rule) so two rules
    on one table never share a name; refused if over 63 bytes."""
    schema, _, name = table.rpartition(".")
    digest = hashlib.sha256("\x00".join(identity).encode()).hexdigest()[:8]
    base = f"sqla_queue_{purpose}_{name}" + (f"_{digest}" if identity else "")
    if len(base.encode()) > MAX_IDENTIFIER:
        raise ConfigurationError(
            detail=f"the trigger name {base!r} is over {MAX_IDENTIFIER} bytes (PostgreSQL "
            "would cut it): shorten the table name, or write the trigger by hand"
        )
    function = _QUOTE.quote(base)
    return _QUOTE.quote(base), f"{_QUOTE.quote(schema)}.{function}" if schema else function


def cancel_on_delete(table: str, key_columns: Sequence[str]) -> TriggerSql:
    """A row trigger on `table` (AFTER DELETE) that cancels the queued and waiting jobs
    about the deleted row, naming it in their error."""
    _check_all(table, key_columns)
    trigger, function = _names(table, "cancel_jobs")
    statuses = ", ".join(_literal(status) for status in NOT_STARTED)
    create = f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $sqlaq$
DECLARE
    row_about text := {_about(table, key_columns, "OLD")};
BEGIN
    UPDATE {SCHEMA}.jobs
       SET status = {_literal(JobStatus.cancelled.value)}, finished_at = now(),
           last_error = 'cancelled: ' || row_about || ', the row it was about, was deleted'
     WHERE jobs.about = row_about AND jobs.status IN ({statuses});
    RETURN NULL;
END
$sqlaq$;
CREATE TRIGGER {trigger} AFTER DELETE ON {_name(table)}
    FOR EACH ROW EXECUTE FUNCTION {function}();
"""
    drop = (
        f"DROP TRIGGER IF EXISTS {trigger} ON {_name(table)}; DROP FUNCTION IF EXISTS {function}();"
    )
    return TriggerSql(create, drop)


def enqueue_on_update(
    table: str,
    key_columns: Sequence[str],
    column: str,
    value: str,
    task: str,
    queue: str = DEFAULT_QUEUE,
) -> TriggerSql:
    """A row trigger on `table` (AFTER UPDATE OF `column`) that enqueues a job of `task`
    into `queue` about each row whose `column` changed to `value` (compared as text), with
    the row's primary key as args (`{"id": 42}`), and notifies the queue's workers."""
    _check_all(table, key_columns, column, value, task, queue)
    validate_name("task name", task)
    validate_name("queue name", queue)
    trigger, function = _names(table, "enqueue", column, value, task, queue)
    col = _QUOTE.quote(column)
    args = ", ".join(f"{_literal(c)}, NEW.{_QUOTE.quote(c)}" for c in key_columns)
    create = f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $sqlaq$
BEGIN
    INSERT INTO {SCHEMA}.queues (name) VALUES ({_literal(queue)}) ON CONFLICT DO NOTHING;
    INSERT INTO {SCHEMA}.jobs (task, args, queue, about)
    VALUES ({_literal(task)}, jsonb_build_object({args}), {_literal(queue)},
            {_about(table, key_columns, "NEW")});
    PERFORM pg_notify({_literal(NOTIFY_CHANNEL)}, {_literal(queue)});
    RETURN NULL;
END
$sqlaq$;
CREATE TRIGGER {trigger} AFTER UPDATE OF {col} ON {_name(table)}
    FOR EACH ROW
    WHEN (NEW.{col}::text = {_literal(value)} AND OLD.{col} IS DISTINCT FROM NEW.{col})
    EXECUTE FUNCTION {function}();
"""
    drop = (
        f"DROP TRIGGER IF EXISTS {trigger} ON {_name(table)}; DROP FUNCTION IF EXISTS {function}();"
    )
    return TriggerSql(create, drop)


__all__ = ["TriggerSql", "cancel_on_delete", "enqueue_on_update"]
