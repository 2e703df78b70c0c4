"""`enqueue_many`'s COPY writer: rows as lines of COPY's text format, ids reserved first."""

from __future__ import annotations

import datetime as dt
import sys
from typing import TYPE_CHECKING, Any, TypeGuard

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from sqla_queue.db import queries
from sqla_queue.enqueue.inserts.params import ByOptionsUsed
from sqla_queue.enqueue.inserts.refusals import explain
from sqla_queue.errors import SqlaQueueError
from sqla_queue.job.validation import COLUMN_OPTIONS

if TYPE_CHECKING:
    import psycopg

_INSERT_JOBS = ByOptionsUsed(queries.insert_jobs)
_RESERVE_JOB_ID_ARRAY = queries.reserve_job_id_array()
_MAY_RESERVE_IDS = queries.may_reserve_job_ids()
COPY_MIN_ROWS = 100
"""Rows from which enqueue_many uses COPY: below, one INSERT round trip beats COPY's two."""


def is_psycopg(driver: object) -> TypeGuard[psycopg.Connection[Any]]:
    """Whether `driver` is a psycopg 3 connection, which COPY is sent through. psycopg is
    not imported to ask: a connection of it exists only once it is."""
    module = sys.modules.get("psycopg")
    return module is not None and isinstance(driver, module.Connection)


def write_plain(connection: Connection, params: list[dict[str, Any]]) -> list[int]:
    """Rows that are not unique: COPY from COPY_MIN_ROWS on (psycopg), else INSERT."""
    driver = may_copy(connection, len(params))
    if driver is not None:
        return copy_rows(connection, driver, params)
    return list(connection.execute(_INSERT_JOBS(params), params).scalars())


_COPY_SPECIAL = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: str) -> str:
    """`value` as a field of COPY's text format (backslash, tab, newline, CR escaped)."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_SPECIAL)
    return value


def _copy_array(values: list[str]) -> str:
    """A text[] literal of `values`, as a field of COPY's text format."""
    quoted = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return copy_text("{" + ",".join(f'"{v}"' for v in quoted) + "}")


_NULL = "\\N"
_BYTEA_PREFIX = "\\\\x"
"""bytea's hex form (`\\x...`) with its backslash escaped for COPY's text format."""
_COPY_CHUNK = 2000
"""Rows per write to the COPY stream."""


def _any_given(params: list[dict[str, Any]], key: str) -> bool:
    return any(p[key] is not None for p in params)


