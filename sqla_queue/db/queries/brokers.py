"""The statements of the relay and the broker workers (sqla_queue.brokers), as SQLAlchemy Core."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Insert,
    Integer,
    Select,
    Table,
    Text,
    any_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Delete

from sqla_queue.db.models import BrokerDone, JobStatus
from sqla_queue.db.queries.common import (
    job_ids_param,
    jobs,
    queue_names_param,
    queues,
    seconds_param,
    status_is,
)
from sqla_queue.job.arguments import ROW_MARK

done = cast(Table, BrokerDone.__table__)

RELAYED_COLUMNS = (
    jobs.c.id,
    jobs.c.task,
    jobs.c.args,
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.created_at,
)
"""What a relay claim returns, in this order; `sqla_queue.brokers.messages` encodes it."""


def routed_queues() -> Select[Any]:
    """(name, route) of the queues that are not paused and route to `:prefix` (nats:, amqp:)."""
    return (
        select(queues.c.name, queues.c.route)
        .where(queues.c.route.startswith(bindparam("prefix", type_=Text)), ~queues.c.paused)
        .order_by(queues.c.name)
    )


def queue_route() -> Select[Any]:
    """The route of queue `:queue_name` (no row: no such queue; NULL: not routed)."""
    return select(queues.c.route).where(queues.c.name == bindparam("queue_name", type_=Text))


def routed_among() -> Select[Any]:
    """(name, route) of the queues among `:queues` that are routed to a broker."""
    return select(queues.c.name, queues.c.route).where(
        queues.c.name == any_(queue_names_param()),
        queues.c.route.is_not(None),
    )


def may_read_queues() -> Select[Any]:
    """Whether this role may read `sqla_queue.queues` (an enqueue-only role need not)."""
    return select(func.has_table_privilege(queues.fullname, "SELECT"))


_ROW_PATH = f"""'$.*."{ROW_MARK}"'::jsonpath"""


def count_unfinished_not_kept_on_routes() -> Select[Any]:
    """How many jobs of `:queue_name` queued or running have a unique key (`unique`), a
    sequence (`sequence`), a partition (`partition`), an ORM row argument (`rows`): what a
    routed queue cannot keep."""
    unfinished = jobs.c.status.in_([JobStatus.queued.value, JobStatus.running.value])
    statement = select(
        func.count(jobs.c.unique_key).label("unique"),  # count(x) counts the rows x is set in
        func.count(jobs.c.sequence).label("sequence"),
        func.count(jobs.c.partition).label("partition"),
        # an args value that is a row reference (`sqla_queue.job.arguments.ROW_MARK`)
        func.count()
        .filter(func.jsonb_path_exists(jobs.c.args, literal_column(_ROW_PATH)))
        .label("rows"),
    ).where(jobs.c.queue == bindparam("queue_name", type_=Text), unfinished)
    return cast("Select[Any]", statement)


def claim_for_relay() -> Select[Any]:
    """Lock up to `:limit` due queued jobs of queue `:queue_name`, in claim order.

    The locks last until the relay's transaction ends: it deletes the rows the broker
    confirmed and commits, or dies and the rows are there for the next relay. SKIP LOCKED
    splits the rows between relays running at once.
    """
    return (
        select(*RELAYED_COLUMNS)
        .where(
            status_is(JobStatus.queued),  # a literal: a generic plan must match the claim index
            jobs.c.queue == bindparam("queue_name", type_=Text),
            jobs.c.run_at <= func.now(),
        )
        .order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


def delete_relayed() -> Delete:
    """Delete the jobs `:job_ids` the broker confirmed (locked by this transaction)."""
    return delete(jobs).where(jobs.c.id == any_(job_ids_param()))


def already_done() -> Select[Any]:
    """Whether the relayed job `:job_id` was already run to success by a broker worker."""
    return select(exists().where(done.c.job_id == bindparam("job_id", type_=BigInteger)))


def mark_done() -> Insert:
    """Record the relayed job `:job_id` as run (a duplicate delivery is then skipped)."""
    return (
        pg_insert(done)
        .values(job_id=bindparam("job_id", type_=BigInteger))
        .on_conflict_do_nothing(index_elements=[done.c.job_id])
    )


def prune_done() -> Delete:
    """Forget de-duplication records older than `:older_than` seconds."""
    cutoff = func.now() - seconds_param("older_than")
    return delete(done).where(done.c.done_at < cutoff)


def record_failed() -> Insert:
    """Put a relayed job that failed for good back into the jobs table as `failed`.

    Parameters: `job_id`, `job_queue`, `job_task`, `job_args`, `job_attempts`,
    `job_max_attempts`, `job_error`. The id is the job's own, so `sqla-queue stats`
    and `doctor` see it; a second record of the same failure is ignored.
    """
    return (
        pg_insert(jobs)
        .values(
            id=bindparam("job_id", type_=BigInteger),
            queue=bindparam("job_queue", type_=Text),
            task=bindparam("job_task", type_=Text),
            args=bindparam("job_args", type_=JSONB),
            status=JobStatus.failed.value,
            attempts=bindparam("job_attempts", type_=Integer),
            max_attempts=bindparam("job_max_attempts", type_=Integer),
            last_error=bindparam("job_error", type_=Text),
            finished_at=func.now(),
        )
        .on_conflict_do_nothing(index_elements=[jobs.c.id])
    )
