"""Enqueue's statements: insert (plain, unique, with NOTIFY), and the COPY path's reserved ids
and staging table."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    DateTime,
    Insert,
    Integer,
    Interval,
    LargeBinary,
    Select,
    SmallInteger,
    Text,
    Update,
    any_,
    bindparam,
    cast,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB, REGCLASS, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_queue.db.models import (
    NOTIFY_CHANNEL,
    UNIQUE_PREDICATE,
    JobStatus,
)
from sqla_queue.db.queries.common import (
    jobs,
)
from sqla_queue.job.states import NOT_STARTED
from sqla_queue.job.validation import COLUMN_OPTIONS

# -- enqueue ---------------------------------------------------------------------------------


def _inserted_values(options: Collection[str] = COLUMN_OPTIONS) -> dict[str, Any]:
    """The columns an enqueue writes, each from its `job_*` parameter; of the column
    options (`COLUMN_OPTIONS`), only `options`: a column no job of the statement uses is
    not named, so head enqueues into a schema older than that column (issue 35)."""
    run_at = func.coalesce(
        bindparam("job_run_at", type_=DateTime(timezone=True)),
        func.now() + func.coalesce(bindparam("job_delay", type_=Interval), text("'0'::interval")),
    )
    return {
        "task": bindparam("job_task", type_=Text),
        # JSON text, cast by the server: the args are serialised once, by validation.
        "args": cast(bindparam("job_args_json", type_=Text), JSONB),
        "queue": bindparam("job_queue", type_=Text),
        "priority": bindparam("job_priority", type_=SmallInteger),
        "run_at": run_at,
        **{name: bindparam(f"job_{name}", type_=jobs.c[name].type) for name in options},
        "tags": bindparam("job_tags", type_=ARRAY(Text)),
        "meta": cast(bindparam("job_meta_json", type_=Text), JSONB),
    }


def insert_jobs(options: Collection[str] = COLUMN_OPTIONS) -> Insert:
    """Insert jobs, for executemany; returns ids in parameter order.

    Parameters per row: `job_task`, `job_args_json` (JSON text), `job_queue`, `job_priority`,
    `job_run_at` (or NULL), `job_delay` (an interval, or NULL), `job_<name>` of each column
    option of `options` (of `COLUMN_OPTIONS`: `job_max_attempts`, ...), `job_tags` (a list),
    `job_meta_json` (JSON text). A NULL `job_run_at` means now plus the delay, by the
    database clock.
    """
    values = _inserted_values(options)
    return insert(jobs).values(**values).returning(jobs.c.id, sort_by_parameter_order=True)


def insert_job_and_notify(options: Collection[str] = COLUMN_OPTIONS) -> Select[Any]:
    """Insert one job and NOTIFY its queue in the same statement (one round trip, for
    `enqueue(connection, ...)`); returns its id. Parameters: those of `insert_jobs`.

    PostgreSQL folds identical notifications of one transaction into one and delivers
    them at commit, so a transaction of many enqueues still wakes each queue's workers once.
    """
    return _notified(_inserted_values(options))


def insert_plain_job_and_notify() -> Select[Any]:
    """`insert_job_and_notify` of a job without run_at, delay, column options, tags or meta:
    only its task, args, queue and priority are sent, the rest are the columns' defaults
    (5 parameters fewer to bind, send and evaluate)."""
    values = _inserted_values(())
    return _notified({name: values[name] for name in ("task", "args", "queue", "priority")})


def _notified(values: dict[str, Any]) -> Select[Any]:
    inserted = insert(jobs).values(**values).returning(jobs.c.id, jobs.c.queue)
    written = inserted.cte("written")
    return select(written.c.id, func.pg_notify(NOTIFY_CHANNEL, written.c.queue))


def insert_unique_jobs(with_ids: bool, options: Collection[str] = COLUMN_OPTIONS) -> Insert:
    """Insert unique jobs, skipping each whose key a blocking row holds; returns the ids
    written (a skipped row returns none).

    Parameters: those of `insert_jobs`, `job_unique_key`, `job_unique_states`, and with
    `with_ids` the `job_id` reserved for each row (so a batch's skipped rows are known by
    the ids missing from the result). `ON CONFLICT DO NOTHING` without a target: the unique
    partial index is the only one a fresh id can meet, and it waits for (never locks) a
    conflicting row of an open transaction.
    """
    values = _inserted_values(options)
    values["unique_key"] = bindparam("job_unique_key", type_=LargeBinary)
    values["unique_states"] = bindparam("job_unique_states", type_=SmallInteger)
    if with_ids:
        values["id"] = bindparam("job_id", type_=BigInteger)
    return pg_insert(jobs).values(**values).on_conflict_do_nothing().returning(jobs.c.id)


def unique_holders() -> Select[Any]:
    """(unique_key, id) of the rows that now block `:keys`, by the unique index."""
    return select(jobs.c.unique_key, jobs.c.id).where(
        jobs.c.unique_key == any_(bindparam("keys", type_=ARRAY(LargeBinary))),
        text(UNIQUE_PREDICATE),
    )


def replace_unique_holder(keep_run_at: bool, wait: bool = True) -> Update:
    """Debounce and throttle (`Unique(on_conflict=...)`): give job `:holder`, which blocks
    key `:job_unique_key`, the new `job_args_json`, and unless `keep_run_at` the new run_at
    (`job_run_at`, or now plus `job_delay`), if it has not started: queued or waiting.
    Returns its id, or nothing when it had started, finished or lost the key meanwhile.

    Without `wait` a row another transaction has locked (a worker's claim of it, another
    replacing enqueue) is left alone, and nothing is returned: then run it with `wait`, in
    a savepoint (an UPDATE that waited and found the row started keeps its lock)."""
    inserted = _inserted_values()
    # new args about another row (a row argument, about=) make the job about that row
    values: dict[str, Any] = {
        "args": inserted["args"],
        "about": func.coalesce(inserted["about"], jobs.c.about),
    }
    if not keep_run_at:
        values["run_at"] = inserted["run_at"]
    h = jobs.alias("h")
    fenced = (
        h.c.id == bindparam("holder", type_=BigInteger),
        h.c.unique_key == bindparam("job_unique_key", type_=LargeBinary),
        h.c.status.in_(NOT_STARTED),
    )
    found = select(h.c.id).where(*fenced)
    if not wait:
        found = found.with_for_update(key_share=True, skip_locked=True)
    return (
        update(jobs)
        .where(
            jobs.c.id == found.scalar_subquery(),
            # checked again on the row as it is once a lock the UPDATE waited for is gone
            jobs.c.unique_key == bindparam("job_unique_key", type_=LargeBinary),
            jobs.c.status.in_(NOT_STARTED),
        )
        .values(**values)
        .returning(jobs.c.id)
    )


def release_running_holder() -> Update:
    """Debounce and throttle when the job holding key `:job_unique_key` already runs: job
    `:holder` lets the key go (its handler, args and fencing are untouched), so the new job
    is written after it. Returns its id, or nothing if it was not running with that key."""
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("holder", type_=BigInteger),
            jobs.c.unique_key == bindparam("job_unique_key", type_=LargeBinary),
            jobs.c.status == JobStatus.running.value,
        )
        .values(unique_key=None, unique_states=None)
        .returning(jobs.c.id)
    )


def may_reserve_job_ids() -> Select[Any]:
    """Whether this role may draw ids from the jobs id sequence (COPY needs it; INSERT not)."""
    sequence = func.pg_get_serial_sequence(jobs.fullname, jobs.c.id.name)
    return select(func.has_sequence_privilege(sequence, "USAGE"))


def _next_id() -> Any:
    """`nextval` of the jobs id sequence, looked up once per statement (an uncorrelated
    subquery): `pg_get_serial_sequence` per row made reserving 20,000 ids take 0.2-0.36 s,
    against 0.06 s with the sequence looked up once (measured)."""
    name = func.pg_get_serial_sequence(jobs.fullname, jobs.c.id.name)
    return func.nextval(select(cast(name, REGCLASS)).scalar_subquery())


def reserve_job_id_array() -> Select[Any, Any]:
    """`:count` fresh job ids as one array, in order, and the transaction's `now()` (COPY):
    one row to fetch instead of `:count`."""
    n = func.generate_series(1, bindparam("count", type_=Integer)).column_valued("n")
    return select(func.array_agg(aggregate_order_by(_next_id(), n)), func.now())


def reserve_job_ids() -> Select[Any]:
    """`:count` fresh job ids, in order, each with the transaction's `now()` (for COPY)."""
    series = func.generate_series(1, bindparam("count", type_=Integer))
    return select(_next_id(), func.now()).select_from(series)


