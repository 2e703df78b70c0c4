"""The row a job is about (`enqueue(..., about=order)`): a mapped instance as the text the
jobs table keeps, `<table>:<primary key>`.

    about_text(order)        -> "orders:42"
    about_text(line)         -> 'order_lines:[42, 1]'     (a composite key: a JSON array)
    about_text(account)      -> "billing.accounts:7"      (a table in another schema)

The table is the mapper's base table (joined inheritance: the base's, so a subclass and its
base name the same row), and a single-column key is written as its text. The text is kept
as given when `about=` is already a string (`sqla-queue enqueue --about orders:42`).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.exc import NoInspectionAvailable
from sqlalchemy.orm import Mapper

from sqla_queue.job.validation import ErrorFactory


def mapper_table(mapper: Mapper[Any]) -> str:
    """The name jobs use for `mapper`'s rows: its base mapper's table, schema-qualified when
    it has a schema."""
    table: Any = mapper.base_mapper.local_table
    return str(table.fullname)


def key_text(values: tuple[Any, ...] | list[Any]) -> str:
    """A primary key's values as text: the one value's, or a JSON array of several."""
    if len(values) == 1:
        return str(values[0])
    return json.dumps(list(values), ensure_ascii=False, default=str)  # as jsonb's text


def about_text(value: object, error: ErrorFactory) -> str:
    """`about=`'s value as the jobs table keeps it: a mapped instance's `<table>:<key>`, or
    a string as it is (checked by `sqla_queue.job.validation.check_about`). An instance
    without its primary key yet (pending, not flushed) is refused: the error says to flush
    first."""
    if isinstance(value, str):
        return value
    try:
        state: Any = inspect(value)
        mapper = state.mapper
    except (NoInspectionAvailable, AttributeError):
        raise error(
            f"about= takes a mapped instance (an ORM object with a primary key) or its "
            f"'<table>:<key>' text, got {value!r:.80}"
        ) from None
    key = mapper.primary_key_from_instance(value)
    session = state.session
    if any(part is None for part in key) and state.pending and session is not None:
        try:  # as autoflush would: the row gets its key in the caller's transaction
            session.flush()
        except Exception as exc:  # an AsyncSession's, outside its greenlet: flush first
            if "greenlet" not in str(exc):
                raise
        key = mapper.primary_key_from_instance(value)
    if any(part is None for part in key):
        raise error(
            f"about={value!r:.60} has no primary key yet: add it to the session and flush "
            "first (session.flush(); with an AsyncSession, await session.flush()) so the "
            "job can name its row"
        )
    return f"{mapper_table(mapper)}:{key_text(key)}"
