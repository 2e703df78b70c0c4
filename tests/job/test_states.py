"""The states table (issue 21): one table says what each status means, and the migrated
database's CHECK constraint, unique index and finished index say the same."""

from __future__ import annotations

import importlib
import inspect
import re
import warnings

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import Unique, enqueue, errors
from sqla_queue.job import states, validation
from sqla_queue.job.states import FINISHED, STATES, UNIQUE_BITS, JobStatus
from sqla_queue.job.unique import DEFAULT_STATES, EVERY_STATE, STATE_BITS

MIGRATED_UNIQUE_BITS = {"queued": 1, "running": 2, "done": 4, "failed": 8, "cancelled": 16}
"""The bits migration sqlaq_0005 wrote into ux_jobs_unique_key's predicate and rows keep."""


def index_predicate(engine: Engine, name: str) -> str:
    with engine.connect() as conn:
        predicate = conn.execute(
            text(
                "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'sqla_queue' AND c.relname = :name"
            ),
            {"name": name},
        ).scalar_one()
    return str(predicate)


def test_the_status_check_constraint_admits_exactly_the_tables_statuses(engine: Engine) -> None:
    with engine.connect() as conn:
        definition = conn.execute(
            text(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'sqla_queue.jobs'::regclass AND contype = 'c' "
                "AND pg_get_constraintdef(oid) LIKE 'CHECK ((status = %'"
            )
        ).scalar_one()
    admitted = re.findall(r"'(\w+)'::text", definition)
    assert sorted(admitted) == sorted(status.value for status in STATES)
    assert sorted(admitted) == sorted(status.value for status in JobStatus)


def test_the_unique_index_spells_the_tables_bits_which_the_migrations_stored(
    engine: Engine,
) -> None:
    predicate = index_predicate(engine, "ux_jobs_unique_key")
    stored = {name: int(bit) for name, bit in re.findall(r"'(\w+)'::text THEN (\d+)", predicate)}
    assert stored == UNIQUE_BITS
    # a state added later takes a new bit; the bits rows already hold never change
    assert {name: UNIQUE_BITS[name] for name in MIGRATED_UNIQUE_BITS} == MIGRATED_UNIQUE_BITS
    assert STATE_BITS is UNIQUE_BITS  # sqla_queue.job.unique's old name for them


def test_the_finished_index_holds_exactly_the_finished_states(engine: Engine) -> None:
    predicate = index_predicate(engine, "ix_jobs_finished")
    assert sorted(re.findall(r"'(\w+)'::text", predicate)) == sorted(FINISHED)
    assert {"done", "failed", "cancelled"} <= set(FINISHED)
    assert not {"queued", "running"} & set(FINISHED)
    assert [s for s in JobStatus if s.finished] == [JobStatus(s) for s in FINISHED]


