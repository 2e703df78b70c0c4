"""What enqueue refuses (args that are not a dict, delays past 100 years, deep nesting, long
integers, args past the size limits), each clearly and alike on every enqueue path."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.enqueue_paths import PATHS
from helpers.support import jobs_by_id, nested
from sqlalchemy import Engine, create_engine, insert, select, text, update
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    Job,
    Queue,
    Registry,
    enqueue,
    enqueue_many,
    limits,
)
from sqla_queue.db import migrate
from sqla_queue.db.models import MAX_INT_DIGITS, validate_job
from sqla_queue.job import validation

# -- args of [], "", 0 ----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("args", [[], "", 0, [1, 2], False])
def test_args_that_are_not_a_dict_are_refused_on_every_path(
    engine: Engine, path: str, args: Any
) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match="args must be a dict of keyword arguments"):
            PATHS[path](session, {"task": "t", "args": args})
        session.rollback()
    assert jobs_by_id(engine) == {}


def test_missing_or_none_args_are_an_empty_dict_on_every_path(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        for write in PATHS.values():
            write(session, {"task": "t", "args": None})
            write(session, {"task": "t"})
    assert {json.dumps(j.args) for j in jobs_by_id(engine).values()} == {"{}"}


# -- a delay past 100 years (the longest duration sqla-queue takes) ----------------------------


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_delay_past_100_years_is_the_same_clear_error_on_every_path(
    engine: Engine, path: str
) -> None:
    with Session(engine) as session:
        session.execute(text("SELECT 1"))
        with pytest.raises(InvalidJobError) as raised:
            PATHS[path](session, {"task": "t", "delay": 10**12})
        assert str(raised.value) == (
            "Job for task 't' is not valid: delay must be a number of seconds from 0 to "
            "3155760000 s (100 years), got 1000000000000"
        )
        # Refused before anything was sent: the transaction goes on.
        PATHS[path](session, {"task": "t", "delay": 86400 * 365 * 100})
        session.commit()
    jobs = list(jobs_by_id(engine).values())
    assert jobs
    assert {(j.run_at - j.created_at).days // 365 for j in jobs} == {100}


# -- args a worker could not decode -----------------------------------------------------------


def test_args_nested_deeper_than_python_can_encode_are_an_invalid_job_not_recursion_error() -> None:
    with pytest.raises(InvalidJobError, match="nested more than 100 levels deep"):
        validate_job("t", {"v": nested(100_000)}, "default", 0, None, {})
    looped: dict[str, Any] = {}
    looped["self"] = looped
    with pytest.raises(InvalidJobError, match="nested more than 100 levels deep"):
        validate_job("t", looped, "default", 0, None, {})


@pytest.mark.parametrize("path", sorted(PATHS))
def test_args_nested_past_the_depth_limit_are_refused_and_at_it_stored(
    engine: Engine, path: str
) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match=r"limits\.max_args_depth"):
            PATHS[path](session, {"task": "t", "args": {"v": nested(limits.max_args_depth)}})
        session.rollback()
    with Session(engine) as session, session.begin():
        PATHS[path](session, {"task": "t", "args": {"v": nested(limits.max_args_depth - 1)}})
    stored = list(jobs_by_id(engine).values())
    assert stored
    assert stored[0].args == {"v": nested(limits.max_args_depth - 1)}


@pytest.fixture
def unlimited_int_digits() -> Iterator[None]:
    """This process converts ints of any length (a worker, with Python's default, would not)."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    yield
    sys.set_int_max_str_digits(before)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_integer_longer_than_a_worker_can_decode_is_refused(engine: Engine, path: str) -> None:
    too_long = {"n": [10**MAX_INT_DIGITS]}
    fits = {"n": [-(10**MAX_INT_DIGITS - 1)]}
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match="pass it as a string"):
            PATHS[path](session, {"task": "t", "args": too_long})
        PATHS[path](session, {"task": "t", "args": fits})
        session.commit()
    assert {json.dumps(j.args) for j in jobs_by_id(engine).values()} == {json.dumps(fits)}


def test_a_long_integer_is_refused_even_where_this_process_could_encode_it(
    engine: Engine, unlimited_int_digits: None
) -> None:
    with Session(engine) as session:
        for path in ("enqueue", "copy"):
            with pytest.raises(InvalidJobError, match=f"more than {MAX_INT_DIGITS} digits"):
                PATHS[path](session, {"task": "t", "args": {"n": 10**5000}})
        session.rollback()
    assert jobs_by_id(engine) == {}


# -- the database holds the limits for every writer ------------------------------------------