COPY_JOB_COLUMNS = (
    "id",
    "task",
    "args",
    "queue",
    "priority",
    "run_at",
    *COLUMN_OPTIONS,
    "tags",
    "meta",
)


def copy_jobs(columns: Sequence[str] = COPY_JOB_COLUMNS) -> str:
    """Not expressible in Core: bulk enqueue's COPY of `columns` (of COPY_JOB_COLUMNS, in
    that order); the columns left out take their defaults."""
    return f"COPY {jobs.fullname} ({', '.join(columns)}) FROM STDIN"


COPY_JOBS = copy_jobs()
"""Bulk enqueue's COPY, rows in COPY_JOB_COLUMNS order."""

STAGED_JOBS = "sqla_queue_staged_jobs"
"""A temporary table of this session, emptied at each commit: unique rows COPYed for
`insert_staged_jobs` (COPY cannot skip a duplicate; an INSERT from the staging table can)."""
STAGED_JOB_COLUMNS = (*COPY_JOB_COLUMNS, "unique_key", "unique_states")
_PG = postgresql.dialect()  # type: ignore[no-untyped-call]  # untyped in SQLAlchemy
_STAGED_COLUMN_TYPES = ", ".join(
    f"{name} {jobs.c[name].type.compile(dialect=_PG)}" for name in STAGED_JOB_COLUMNS
)
"""The staging table's columns, typed as the jobs table's own."""
CREATE_STAGED_JOBS = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGED_JOBS} ({_STAGED_COLUMN_TYPES}) "
    "ON COMMIT DELETE ROWS"
)
"""Not expressible in Core: created once per session (IF NOT EXISTS), rows gone at commit."""
COPY_STAGED_JOBS = f"COPY {STAGED_JOBS} ({', '.join(STAGED_JOB_COLUMNS)}) FROM STDIN"


def insert_staged_jobs(options: Collection[str] = COLUMN_OPTIONS) -> str:
    """Not expressible in Core on a temporary table: the staged rows into jobs, duplicates
    skipped by the unique index; returns the ids written. Of the column options, only
    `options` are copied into jobs (the others are NULL in the staging table)."""
    staged = ", ".join(c for c in STAGED_JOB_COLUMNS if c not in COLUMN_OPTIONS or c in options)
    return (
        f"WITH staged AS (DELETE FROM {STAGED_JOBS} RETURNING {staged}) "
        f"INSERT INTO {jobs.fullname} ({staged}) SELECT {staged} FROM staged ORDER BY id "
        "ON CONFLICT DO NOTHING RETURNING id"
    )


def may_stage_jobs() -> Select[Any]:
    """Whether this role may draw job ids and create a temporary table (the staged COPY)."""
    sequence = func.pg_get_serial_sequence(jobs.fullname, jobs.c.id.name)
    return select(
        func.has_sequence_privilege(sequence, "USAGE")
        & func.has_database_privilege(func.current_database(), "TEMPORARY")
    )
