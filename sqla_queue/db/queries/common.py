"""What every statement module shares: the tables, the status literal, the batch arrays, the
constants and aliases the statements' text is built of.

The fencing condition: every statement that ends a claim matches the job's id,
the attempt number the claim returned, and `status = 'running'`. A worker whose
job was reaped (and perhaps claimed again) changes nothing when it wakes up late.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Float,
    Integer,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    column,
    func,
    literal_column,
    table,
)
from sqlalchemy.sql.elements import BindParameter, ColumnElement, Grouping
from sqlalchemy.sql.selectable import TableClause, TableValuedAlias

from sqla_queue.db.models import (
    ArchivedJob,
    HistoryJob,
    Job,
    JobStatus,
    Queue,
    QueueStart,
    WorkerRegistration,
)
from sqla_queue.job.states import FINISHED, sql_literal

jobs = cast(Table, Job.__table__)
queues = cast(Table, Queue.__table__)
archive = cast(Table, ArchivedJob.__table__)
"""The unpartitioned archive of releases before sqlaq_0030 (the keeper empties it)."""
history = cast(Table, HistoryJob.__table__)
"""The finished jobs kept by `keep` and `archive` queues, partitioned by finish time."""
workers = cast(Table, WorkerRegistration.__table__)
queue_starts = cast(Table, QueueStart.__table__)


def of_workflow(table: Any = jobs) -> list[ColumnElement[bool]]:
    """`workflow_id = :workflow_id` with the predicate of the partial index on `workflow_id`
    (`models.IN_WORKFLOW`) spelled out, so a generic plan can use that index too."""
    return [
        table.c.workflow_id == bindparam("workflow_id", type_=Text),
        table.c.workflow_id.is_not(None),
    ]


def claimed_columns(table: Any = jobs) -> tuple[Any, ...]:
    """The columns a claim returns (of `jobs`, or of an alias of it)."""
    return (
        table.c.id,
        table.c.task,
        table.c.args.cast(Text).label("args_json"),
        table.c.attempts,
        table.c.max_attempts,
        table.c.queue,
        table.c.status,
        table.c.tags,
        table.c.meta.cast(Text).label("meta_json"),
        table.c.about,
    )


CLAIMED_COLUMNS = claimed_columns()
"""The columns a claim returns: id, task, args_json, attempts, max_attempts, queue, status,
tags, meta_json, about (the row a job is about, which a row argument is checked against
before it is loaded: `sqla_queue.orm.row_args`; NULL, so nothing to send, for most jobs).

