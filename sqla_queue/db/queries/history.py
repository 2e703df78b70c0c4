"""A job's error history in SQL: the entry of an attempt that ended in an error, appended
to `jobs.errors` (bounded) by the statement that retries or fails the job (`jobs`); what the
worker sends for it is `sqla_queue.job.history`'s."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, Text, case, func, literal_column
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.selectable import TableValuedAlias

from sqla_queue.db.queries.common import jobs, literal_text
from sqla_queue.job.history import MAX_ENTRIES

ERROR_ENTRY_ARRAYS = (
    ("job_error_classes", "error_class", Text),
    ("job_error_messages", "error_message", Text),
    ("job_error_tracebacks", "error_traceback", Text),
)
"""The parallel arrays of a failed attempt's history entry (optional: NULL class, no entry)."""


def ended_attempt_entry(table: Any, error_class: Any, message: Any, traceback: Any) -> Any:
    """The history entry of the attempt `table`'s row ends now (read before the UPDATE
    clears its claim: SET reads the old row)."""
    started = table.c.started_at if "started_at" in table.c else table.c.locked_at
    return func.jsonb_build_object(
        literal_text("attempt"),
        table.c.attempts,
        literal_text("worker"),
        table.c.locked_by,
        literal_text("started_at"),
        func.coalesce(started, table.c.locked_at),
        literal_text("finished_at"),
        func.now(),
        literal_text("class"),
        error_class,
        literal_text("message"),
        message,
        literal_text("traceback"),
        traceback,
    )


def appended_errors(entry: Any, table: Any = jobs) -> Any:
    """`table.errors` with `entry` appended, at most `MAX_ENTRIES`: the first entry and the
    latest ones (a jsonb path keeps them; it reads the old array once more, on errors only)."""
    old = table.c.errors
    full = func.coalesce(func.jsonb_array_length(old), 0) >= literal_column(
        str(MAX_ENTRIES), Integer
    )
    kept = func.jsonb_path_query_array(
        old, literal_column(f"'$[0, last - {MAX_ENTRIES - 3} to last]'")
    )
    added = func.jsonb_build_array(entry)
    return case(
        (full, kept.op("||", return_type=JSONB)(added)),
        else_=func.coalesce(old, literal_column("'[]'::jsonb")).op("||", return_type=JSONB)(added),
    )


def batch_errors(batch: TableValuedAlias, table: Any = jobs) -> Any:
    """`table.errors` with the entry the batch's history arrays give (none: unchanged)."""
    entry = ended_attempt_entry(
        table, batch.c.error_class, batch.c.error_message, batch.c.error_traceback
    )
    return case(
        (batch.c.error_class.is_(None), table.c.errors), else_=appended_errors(entry, table)
    )


__all__ = ["ERROR_ENTRY_ARRAYS"]
