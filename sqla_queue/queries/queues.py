"""Queue administration: create, pause, retention, delete, stats, prune."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    Delete,
    Insert,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete

from sqla_queue.models import JobStatus

from .common import (
    FINISHED_STATUSES,
    _is,
    _seconds,
    archive,
    jobs,
    queues,
)

# -- administration --------------------------------------------------------------------------


def queue_settings() -> Select[Any]:
    """(name, paused, retention, route) of every queue."""
    return select(queues.c.name, queues.c.paused, queues.c.retention, queues.c.route).order_by(
        queues.c.name
    )


def create_queue() -> Insert:
    """Create a queue; parameters `name`, `retention`. Existing queues are left as they are."""
    return (
        pg_insert(queues)
        .values(name=bindparam("name"), retention=bindparam("retention"))
        .on_conflict_do_nothing(index_elements=[queues.c.name])
        .returning(queues.c.name)
    )


def set_queue_paused(paused: bool) -> Update:
    """Pause or resume the queue `:name`; returns its name if it exists."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(paused=paused)
        .returning(queues.c.name)
    )


def set_queue_retention() -> Update:
    """Set the retention of the queue `:queue_name` to `:new_retention`."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(retention=bindparam("new_retention"))
        .returning(queues.c.name)
    )


def set_queue_route() -> Update:
    """Set (or clear, with NULL) the route of the queue `:queue_name` to `:new_route`."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(route=bindparam("new_route"))
        .returning(queues.c.name)
    )


def count_unfinished_in_queue() -> Select[Any]:
    """How many jobs of `:queue_name` are queued or running."""
    return select(func.count()).where(
        jobs.c.queue == bindparam("queue_name"),
        or_(_is(JobStatus.queued), _is(JobStatus.running)),
    )


def lock_queue() -> Select[Any]:
    """Lock the queue `:queue_name`'s row; under the foreign key this holds off enqueuers."""
    return select(queues.c.name).where(queues.c.name == bindparam("queue_name")).with_for_update()


def delete_jobs_of_queue(finished_only: bool) -> Delete:
    """Delete the jobs of the queue `:queue_name`: only finished ones, or all (`--force`)."""
    statement = delete(jobs).where(jobs.c.queue == bindparam("queue_name"))
    if finished_only:
        statement = statement.where(or_(*(_is(JobStatus(s)) for s in FINISHED_STATUSES)))
    return statement


def delete_queue() -> ReturningDelete[Any]:
    """Delete the queue `:queue_name`; returns its name if it existed."""
    return delete(queues).where(queues.c.name == bindparam("queue_name")).returning(queues.c.name)


def queue_stats() -> Select[Any]:
    """Per queue and status: count and the oldest due queued job's age in seconds.

    Queues with no jobs appear once with a NULL status and a count of 0.
    """
    oldest_due = func.min(jobs.c.run_at).filter(
        and_(_is(JobStatus.queued), jobs.c.run_at <= func.now())
    )
    due_age = func.extract("epoch", func.now() - oldest_due)
    names = select(queues.c.name).union(select(jobs.c.queue.label("name")).distinct()).subquery()
    return (
        select(
            names.c.name,
            queues.c.paused,
            jobs.c.status,
            func.count(jobs.c.id),
            due_age,
        )
        .select_from(names)
        .outerjoin(queues, queues.c.name == names.c.name)
        .outerjoin(jobs, jobs.c.queue == names.c.name)
        .group_by(names.c.name, queues.c.paused, jobs.c.status)
        .order_by(names.c.name, jobs.c.status)
    )


def prune_jobs() -> Delete:
    """Delete finished jobs (`:statuses`) that finished more than `:older_than` seconds ago."""
    return delete(jobs).where(
        jobs.c.status == any_(bindparam("statuses", type_=ARRAY(Text))),
        jobs.c.finished_at < func.now() - _seconds("older_than"),
    )


def prune_archive() -> Delete:
    """Delete archived jobs older than `:older_than` seconds."""
    return delete(archive).where(archive.c.finished_at < func.now() - _seconds("older_than"))