def _copy_value(value: object) -> str:
    """A column option's value as a field of COPY's text format (NULL for None)."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return copy_text(str(value))


def _run_at_text(p: dict[str, Any], now: dt.datetime, now_text: str) -> str:
    """A row's run_at for COPY: given, or the transaction's now() plus its delay."""
    run_at, delay = p["job_run_at"], p["job_delay"]
    if run_at is not None:
        return str(run_at.isoformat())
    if not delay:
        return now_text
    return str((now + delay).isoformat())  # a delay is at most 100 years: no overflow


_PLAIN_COLUMNS = queries.copy_jobs(["id", "task", "args", "queue", "priority"])


def may_copy(connection: Connection, rows: int) -> psycopg.Connection[Any] | None:
    """The psycopg connection under `connection` when `rows` rows go by COPY (as
    `write_plain` decides), else None."""
    driver = connection.connection.driver_connection
    if (
        rows >= COPY_MIN_ROWS
        and is_psycopg(driver)
        and connection.execute(_MAY_RESERVE_IDS).scalar()  # a role may INSERT without it
    ):
        return driver
    return None


def copy_plain_lines(
    connection: Connection, driver: psycopg.Connection[Any], lines: list[str]
) -> list[int]:
    """COPY plain jobs given as lines of COPY's text format without their id (task, args,
    queue, priority, each escaped already: `copy_text`), ids reserved from the id sequence;
    their ids, in order. Every other column takes its default, as in `copy_rows`."""
    import psycopg  # imported already: `driver` is one of its connections

    ids = connection.execute(_RESERVE_JOB_ID_ARRAY, {"count": len(lines)}).scalar_one()
    if len(ids) != len(lines):  # pragma: no cover - the server's own guarantee
        raise SqlaQueueError(f"reserved {len(ids)} job ids for {len(lines)} rows")
    try:
        with driver.cursor() as cursor, cursor.copy(_PLAIN_COLUMNS) as copy:
            for start in range(0, len(lines), _COPY_CHUNK):
                chunk = zip(
                    ids[start : start + _COPY_CHUNK],
                    lines[start : start + _COPY_CHUNK],
                    strict=True,
                )
                copy.write("".join([f"{job_id}\t{line}\n" for job_id, line in chunk]))
    except psycopg.Error as exc:
        wrapped = DBAPIError.instance(_PLAIN_COLUMNS, None, exc, psycopg.Error)
        explained = explain(exc, None, _PLAIN_COLUMNS)
        if explained is None:
            raise wrapped from exc
        raise explained from wrapped
    return ids  # type: ignore[no-any-return]  # int8[]: a list of int


def copy_rows(
    connection: Connection,
    driver: psycopg.Connection[Any],
    params: list[dict[str, Any]],
    staged: bool = False,
) -> list[int]:
    """COPY the rows in the session's transaction, with ids reserved from the id sequence
    (into the staging table, unique columns included, with `COPY_STAGED_JOBS`).

    Each row is written as one line of COPY's text format, built here from the JSON text
    validation made (serialised once): 3 to 4 times less Python per row than psycopg's
    `write_row` with its per-value dumpers (profiled, 20,000 rows). Into the jobs table,
    run_at, each column option (`COLUMN_OPTIONS`, e.g. max_attempts) and tags with meta are
    sent only if a row needs them (the columns' defaults are the same values): fewer columns
    for the server to parse, about a fifth faster for rows without them (measured, 20,000
    rows, no foreign key).
    """
    import psycopg  # imported already: `driver` is one of its connections

    if staged:
        statement = queries.COPY_STAGED_JOBS
        scheduled = tagged = True
        given = [f"job_{name}" for name in COLUMN_OPTIONS]
    else:
        scheduled = any(p["job_run_at"] is not None or p["job_delay"] for p in params)
        used = [n for n in COLUMN_OPTIONS if _any_given(params, f"job_{n}")]
        given = [f"job_{name}" for name in used]
        tagged = any(p["job_tags"] or p["job_meta_json"] != "{}" for p in params)
        columns = ["id", "task", "args", "queue", "priority"]
        columns += ["run_at"] * scheduled + used + ["tags", "meta"] * tagged
        statement = queries.copy_jobs(columns)
    ids, now = connection.execute(_RESERVE_JOB_ID_ARRAY, {"count": len(params)}).one()
    if len(ids) != len(params):  # pragma: no cover - the server's own guarantee
        raise SqlaQueueError(f"reserved {len(ids)} job ids for {len(params)} rows")
    now_text = now.isoformat()
    lines: list[str] = []
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for job_id, p in zip(ids, params, strict=True):
                fields = [
                    str(job_id),
                    copy_text(p["job_task"]),
                    copy_text(p["job_args_json"]),
                    copy_text(p["job_queue"]),
                    str(p["job_priority"]),
                ]
                if scheduled:  # now() is fixed for the transaction: the INSERT's run_at too
                    fields.append(_run_at_text(p, now, now_text))
                for key in given:
                    fields.append(_copy_value(p[key]))
                if tagged:
                    tags = p["job_tags"]
                    fields.append(_copy_array(tags) if tags else "{}")
                    fields.append(copy_text(p["job_meta_json"]))
                if staged:
                    key, states = p["job_unique_key"], p["job_unique_states"]
                    fields.append(_NULL if key is None else _BYTEA_PREFIX + key.hex())
                    fields.append(_NULL if states is None else str(states))
                line = "\t".join(fields)
                lines.append(line)
                if len(lines) >= _COPY_CHUNK:
                    copy.write("\n".join(lines) + "\n")
                    lines.clear()
            if lines:
                copy.write("\n".join(lines) + "\n")
    except psycopg.Error as exc:
        wrapped = DBAPIError.instance(statement, None, exc, psycopg.Error)
        explained = explain(exc, None, statement)
        if explained is None:
            raise wrapped from exc
        raise explained from wrapped
    return [int(i) for i in ids]
