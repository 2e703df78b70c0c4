"""Statements of fair, partition-limited and aging queues, and of sequences: their settings
(`queues set --fair|--partition-limit|--aging|--sequence-on-failure`, partition weights) and
what `stats`, the metrics, the dashboard and `doctor` show of them. The claim itself is in
`claim.py` (and `sqla_queue.claim_turns`, migration sqlaq_0013)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    Boolean,
    Delete,
    Float,
    Integer,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import Insert
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_queue.db.models import JobStatus, PartitionWeight
from sqla_queue.db.queries.claim import takes_turns
from sqla_queue.db.queries.common import jobs, queues, status_is
from sqla_queue.db.queries.queues import set_queue
from sqla_queue.job.states import HOLDS_SEQUENCE, status_in

weights = cast(Table, PartitionWeight.__table__)


def set_queue_fair() -> Any:
    """Make `:queue_name` fair (`:fair` true) or FIFO again."""
    return set_queue(fair=bindparam("fair"))


def set_queue_partition_limit() -> Any:
    """Set (or clear, with NULL) the running jobs allowed per partition of `:queue_name`."""
    return set_queue(partition_limit=bindparam("partition_limit", type_=Integer))


def set_queue_aging() -> Any:
    """Set (or clear, with NULL) the seconds per priority step a waiting job of
    `:queue_name` gains."""
    return set_queue(aging=bindparam("aging", type_=Float))


def set_queue_sequence_on_failure() -> Any:
    """Set `:queue_name`'s `sequence_on_failure` (`hold` or `skip`) to `:policy`."""
    return set_queue(sequence_on_failure=bindparam("policy", type_=Text))


def set_partition_weight() -> Insert:
    """Give partition `:partition` of `:queue_name` the weight `:weight`."""
    statement = pg_insert(weights).values(
        queue=bindparam("queue_name"),
        partition=bindparam("partition"),
        weight=bindparam("weight", type_=Float),
    )
    return statement.on_conflict_do_update(
        index_elements=[weights.c.queue, weights.c.partition],
        set_={"weight": statement.excluded.weight},
    )


def clear_partition_weight() -> Delete:
    """Back to weight 1 for partition `:partition` of `:queue_name`."""
    return delete(weights).where(
        weights.c.queue == bindparam("queue_name"), weights.c.partition == bindparam("partition")
    )


def partition_weights() -> Select[Any]:
    """(queue, partition, weight) of every partition given a weight."""
    return select(weights.c.queue, weights.c.partition, weights.c.weight).order_by(
        weights.c.queue, weights.c.partition
    )


def top_partitions() -> Select[Any]:
    """(queue, partition, queued, running) of the partitions of fair or partition-limited
    queues (`:queue_names`, a list, or every such queue when NULL), the deepest first, at
    most `:top` per queue; a job without a partition counts under partition NULL. It reads
    the queued and running jobs of those queues (ix_jobs_partition_claim, the running ones)."""
    counts = (
        select(
            jobs.c.queue,
            jobs.c.partition,
            func.count().filter(status_is(JobStatus.queued)).label("queued"),
            func.count().filter(status_is(JobStatus.running)).label("running"),
        )
        .where(
            or_(status_is(JobStatus.queued), status_is(JobStatus.running)),
            jobs.c.queue.in_(
                select(queues.c.name).where(or_(queues.c.fair, queues.c.partition_limit > 0))
            ),
        )
        .group_by(jobs.c.queue, jobs.c.partition)
        .subquery("c")
    )
    ranked = select(
        counts,
        func.row_number()
        .over(partition_by=counts.c.queue, order_by=(counts.c.queued.desc(), counts.c.partition))
        .label("n"),
    ).subquery("r")
    names = bindparam("queue_names", None, type_=ARRAY(Text))
    return (
        select(ranked.c.queue, ranked.c.partition, ranked.c.queued, ranked.c.running)
        .where(ranked.c.n <= bindparam("top", type_=Integer))
        .where(or_(names.is_(None), ranked.c.queue == func.any(names)))
        .order_by(ranked.c.queue, ranked.c.n)
    )


