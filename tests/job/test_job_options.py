"""One options type (`sqla_queue.JobOptions`): every enqueue path builds it, merges a
task's defaults under it the same way, and refuses a bad option with the same message."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from helpers.enqueue_paths import EVERY_PATH, PATHS
from helpers.support import jobs_by_id
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    Job,
    JobOptions,
    NewJob,
    Queue,
    Registry,
    Unique,
    enqueue,
    enqueue_many,
    set_default_registry,
)
from sqla_queue.job.options import OPTION_NAMES, JobOptionFields

NAIVE = dt.datetime(2030, 1, 1)
AWARE = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
PREFIX = "Job for task 't' is not valid: "

BAD_OPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "priority below 0": (
        {"priority": -1},
        "priority must be between 0 (first) and 32767, got -1",
    ),
    "priority not an int": ({"priority": "high"}, "priority must be an int, got 'high'"),
    "max_attempts 0": (
        {"max_attempts": 0},
        "max_attempts must be a whole number from 1 to 1000000, got 0",
    ),
    "naive run_at": (
        {"run_at": NAIVE},
        "run_at has no time zone; pass an aware datetime such as "
        "datetime.now(timezone.utc) + timedelta(minutes=5), or use delay=",
    ),
    "negative delay": (
        {"delay": -5},
        "delay must be a number of seconds from 0 to 3155760000 s (100 years), got -5",
    ),
    "run_at and delay": ({"run_at": AWARE, "delay": 5}, "pass run_at or delay, not both"),
    "tags a str": (
        {"tags": "billing"},
        "tags must be a list of str (tags=['billing']), got 'billing'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_every_path_refuses_a_bad_option_with_the_same_message(engine: Engine, case: str) -> None:
    options, detail = BAD_OPTIONS[case]
    messages = {}
    for path, write in EVERY_PATH.items():
        with pytest.raises(InvalidJobError) as raised:
            write(engine, {"task": "t", **options})
        messages[path] = str(raised.value)
    assert messages == dict.fromkeys(EVERY_PATH, PREFIX + detail)
    assert jobs_by_id(engine) == {}


def test_every_path_writes_the_same_job_for_the_same_options(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        session.add(Queue(name="emails"))
    row = {"task": "t", "queue": "emails", "priority": 7, "max_attempts": 3, "tags": ["a"]}
    for write in EVERY_PATH.values():
        write(engine, {**row, "meta": {"trace": "x"}})
    jobs = jobs_by_id(engine).values()
    assert {
        (j.queue, j.priority, j.max_attempts, tuple(j.tags), j.meta["trace"]) for j in jobs
    } == {("emails", 7, 3, ("a",), "x")}


def test_options_and_keywords_are_one_spelling(engine: Engine) -> None:
    options = JobOptions(priority=4, tags=["x"], meta={"k": 1})
    with Session(engine) as session, session.begin():
        by_options = enqueue(session, "t", options=options, flush=True)
        by_keywords = enqueue(session, "t", priority=4, tags=["x"], meta={"k": 1}, flush=True)
        in_a_job = Job(task="t", options=options)
        session.add(in_a_job)
        (by_row,) = enqueue_many(session, [{"task": "t", "options": options}])
        session.flush()
        ids = {by_options.id, by_keywords.id, in_a_job.id, by_row}
    rows = jobs_by_id(engine)
    fields = {(j.priority, tuple(j.tags), j.meta["k"]) for j in rows.values()}
    assert fields == {(4, ("x",), 1)}
    assert len(rows) == 4
    assert ids == set(rows)


def test_an_option_given_twice_or_unknown_is_refused_by_name(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match="got priority both in options= and as a keyword"):
            enqueue(session, "t", options=JobOptions(priority=1), priority=2)
        with pytest.raises(InvalidJobError, match=r"unknown option\(s\) prority; the options are"):
            enqueue(session, "t", prority=2)  # type: ignore[call-overload]
        with pytest.raises(InvalidJobError, match=r"options must be a sqla_queue\.JobOptions"):
            enqueue(session, "t", options={"priority": 1})  # type: ignore[call-overload]
        with pytest.raises(InvalidJobError, match="unknown keys"):
            enqueue_many(session, [{"task": "t", "prority": 2}])
    assert jobs_by_id(engine) == {}


def test_a_tasks_defaults_give_way_to_the_calls_options_on_every_path(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        session.add_all([Queue(name="q"), Queue(name="other")])
    registry = Registry()
    task = registry.task(name="t", queue="q", priority=5, tags=["d"], max_attempts=2)(lambda: None)
    assert task.options == JobOptions(queue="q", priority=5, max_attempts=2, tags=["d"])
    assert (task.queue, task.priority, task.max_attempts, task.unique) == ("q", 5, 2, None)
    set_default_registry(registry)
    try:
        with Session(engine) as session, session.begin():
            by_task = task.enqueue(session, priority=1, flush=True).id
            for write in PATHS.values():
                write(session, {"task": "t", "queue": "other"})
    finally:
        set_default_registry(None)
    jobs = jobs_by_id(engine)
    assert (jobs[by_task].queue, jobs[by_task].priority) == ("q", 1)
    others = [j for job_id, j in jobs.items() if job_id != by_task]
    assert {(j.queue, j.priority, j.max_attempts, tuple(j.tags)) for j in others} == {
        ("other", 5, 2, ("d",))
    }


def test_a_task_with_a_default_delay_schedules_its_jobs_later(engine: Engine) -> None:
    task = Registry().task(name="t", delay=dt.timedelta(hours=1))(lambda: None)
    with Session(engine) as session, session.begin():
        job_id = task.enqueue(session, flush=True).id
    stored = jobs_by_id(engine)[job_id]
    assert (stored.run_at - stored.created_at) == dt.timedelta(hours=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_at": AWARE}, "a task has no default run_at"),
        ({"priority": 40000}, "priority must be between 0 .first. and 32767, got 40000"),
        ({"max_attempts": 0}, "max_attempts must be a whole number from 1 to 1000000"),
        ({"delay": -1}, "delay must be a number of seconds from 0"),
        ({"tags": "x"}, "tags must be a list of str"),
        ({"unique": "yes"}, "unique= takes True, False or a sqla_queue.Unique"),
        ({"options": JobOptions(priority=1), "priority": 2}, "got priority both in options="),
    ],
)
def test_a_tasks_bad_default_is_refused_at_registration(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Registry().task(name="t", **options)(lambda: None)


def test_a_tasks_unique_default_is_resolved_once() -> None:
    task = Registry().task(name="t", unique=True)(lambda: None)
    assert task.unique == Unique()
    assert task.options.unique == Unique()


def test_a_job_takes_a_delay_as_enqueue_does(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        job = Job(task="t", delay=90)
        session.add(job)
        session.flush()
        job_id = job.id
    stored = jobs_by_id(engine)[job_id]
    assert (stored.run_at - stored.created_at) == dt.timedelta(seconds=90)


def test_merging_keeps_what_was_given_and_fills_the_rest() -> None:
    call = JobOptions(priority=0, unique=False)
    defaults = JobOptions(queue="q", priority=9, unique=Unique(), tags=["d"])
    assert call.over(defaults) == JobOptions(queue="q", priority=0, unique=False, tags=["d"])
    assert call.given() == {"priority": 0, "unique": False}
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.queue = "x"  # type: ignore[misc]


def test_the_keyword_spelling_has_exactly_the_options_fields() -> None:
    def spelled(annotation: object) -> str:
        return getattr(annotation, "__forward_arg__", annotation)  # type: ignore[return-value]

    options = {f.name: spelled(f.type) for f in dataclasses.fields(JobOptions)}
    keywords = {name: spelled(t) for name, t in JobOptionFields.__annotations__.items()}
    assert keywords == options
    assert tuple(options) == OPTION_NAMES


def test_an_insert_hook_sees_every_option() -> None:
    hook_fields = {f.name for f in dataclasses.fields(NewJob)}
    # expires_in becomes expires_at when the job is prepared (one deadline for the hooks)
    assert hook_fields == {"task", "args", *OPTION_NAMES} - {"expires_in"}


def test_each_column_option_is_a_field_a_key_a_check_and_a_column_every_path_writes(
    engine: Engine,
) -> None:
    """`COLUMN_OPTIONS` is the one list the insert paths build from: each entry is an option
    with its keyword, a jobs column, in the COPY and staging columns and the INSERT's
    parameters, and written by the plain and the unique paths (ORM, INSERT, COPY, staged)."""
    from sqla_queue.db import queries
    from sqla_queue.db.queries.inserts import COPY_JOB_COLUMNS, CREATE_STAGED_JOBS
    from sqla_queue.job.validation import COLUMN_OPTIONS

    insert_parameters = queries.insert_jobs().compile().params
    for name in COLUMN_OPTIONS:
        assert name in OPTION_NAMES
        assert name in JobOptionFields.__annotations__
        assert name in Job.__table__.c
        assert name in COPY_JOB_COLUMNS
        assert f" {name} " in CREATE_STAGED_JOBS
        assert f"job_{name}" in insert_parameters

    given = {  # one of each
        "max_attempts": 3,
        "workflow_id": "wf-1",
        "about": "orders:42",
        "partition": "tenant-1",
        "sequence": "s-1",
        "expires_at": dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc),
    }
    assert given.keys() == COLUMN_OPTIONS.keys()
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {"n": -1}, unique=True, **given)  # unique: written at once
        enqueue_many(session, [{"task": "t", "args": {"n": n}, **given} for n in range(150)])
        enqueue_many(  # unique and over COPY_MIN_ROWS: COPY into the staging table
            session,
            [{"task": "u", "args": {"n": n}, "unique": True, **given} for n in range(150)],
        )
    jobs = jobs_by_id(engine).values()
    assert len(jobs) == 301
    assert {tuple(getattr(j, name) for name in given) for j in jobs} == {tuple(given.values())}