`args` and `meta` come back as JSON text, so the worker decodes each job on its own: one
row whose args cannot be decoded (nested too deep, an integer too long) fails alone, not
its batch. `JobContext(..., tags=row["tags"], meta=row["meta_json"])` decodes meta lazily.
"""

FINISHED_STATUSES = FINISHED
"""The finished statuses: `sqla_queue.job.states.FINISHED`."""


def status_is(status: JobStatus, table: Any = jobs) -> ColumnElement[bool]:
    """`status = 'queued'` with the status as a literal, never a bound parameter.

    The partial indexes are defined `WHERE status = '...'`: a generic plan of a prepared
    statement with `status = $1` could not prove the predicate and would scan the table.
    The value comes from our enum, never from input.
    """
    condition: ColumnElement[bool] = table.c.status == literal_column(sql_literal(status), Text)
    return condition


def cancelled_held(table: Any = jobs) -> ColumnElement[bool]:
    """A job cancelled while its handler ran, whose handler has not returned yet (as its
    worker said): it still takes its queue's slot (`claim_slots` counts it while its lease
    lasts), so no admin command may make it claimable or delete it until then.
    `ix_jobs_cancelled_held` holds these rows."""
    return and_(status_is(JobStatus.cancelled, table), table.c.lease_expires_at.is_not(None))


def seconds_since(moment: Any) -> Any:
    """Seconds from `moment` to now (the transaction's start), as a number."""
    return func.extract("epoch", func.now() - moment)


def catalog_view(name: str, *columns: str) -> TableClause:
    """The PostgreSQL catalog `pg_catalog.<name>` as a lightweight table of the columns we
    read (each module names only those it reads)."""
    return table(name, *(column(c) for c in columns), schema="pg_catalog")


def job_ids_param(*, optional: bool = False) -> BindParameter[Any]:
    """`:job_ids`, the bigint[] of job ids a batch statement names; with `optional` it
    defaults to NULL (a statement that may run without a batch)."""
    if optional:
        return bindparam("job_ids", None, type_=ARRAY(BigInteger))
    return bindparam("job_ids", type_=ARRAY(BigInteger))


def queue_names_param() -> BindParameter[Any]:
    """`:queues`, the text[] of queue names a statement is limited to."""
    return bindparam("queues", type_=ARRAY(Text))


def seconds_interval(seconds: Any) -> Any:
    """`make_interval(secs => seconds)`: a number of seconds (a column, an expression, a
    bound parameter) as an interval, to add to or subtract from a timestamp."""
    return func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def literal_text(value: str) -> Any:
    """A constant of our own as an SQL literal, not a bound parameter: hot statements bind
    only what changes (fewer parameters to convert on every execution)."""
    return literal_column("'" + value.replace("'", "''") + "'", Text)


ZERO: Any = literal_column("0", Integer)
"""The constant 0 as SQL text, not a bound parameter (a claim's EXPLAIN names every one)."""
ONE: Any = literal_column("1", Integer)
"""The constant 1 as SQL text (`SELECT 1`, `LIMIT 1`), not a bound parameter."""


def jobs_alias(name: str) -> Any:
    """The jobs table under a one-letter name, for statements whose text must stay short."""
    return jobs.alias(name)


ONE_SECOND: ColumnElement[Any] = literal_column("interval '1 second'")
"""The interval of one second as SQL text, not a bound parameter."""


def seconds_param(name: str, *, optional: bool = False) -> Any:
    """`make_interval(secs => :name)`, for a bound number of seconds; with `optional` the
    parameter defaults to NULL, and so does the interval."""
    if optional:
        return seconds_interval(bindparam(name, None, type_=Float))
    return seconds_interval(bindparam(name, type_=Float))


def unnested(alias: str, *arrays: tuple[str, str, Any]) -> TableValuedAlias:
    """`unnest(:param, ...) AS alias(column, ...)`: one row per place of the parallel arrays,
    each given as (parameter, column, element type), so a batch of any size is one
    statement."""
    params = [bindparam(param, type_=ARRAY(type_)) for param, _, type_ in arrays]
    names = [name for _, name, _ in arrays]
    return func.unnest(*params).table_valued(*names).render_derived(name=alias)


def claimed_batch(
    *extra: tuple[str, str, Any],
    optional: bool = False,
    defaulted: Sequence[tuple[str, str, Any]] = (),
) -> TableValuedAlias:
    """`unnest(:job_ids, :job_attempts, ...) AS f(id, attempt, ...)`: one row per claimed job.

    `extra` adds (parameter, column, element type) triples of further parallel arrays;
    with `optional` they default to NULL (unnest reads a NULL array as NULLs), as those of
    `defaulted` always do.
    """
    arrays = [
        job_ids_param(),
        bindparam("job_attempts", type_=ARRAY(Integer)),
        *(
            bindparam(param, None, type_=ARRAY(type_))
            if optional
            else bindparam(param, type_=ARRAY(type_))
            for param, _, type_ in extra
        ),
        *(bindparam(param, None, type_=ARRAY(type_)) for param, _, type_ in defaulted),
    ]
    names = ["id", "attempt", *(name for _, name, _ in (*extra, *defaulted))]
    return func.unnest(*arrays).table_valued(*names).render_derived(name="f")


def held_rows(table: Any = jobs) -> tuple[Any, ...]:
    """The rows of `table` that `:job_ids` names and still holds at the attempt given at the
    same place in `:job_attempts`: `fenced_rows` without a join, for a statement that needs no
    other value per job. A generic plan (psycopg prepares a statement after five runs) of a
    join with `unnest` rescans the function for each running row: 50 x 50 rows per batch."""
    ids = job_ids_param()
    attempts = bindparam("job_attempts", type_=ARRAY(Integer))
    return (
        table.c.id == any_(ids),
        table.c.attempts == Grouping(attempts)[func.array_position(ids, table.c.id)],
        status_is(JobStatus.running, table),
    )


def fenced_rows(batch: TableValuedAlias, table: Any = jobs) -> tuple[Any, ...]:
    """The rows of `table` (jobs, or an alias) that `batch` names and still holds."""
    return (
        table.c.id == batch.c.id,
        table.c.attempts == batch.c.attempt,
        status_is(JobStatus.running, table),
    )
