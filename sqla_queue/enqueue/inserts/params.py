"""A prepared job (`NewJob`) as the `job_*` parameters of the insert statements, validated."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from sqla_queue.db.models import (
    Job,
    validate_job,
    validate_tags_and_meta,
)
from sqla_queue.enqueue.inserts.links import resolve
from sqla_queue.job.new_job import NewJob
from sqla_queue.job.options import OPTION_NAMES, column_values, delay_interval
from sqla_queue.job.validation import COLUMN_OPTIONS, invalid_job

JOB_BIND = {"mapper": Job}
"""Route our statements to the Job mapper's bind, for sessions set up with `binds=`."""
JOB_FIELDS = ("task", "args", *(n for n in OPTION_NAMES if n in Job.__table__.c and n != "run_at"))
"""A prepared job's fields that are `Job` columns as they are (run_at is computed from a
delay): what `enqueue` gives its `Job`, and what a flush copies back from the hooks."""
# Read from the table, whose columns are Job's attributes one for one: asking the mapper
# would configure every mapper at import (the application's too), before any is used.
SERVER_SET = [c.key for c in Job.__table__.columns if c.key not in {"id", *JOB_FIELDS}]
"""Columns of a job we wrote ourselves that the server set: expired, loaded on first use."""


_COLUMN_PARAMS = tuple((name, f"job_{name}") for name in COLUMN_OPTIONS)
"""Each column option's name and its parameter's (named once, not per row)."""

S = TypeVar("S")


class ByOptionsUsed(Generic[S]):
    """An insert statement per set of column options its rows use, each built once.

    A column no row uses is not named, so head enqueues into a database that an older
    release migrated, whose jobs table lacks a newer column (`expires_at`, revision
    sqlaq_0020), as long as no job uses it (issue 35); one that does is refused by the
    database and explained in one line (`refusals`). The set is read from the parameters
    already made: no round trip, and no statement built per enqueue.
    """

    def __init__(self, build: Callable[[tuple[str, ...]], S]) -> None:
        self._build = build
        self._built: dict[tuple[str, ...], S] = {}

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> S:
        if len(rows) == 1:
            row = rows[0]
            used = tuple(name for name, key in _COLUMN_PARAMS if row[key] is not None)
        else:
            used = tuple(
                name for name, key in _COLUMN_PARAMS if any(r[key] is not None for r in rows)
            )
        built = self._built.get(used)
        if built is None:  # two threads may both build it: the same statement
            built = self._built[used] = self._build(used)
        return built


def row_params(new: NewJob) -> dict[str, Any]:
    """A prepared job, validated, as the `job_*` parameters of the insert statements."""
    params = plain_params(
        new.task, new.args, new.queue, new.priority, new.run_at, new.delay, column_values(new)
    )
    if new.tags or new.meta or type(new.tags) is not list or type(new.meta) is not dict:
        params["job_tags"], params["job_meta_json"] = validate_tags_and_meta(
            new.task, new.tags, new.meta
        )
    unique = new.unique
    if unique is not None:
        params["job_unique_key"] = unique.key_for(new.task, new.queue, new.args, about=new.about)
        params["job_unique_states"] = unique.state_bits
        if unique.on_conflict != "keep":
            params[ON_CONFLICT] = unique.on_conflict
    if new.depends_on is not None:
        params[DEPENDS] = resolve(new.task, new.depends_on, new.on_failure)
    return params


ON_CONFLICT = "_on_conflict"
"""The key of a unique job's `Unique.on_conflict` in its parameters, when not `keep`
(popped by `insert_unique` before they are sent)."""
DEPENDS = "_depends"
"""The key of a job's resolved `depends_on` in its parameters (popped before they are sent)."""


def plain_params(
    task: object,
    args: object,
    queue: object,
    priority: object,
    run_at: object,
    delay: object,
    columns: Mapping[str, Any],
    names_checked: bool = False,
) -> dict[str, Any]:
    """A job without tags, meta or `unique`, validated, as `job_*` parameters; `columns`
    holds the values of `COLUMN_OPTIONS` by name (a missing one is not given)."""
    interval = None if delay is None else delay_interval(run_at, delay, invalid_job(task))
    params = {
        "job_task": task,
        "job_args_json": validate_job(task, args, queue, priority, run_at, columns, names_checked),
        "job_queue": queue,
        "job_priority": priority,
        "job_run_at": run_at,
        "job_delay": interval,
        "job_tags": [],
        "job_meta_json": "{}",
        "job_unique_key": None,
        "job_unique_states": None,
    }
    for name, key in _COLUMN_PARAMS:
        params[key] = columns.get(name)
    return params