def test_core_inserts_that_break_the_limits_are_refused_by_the_database(engine: Engine) -> None:
    refused = [
        (insert(Job).values(task="x" * 201), "ck_jobs_task_name"),
        (insert(Job).values(task="t", queue=""), "ck_jobs_queue_name"),
        (insert(Job).values(task="t", priority=-1), "ck_jobs_priority"),
        (insert(Job).values(task="t", args=[1]), "ck_jobs_args_object"),
        (insert(Job).values(task="t", args={"b": "x" * 1_000_000}), "ck_jobs_args_size"),
        (insert(Queue).values(name="q" * 201), "ck_queues_name"),
    ]
    for statement, constraint in refused:
        with engine.connect() as conn, pytest.raises(InvalidJobError) as raised:
            conn.execute(statement)
        assert f"CHECK constraint {constraint}" in str(raised.value)
        assert "\n" not in str(raised.value)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM sqla_queue.jobs")) == 0
        assert conn.scalar(text("SELECT count(*) FROM sqla_queue.queues")) == 1


def test_changing_a_jobs_args_after_enqueue_cannot_bypass_the_limits(engine: Engine) -> None:
    with Session(engine) as session:
        job = enqueue(session, "t", {"ok": 1}, flush=True)
        job.args = ["not", "a", "dict"]  # type: ignore[assignment]
        with pytest.raises(InvalidJobError) as raised:
            session.commit()
        assert "args are a JSON object" in str(raised.value)
        assert "ck_jobs_args_object" in str(raised.value)
        session.rollback()
    assert jobs_by_id(engine) == {}


def test_limits_may_be_lowered_but_not_raised_past_the_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigurationError, match=r"limits\.max_name_length must be an int"):
        limits.max_name_length = 201
    with pytest.raises(ConfigurationError, match="from 1 to 1000000"):
        limits.max_args_bytes = 2_000_000
    monkeypatch.setattr(limits, "max_name_length", 10)
    with pytest.raises(InvalidJobError, match="at most 10 characters"):
        validate_job("x" * 11, {}, "default", 0, None, {})