def test_a_stored_unique_job_carries_the_bits_of_its_states(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        default = enqueue(session, "t.default", {"n": 1}, unique=True)
        ever = enqueue(session, "t.ever", {"n": 1}, unique=Unique(states=EVERY_STATE))
        ids = (default.id, ever.id)
    with engine.connect() as conn:
        stored = dict(
            conn.execute(
                text("SELECT task, unique_states FROM sqla_queue.jobs WHERE id = ANY(:ids)"),
                {"ids": list(ids)},
            ).all()
        )
    assert stored == {"t.default": 1 | 2 | 32, "t.ever": sum(UNIQUE_BITS.values())}
    assert sum(MIGRATED_UNIQUE_BITS.values()) == 1 | 2 | 4 | 8 | 16
    assert frozenset({"queued", "running"}) == DEFAULT_STATES


def test_a_table_missing_a_status_or_reusing_a_bit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without_cancelled = {s: row for s, row in STATES.items() if s is not JobStatus.cancelled}
    monkeypatch.setattr(states, "STATES", without_cancelled)
    with pytest.raises(RuntimeError, match=r"missing \['cancelled'\]"):
        states._check_table()
    reused = dict(STATES)
    reused[JobStatus.cancelled] = STATES[JobStatus.failed]
    monkeypatch.setattr(states, "STATES", reused)
    with pytest.raises(RuntimeError, match="its own power-of-two unique_bit"):
        states._check_table()


def test_the_table_says_what_retry_delete_cancel_and_the_reaper_touch() -> None:
    def of_the_first_five(**wanted: bool) -> tuple[str, ...]:
        return tuple(s for s in states.statuses(**wanted) if s in MIGRATED_UNIQUE_BITS)

    assert of_the_first_five(retry=True) == ("failed",)
    assert of_the_first_five(retry_by_id=True) == ("failed", "cancelled")
    assert of_the_first_five(cancel=True) == ("queued", "running")
    assert of_the_first_five(delete=False) == ("running",)
    assert of_the_first_five(reap=True) == ("running",)


def test_predicates_spell_statuses_as_literals_not_parameters() -> None:
    listed = ", ".join(f"'{s}'" for s in FINISHED)
    assert f"status IN ({listed})" == states.FINISHED_SQL
    compiled = str(states.is_finished(sqla_queue.Job.__table__.c.status))
    assert compiled == f"sqla_queue.jobs.status IN ({listed})"
    with pytest.raises(ValueError, match="not a status"):
        states.sql_literal("x' OR '1")


REMOVED = [
    ("sqla_queue", "Base"),
    ("sqla_queue", "TaskNotFoundError"),
    ("sqla_queue.errors", "TaskNotFoundError"),
    ("sqla_queue.db.models", "Base"),
    ("sqla_queue.enqueue", "EnqueueOptions"),
    ("sqla_queue.admin", "set_concurrency"),
    ("sqla_queue.admin.queues", "set_concurrency"),
    ("sqla_queue.registry", "JobContext"),
    ("sqla_queue.worker.executor", "resources_of"),
    ("sqla_queue.worker.executor", "MAX_RETRY_DELAY"),
    ("sqla_queue.worker.jobs", "Outcome"),
    ("sqla_queue.worker.jobs", "error_text"),
    ("sqla_queue.enqueue.results", "encode_result"),
]
"""Deprecated names and old import paths removed before 1.0 (CHANGELOG, issue 34)."""


@pytest.mark.parametrize(("module", "name"), REMOVED)
def test_no_deprecated_name_or_old_import_path_is_left(module: str, name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hasattr(importlib.import_module(module), name)


@pytest.mark.parametrize("module", ["sqla_queue.deprecation", "sqla_queue.worker.stormlog"])
def test_no_shim_module_is_left(module: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_an_unknown_task_is_one_error_on_both_sides() -> None:
    worker_side = str(errors.UnknownTaskError(task="gone.task"))
    assert worker_side == (
        "unknown task 'gone.task': no handler is registered under that name in this "
        "worker's registry"
    )
    enqueue_side = str(errors.UnknownTaskError(task="shop.chrage", hint="did you mean 'x'?"))
    assert enqueue_side.startswith("unknown task 'shop.chrage': no handler is registered")
    assert "registry in force" in enqueue_side
    assert enqueue_side.endswith("; did you mean 'x'?")
    assert isinstance(errors.UnknownTaskError(task="t"), ValueError)


def test_the_top_level_names_are_few_sorted_and_each_documented() -> None:
    names = sqla_queue.__all__
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    assert len(set(names)) == len(names)
    for promised in ("Middleware", "SchemaElsewhereError", "QueueBase", "UnknownTaskError"):
        assert promised in names
    assert set(errors.__all__) <= set(names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in names:
            value = getattr(sqla_queue, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                assert inspect.getdoc(value), f"sqla_queue.{name} has no docstring"


def test_validation_lives_in_its_own_module_and_the_old_paths_still_work() -> None:
    from sqla_queue.db import models

    assert models.validate_job is validation.validate_job
    assert models.validate_tags_and_meta is validation.validate_tags_and_meta
    assert models.limits is validation.limits is sqla_queue.limits
    assert models.JobStatus is JobStatus is sqla_queue.JobStatus
