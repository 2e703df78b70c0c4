"""Periodic jobs: the slots each task was enqueued for, claimed by primary key."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    BigInteger,
    DateTime,
    Delete,
    Insert,
    Interval,
    Select,
    Table,
    Text,
    Update,
    any_,
    bindparam,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_queue.db.models import PeriodicSlot
from sqla_queue.db.queries.common import unnested

slots = cast(Table, PeriodicSlot.__table__)


def _wanted(*extra: tuple[str, str, Any]) -> Any:
    """`unnest(:slot_tasks, :slot_times, ...) AS w(task, slot, ...)`."""
    return unnested(
        "w", ("slot_tasks", "task", Text), ("slot_times", "slot", DateTime(timezone=True)), *extra
    )


def database_now() -> Select[Any]:
    """The database's clock (the transaction's start): periodic slots are due by it, not by
    a worker's own clock."""
    return select(func.now())


def claim_periodic_slots() -> Insert:
    """Insert (task, slot) pairs `:slot_tasks`/`:slot_times`; returns those this call won.

    A pair another transaction holds is waited for (never locked) and skipped once it
    commits: each slot is won by exactly one scheduler.
    """
    wanted = _wanted()
    return (
        pg_insert(slots)
        .from_select(["task", "slot"], select(wanted.c.task, wanted.c.slot))
        .on_conflict_do_nothing(index_elements=[slots.c.task, slots.c.slot])
        .returning(slots.c.task, slots.c.slot)
    )


def record_periodic_jobs() -> Update:
    """Set the job id of each won slot: `:slot_tasks`, `:slot_times`, `:slot_jobs`."""
    wanted = _wanted(("slot_jobs", "job_id", BigInteger))
    return (
        update(slots)
        .where(slots.c.task == wanted.c.task, slots.c.slot == wanted.c.slot)
        .values(job_id=wanted.c.job_id)
    )


def last_periodic_slots() -> Select[Any]:
    """(task, latest slot) of each of `:tasks` that has one."""
    return (
        select(slots.c.task, func.max(slots.c.slot).label("slot"))
        .where(slots.c.task == any_(bindparam("tasks", type_=ARRAY(Text))))
        .group_by(slots.c.task)
    )


def last_periodic_jobs() -> Select[Any]:
    """(task, latest slot, its job id) of each of `:tasks` that has one."""
    latest = last_periodic_slots().subquery("latest")
    return select(slots.c.task, slots.c.slot, slots.c.job_id).join(
        latest, (slots.c.task == latest.c.task) & (slots.c.slot == latest.c.slot)
    )


def prune_periodic_slots() -> Delete:
    """Delete slots enqueued more than `:keep` ago, except each task's latest."""
    newer = slots.alias("newer")
    later_exists = (
        select(newer.c.task)
        .where(newer.c.task == slots.c.task, newer.c.slot > slots.c.slot)
        .exists()
    )
    return delete(slots).where(
        slots.c.enqueued_at < func.now() - bindparam("keep", type_=Interval), later_exists
    )
