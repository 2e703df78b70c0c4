"""Statements of the rollup (`job_counts`): the workers' upsert and prune, and the series the
dashboard's charts and `stats` read. None of them reads the jobs table."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    DateTime,
    Delete,
    Float,
    Integer,
    Interval,
    Select,
    Table,
    Text,
    bindparam,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import Insert, insert

from sqla_queue.db.models import JobCount
from sqla_queue.db.queries.common import unnested

job_counts = cast(Table, JobCount.__table__)

ROLLUP_KEEP = "1 day"
"""How long a row of `job_counts` is kept (an interval): the longest series it draws."""

COUNTED = ("succeeded", "failed", "retried", "run_seconds")
"""The columns the upsert adds to (the rest is the key)."""


def add_counts() -> Insert:
    """Add the parallel arrays `:minutes, :queues, :tasks, :succeeded, :failed, :retried,
    :run_seconds` to `job_counts`: a new key is inserted, an existing one has each count
    added to its own (so any number of workers write the same minute)."""
    rows = unnested(
        "c",
        ("minutes", "minute", DateTime(timezone=True)),
        ("queues", "queue", Text),
        ("tasks", "task", Text),
        ("succeeded", "succeeded", Integer),
        ("failed", "failed", Integer),
        ("retried", "retried", Integer),
        ("run_seconds", "run_seconds", Float),
    )
    statement = insert(job_counts).from_select(
        ["minute", "queue", "task", *COUNTED], select(*rows.c)
    )
    return statement.on_conflict_do_update(
        index_elements=["minute", "queue", "task"],
        set_={name: job_counts.c[name] + statement.excluded[name] for name in COUNTED},
    )


def prune_counts() -> Delete:
    """Delete the rows older than `ROLLUP_KEEP`."""
    keep = literal_column(f"interval '{ROLLUP_KEEP}'", Interval)
    return job_counts.delete().where(job_counts.c.minute < func.now() - keep)


def series(by_task: bool, one_queue: bool) -> Select[Any]:
    """(bucket, queue or task, succeeded, failed, retried, run_seconds) summed per
    `:step` (an interval) over the buckets from `:since` (a timestamptz, a bucket start),
    per queue, or per task of queue `:queue` with `by_task`; only `:queue`'s with
    `one_queue`. Buckets start at `:since` plus whole steps (`date_bin`)."""
    step = bindparam("step", type_=Interval)
    since = bindparam("since", type_=DateTime(timezone=True))
    bucket = func.date_bin(step, job_counts.c.minute, since).label("bucket")
    key = (job_counts.c.task if by_task else job_counts.c.queue).label("key")
    statement = (
        select(
            bucket,
            key,
            *(func.sum(job_counts.c[name]).label(name) for name in COUNTED),
        )
        .where(job_counts.c.minute >= since)
        .group_by(bucket, key)
    )
    if by_task or one_queue:
        statement = statement.where(job_counts.c.queue == bindparam("queue", type_=Text))
    return statement