def test_upgrade_over_a_row_that_breaks_a_check_fails_naming_it(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    try:
        migrate.upgrade(engine, "sqlaq_0001")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO sqla_queue.jobs (task, priority) VALUES ('t', -1)"))
        with pytest.raises(Exception, match="ck_jobs_priority"):
            migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM sqla_queue.jobs"))
        migrate.upgrade(engine)
        assert migrate.check_schema(engine) == migrate.SCHEMA_REVISION
        migrate.downgrade(engine, "sqlaq_0001")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO sqla_queue.jobs (task, priority) VALUES ('t', -1)"))
    finally:
        engine.dispose()


# -- the URL's port, doctor's view of other sessions -------------------------------------------


def test_args_over_the_limit_as_text_are_refused_however_small_they_are_stored(
    engine: Engine,
) -> None:
    """sqlaq_0026 writes args out as text only when they are stored in more than 256 bytes:
    args that compress well, or whose text is six times their binary form (control
    characters, written `\\u0001`), are still refused; small ones are taken."""
    refused = [
        {"b": "x" * 1_000_000},  # compressed to a few kB
        {"b": "\u0001" * 170_000},  # 170 kB stored, 1,020,000 bytes as text
    ]
    for args in refused:
        with engine.connect() as conn, pytest.raises(InvalidJobError) as raised:
            conn.execute(insert(Job).values(task="t", args=args))
        assert "CHECK constraint ck_jobs_args_size" in str(raised.value)
    with engine.begin() as conn:
        conn.execute(insert(Job).values(task="t", args={"b": "\u0001" * 40}))
        conn.execute(insert(Job).values(task="t", args={"b": "x" * 999_980}))
    assert len(jobs_by_id(engine)) == 2


def test_the_args_size_is_checked_where_args_are_written_not_on_every_update(
    engine: Engine,
) -> None:
    """ck_jobs_args_size is a trigger on INSERT and UPDATE OF args (sqlaq_0007): a claim,
    heartbeat or retry does not write the args out as text again; writing args does."""
    with Session(engine) as session:
        job = enqueue(session, "t", {"ok": 1}, flush=True)
        session.commit()
        job_id = job.id
    too_large = {"b": "x" * 1_000_000}
    with engine.begin() as conn:  # a row written before the limit: the trigger set aside
        conn.execute(text("ALTER TABLE sqla_queue.jobs DISABLE TRIGGER ck_jobs_args_size"))
        conn.execute(update(Job).where(Job.id == job_id).values(args=too_large))
        conn.execute(text("ALTER TABLE sqla_queue.jobs ENABLE TRIGGER ck_jobs_args_size"))
    with engine.begin() as conn:  # what a claim writes: no args, no check of them
        conn.execute(update(Job).where(Job.id == job_id).values(status="running", attempts=1))
    with engine.connect() as conn, pytest.raises(InvalidJobError) as raised:
        conn.execute(update(Job).where(Job.id == job_id).values(args=too_large))
    assert "CHECK constraint ck_jobs_args_size" in str(raised.value)
    with engine.connect() as conn:
        assert conn.scalar(select(Job.attempts).where(Job.id == job_id)) == 1


# -- each job checked once, whatever the path (issue 39) --------------------------------------


def _count_name_checks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record each task or queue name `validate_job` checks (twice a job: task, queue)."""
    checked: list[object] = []
    real = validation.validate_name

    def counting(label: str, value: object, error: Any = validation.configuration_error) -> str:
        if label in ("task name", "queue name"):
            checked.append(value)
        return real(label, value, error)

    monkeypatch.setattr(validation, "validate_name", counting)
    return checked


def test_each_enqueue_path_checks_a_job_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`enqueue`, `Task.enqueue`, `Task.defer`, a unique `enqueue` and `enqueue_many` check a
    job's fields once: at the call, not again in `Job(...)` nor at the flush."""
    registry = Registry()

    @registry.task(name="shop.receipt")
    def receipt(n: int) -> None:
        """A task of one typed parameter."""

    checked = _count_name_checks(monkeypatch)
    calls: dict[str, Any] = {
        "enqueue": lambda s: enqueue(s, "shop.receipt", {"n": 1}),
        "Task.enqueue": lambda s: receipt.enqueue(s, {"n": 2}),
        "Task.defer": lambda s: receipt.defer(s, n=3),
        "delayed, tagged": lambda s: enqueue(s, "shop.receipt", {"n": 4}, delay=60, tags=["a"]),
        "unique": lambda s: enqueue(s, "shop.receipt", {"n": 5}, unique=True),
        "enqueue_many": lambda s: enqueue_many(s, [{"task": "shop.receipt", "args": {"n": 6}}]),
    }
    for name, call in calls.items():
        del checked[:]
        with Session(engine) as session, session.begin():
            call(session)
            session.flush()
        assert checked == ["shop.receipt", "default"], name
    stored = {job.args["n"]: job for job in jobs_by_id(engine).values()}
    assert sorted(stored) == [1, 2, 3, 4, 5, 6]
    assert stored[4].tags == ["a"]
    assert stored[4].run_at > stored[4].created_at


def test_a_job_changed_before_its_flush_is_checked_again(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `enqueue` checked is written as checked; a field set since, or args, tags or
    meta changed in place, are checked again at the flush (and a bad one refused there)."""
    checked = _count_name_checks(monkeypatch)
    with Session(engine) as session, session.begin():
        same = enqueue(session, "t", {"n": 1}, meta={"trace": "x"})
        moved = enqueue(session, "t", {"n": 2})
        moved.priority = 7
        grown = enqueue(session, "t", {"n": 3})
        grown.args["more"] = [1, 2]
        tagged = enqueue(session, "t", {"n": 4}, tags=["a"])
        tagged.tags.append("b")
        traced = enqueue(session, "t", {"n": 5})
        traced.meta["trace"] = "y"
        untraced = enqueue(session, "t", {"n": 6}, meta={"trace": "z"})
        untraced.meta.clear()
        emptied = enqueue(session, "t", {"n": 7})
        emptied.args.clear()
        assert len(checked) == 14  # at the calls
        session.flush()
        assert checked[14:] == ["t", "default"] * 6
        ids = [same.id, moved.id, grown.id, tagged.id, traced.id, untraced.id, emptied.id]
    stored = jobs_by_id(engine)
    assert stored[ids[0]].meta == {"trace": "x"}
    assert stored[ids[1]].priority == 7
    assert stored[ids[2]].args == {"n": 3, "more": [1, 2]}
    assert stored[ids[3]].tags == ["a", "b"]
    assert stored[ids[4]].meta == {"trace": "y"}
    assert (stored[ids[5]].meta, stored[ids[6]].args) == ({}, {})
    with Session(engine) as session:
        job = enqueue(session, "t", {"n": 6})
        job.args["bad"] = {1, 2}
        with pytest.raises(TypeError, match="not JSON-serialisable"):
            session.flush()