def _holding_failures() -> tuple[Any, Any]:
    """The failed jobs that hold their sequence (in a queue whose policy is `hold`), as an
    alias `f` and the condition that picks them, read by ix_jobs_sequence (its predicate is
    stated, so the partial index serves it)."""
    f = jobs.alias("f")
    skips = exists().where(queues.c.name == f.c.queue, queues.c.sequence_on_failure == "skip")
    holding = and_(
        f.c.sequence.is_not(None),
        status_is(JobStatus.failed, f),
        ~skips,
        status_in(f.c.status, HOLDS_SEQUENCE),
    )
    return f, holding


def _behind(f: Any) -> Any:
    """The queued jobs of `f`'s sequence enqueued after it (by ix_jobs_sequence)."""
    w = jobs.alias("w")
    return (
        select(func.count())
        .where(w.c.sequence == f.c.sequence, w.c.id > f.c.id, status_is(JobStatus.queued, w))
        .scalar_subquery()
    )


def held_sequences() -> Select[Any]:
    """(sequence, queue, failed job id, its finished_at, seconds since, jobs waiting behind
    it) of each sequence a failed job holds in a queue whose policy is `hold`, the longest
    held first, at most `:limit`; only those of queue `:queue_name` unless it is NULL, and
    only those with a job waiting behind them when `:waiting` is true."""
    f, holding = _holding_failures()
    behind = _behind(f)
    name = bindparam("queue_name", None, type_=Text)
    return (
        select(
            f.c.sequence,
            f.c.queue,
            f.c.id,
            f.c.finished_at,
            func.extract("epoch", func.now() - f.c.finished_at).label("held_for"),
            behind.label("behind"),
        )
        .where(
            holding,
            or_(name.is_(None), f.c.queue == name),
            or_(~bindparam("waiting", False, type_=Boolean), behind > 0),
        )
        .order_by(f.c.finished_at, f.c.id)
        .limit(bindparam("limit", type_=Integer))
    )


def held_sequence_counts() -> Select[Any]:
    """Per queue: (queue, sequences held by a failed job, seconds the longest has been
    held, queued jobs waiting behind them), of at most `:cap` held sequences read (by
    ix_jobs_sequence): a scrape's cost stays bounded however many failed jobs are kept."""
    f, holding = _holding_failures()
    held = (
        select(
            f.c.queue,
            f.c.finished_at,
            _behind(f).label("behind"),
        )
        .where(holding)
        .limit(bindparam("cap", type_=Integer))
        .subquery("held")
    )
    return (
        select(
            held.c.queue,
            func.count().label("held"),
            func.extract("epoch", func.now() - func.min(held.c.finished_at)).label("longest"),
            func.coalesce(func.sum(held.c.behind), 0).label("behind"),
        )
        .group_by(held.c.queue)
        .order_by(held.c.queue)
    )


def aged_jobs() -> Select[Any]:
    """(queue, aging seconds, due jobs whose priority aging has improved) of each aging
    queue: queued jobs not at priority 0 that have waited at least one interval."""
    j = jobs.alias("j")
    aged = and_(
        j.c.queue == queues.c.name,
        status_is(JobStatus.queued, j),
        j.c.priority > 0,
        j.c.run_at <= func.now() - queues.c.aging * literal_column("interval '1 second'"),
    )
    count = select(func.count()).select_from(j).where(aged).scalar_subquery()
    return (
        select(queues.c.name, queues.c.aging, count.label("aged"))
        .where(queues.c.aging.is_not(None))
        .order_by(queues.c.name)
    )


def turns_queues() -> Select[Any]:
    """(name, fair, partition_limit, aging, sequence_on_failure) of every queue that takes
    turns (fair, partition-limited or aging), or whose sequences skip failures."""
    return (
        select(
            queues.c.name,
            queues.c.fair,
            queues.c.partition_limit,
            queues.c.aging,
            queues.c.sequence_on_failure,
        )
        .where(or_(takes_turns(queues), queues.c.sequence_on_failure != "hold"))
        .order_by(queues.c.name)
    )
