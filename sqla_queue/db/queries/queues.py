"""Queue administration: create, pause, retention, delete, stats, prune."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    Delete,
    Float,
    Insert,
    Integer,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete

from sqla_queue.db.models import JobStatus
from sqla_queue.db.queries.common import (
    FINISHED_STATUSES,
    archive,
    cancelled_held,
    jobs,
    queues,
    seconds_param,
    seconds_since,
    status_is,
)
from sqla_queue.job.states import UNFINISHED

# -- administration --------------------------------------------------------------------------


def queue_settings() -> Select[Any]:
    """(name, paused, retention, route, concurrency, rate_limit, rate_window, result_ttl,
    fair, partition_limit, aging, sequence_on_failure) of every queue."""
    return select(
        queues.c.name,
        queues.c.paused,
        queues.c.retention,
        queues.c.route,
        queues.c.concurrency,
        queues.c.rate_limit,
        queues.c.rate_window,
        queues.c.result_ttl,
        queues.c.fair,
        queues.c.partition_limit,
        queues.c.aging,
        queues.c.sequence_on_failure,
    ).order_by(queues.c.name)


def create_queue() -> Insert:
    """Create a queue; parameters `name`, `retention`. Existing queues are left as they are."""
    return (
        pg_insert(queues)
        .values(name=bindparam("name"), retention=bindparam("retention"))
        .on_conflict_do_nothing(index_elements=[queues.c.name])
        .returning(queues.c.name)
    )


def insert_queue() -> Insert:
    """Insert a queue row from the columns given as parameters (the session's flush of an
    added `Queue`, written ahead of its jobs: `enqueue._write_added_queues`)."""
    return insert(queues)


def set_queue(**values: Any) -> Update:
    """`UPDATE queues SET <values> WHERE name = :queue_name RETURNING name`: no row, no queue."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(**values)
        .returning(queues.c.name)
    )


def set_queue_paused(paused: bool) -> Update:
    """Pause or resume the queue `:name`; returns its name if it exists."""
    return set_queue(paused=paused)


def set_queue_retention() -> Update:
    """Set the retention of the queue `:queue_name` to `:new_retention`."""
    return set_queue(retention=bindparam("new_retention"))


def set_queue_route() -> Update:
    """Set (or clear, with NULL) the route of the queue `:queue_name` to `:new_route`."""
    return set_queue(route=bindparam("new_route"))


def set_queue_concurrency() -> Update:
    """Set (or clear, with NULL) the concurrency limit of `:queue_name` to `:concurrency`."""
    return set_queue(concurrency=bindparam("concurrency", type_=Integer))


def set_queue_rate() -> Update:
    """Set (or clear, with NULLs) the rate limit of `:queue_name`: `:rate_limit` starts per
    `:rate_window` seconds."""
    return set_queue(
        rate_limit=bindparam("rate_limit", type_=Integer),
        rate_window=bindparam("rate_window", type_=Float),
    )


def set_queue_result_ttl() -> Update:
    """Set how long (`:result_ttl` seconds) kept results of `:queue_name` stay readable."""
    return set_queue(result_ttl=bindparam("result_ttl", type_=Float))


def count_unfinished_in_queue() -> Select[Any]:
    """How many jobs of `:queue_name` are unfinished (queued, running or waiting)."""
    return select(func.count()).where(
        jobs.c.queue == bindparam("queue_name"),
        or_(*(status_is(JobStatus(status)) for status in UNFINISHED)),
    )


def lock_queue() -> Select[Any]:
    """Lock the queue `:queue_name`'s row; under the foreign key this holds off enqueuers."""
    return select(queues.c.name).where(queues.c.name == bindparam("queue_name")).with_for_update()


def delete_jobs_of_queue(finished_only: bool) -> Delete:
    """Delete the jobs of the queue `:queue_name`: only finished ones, or all (`--force`)."""
    statement = delete(jobs).where(jobs.c.queue == bindparam("queue_name"))
    if finished_only:
        statement = statement.where(or_(*(status_is(JobStatus(s)) for s in FINISHED_STATUSES)))
    return statement


def delete_queue() -> ReturningDelete[Any]:
    """Delete the queue `:queue_name`; returns its name if it existed."""
    return delete(queues).where(queues.c.name == bindparam("queue_name")).returning(queues.c.name)


def queue_stats() -> Select[Any]:
    """Per queue and status: count and the oldest due queued job's age in seconds.

    Queues with no jobs appear once with a NULL status and a count of 0.
    """
    oldest_due = func.min(jobs.c.run_at).filter(
        and_(status_is(JobStatus.queued), jobs.c.run_at <= func.now())
    )
    due_age = seconds_since(oldest_due)
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
    """Delete finished jobs (`:statuses`) that finished more than `:older_than` seconds ago
    (not a cancelled one whose handler still runs: it holds its queue's slot)."""
    return delete(jobs).where(
        jobs.c.status == any_(bindparam("statuses", type_=ARRAY(Text))),
        jobs.c.finished_at < func.now() - seconds_param("older_than"),
        ~cancelled_held(),
    )


def prune_archive() -> Delete:
    """Delete archived jobs older than `:older_than` seconds."""
    return delete(archive).where(archive.c.finished_at < func.now() - seconds_param("older_than"))
