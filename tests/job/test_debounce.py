"""Debounce and throttle by key (issue 24): `Unique(on_conflict="replace" | "replace_args")`.

A duplicate of a job that has not started gives it its args (and, with `replace`, its
run_at); a job that already runs is never touched, it lets its key go and the duplicate
is written as a new job, to run after it.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from helpers.support import jobs_of_task
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, Registry, Unique, admin, enqueue, enqueue_many
from sqla_queue.testing import drain

DEBOUNCE = Unique(args=["account"], on_conflict="replace")
THROTTLE = Unique(args=["account"], on_conflict="replace_args")


def test_replace_gives_the_waiting_job_the_last_calls_args_and_run_at(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        first = enqueue(session, "sync", {"account": 3, "page": 1}, unique=DEBOUNCE, delay=60)
        first_id = first.id
    (before,) = jobs_of_task(engine)
    with Session(engine) as session, session.begin():
        again = enqueue(session, "sync", {"account": 3, "page": 2}, unique=DEBOUNCE, delay=600)
        assert (again.id, again.duplicate) == (first_id, True)
    (after,) = jobs_of_task(engine)
    assert after.id == first_id
    assert after.args == {"account": 3, "page": 2}
    # debounce: it now runs `delay` after the last call, not the first
    assert after.run_at - before.run_at > dt.timedelta(seconds=500)


def test_replace_args_keeps_the_first_run_at(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        enqueue(session, "sync", {"account": 3, "page": 1}, unique=THROTTLE, delay=60)
    (before,) = jobs_of_task(engine)
    with Session(engine) as session, session.begin():
        enqueue(session, "sync", {"account": 3, "page": 2}, unique=THROTTLE, delay=600)
    (after,) = jobs_of_task(engine)
    assert after.args == {"account": 3, "page": 2}
    assert after.run_at == before.run_at


def test_keep_is_the_default_and_leaves_the_holder_alone(engine: Engine) -> None:
    assert Unique().on_conflict == "keep"
    with Session(engine) as session, session.begin():
        enqueue(session, "sync", {"account": 3, "page": 1}, unique=Unique(args=["account"]))
        enqueue(session, "sync", {"account": 3, "page": 2}, unique=Unique(args=["account"]))
    assert [j.args for j in jobs_of_task(engine)] == [{"account": 3, "page": 1}]


def test_other_keys_are_not_touched_and_enqueue_many_replaces_per_row(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        enqueue(session, "sync", {"account": 1, "page": 1}, unique=DEBOUNCE)
        enqueue(session, "sync", {"account": 2, "page": 1}, unique=DEBOUNCE)
    rows: list[dict[str, Any]] = [
        {"task": "sync", "args": {"account": 1, "page": page}, "unique": DEBOUNCE}
        for page in range(2, 150)  # past the COPY threshold: the staged path replaces too
    ]
    with Session(engine) as session, session.begin():
        result = enqueue_many(session, rows)
        assert all(result.duplicates)
    assert [j.args for j in jobs_of_task(engine)] == [
        {"account": 1, "page": 149},
        {"account": 2, "page": 1},
    ]


def test_a_running_holder_is_never_touched_and_the_duplicate_runs_after_it(
    engine: Engine,
) -> None:
    registry = Registry()
    started, release = threading.Event(), threading.Event()
    seen: list[dict[str, Any]] = []

    @registry.task(name="sync", unique=DEBOUNCE)
    def sync(account: int, page: int) -> None:
        seen.append({"account": account, "page": page})
        if page == 1:
            started.set()
            assert release.wait(30)

    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    with Session(engine) as session, session.begin():
        held = sync.enqueue(session, {"account": 3, "page": 1})
        held_id = held.id
    worker = threading.Thread(target=drain, args=(engine, registry), kwargs={"max_jobs": 1})
    worker.start()
    assert started.wait(30)
    with Session(engine) as session, session.begin():
        new = sync.enqueue(session, {"account": 3, "page": 2})
        assert (new.duplicate, new.id != held_id) == (False, True)
        new_id = new.id
    release.set()
    worker.join(30)
    running, queued = jobs_of_task(engine)
    assert (running.id, running.status, running.args["page"]) == (held_id, "done", 1)
    assert (queued.id, queued.status, queued.args["page"]) == (new_id, "queued", 2)
    assert running.unique_key is None  # let go while running: it blocks nothing any more
    drain(engine, registry)
    assert seen == [{"account": 3, "page": 1}, {"account": 3, "page": 2}]


def test_a_finished_holder_in_the_blocking_states_is_kept(engine: Engine) -> None:
    once = Unique(args=["account"], on_conflict="replace", states=["queued", "running", "done"])
    registry = Registry()
    registry.task(name="sync")(lambda account, page: None)
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    with Session(engine) as session, session.begin():
        enqueue(session, "sync", {"account": 3, "page": 1}, unique=once)
    drain(engine, registry)
    with Session(engine) as session, session.begin():
        again = enqueue(session, "sync", {"account": 3, "page": 2}, unique=once)
        assert again.duplicate
    (done,) = jobs_of_task(engine)
    assert (done.status, done.args["page"]) == ("done", 1)


@pytest.mark.parametrize("value", ["replce", "", None, 1])
def test_a_bad_on_conflict_is_refused_naming_the_choices(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"on_conflict.*keep, replace, replace_args"):
        Unique(on_conflict=value)
