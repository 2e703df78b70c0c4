"""The NOTIFY channels and the statements that speak on them (LISTEN, pg_notify)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, Text, bindparam, case, func, select

from sqla_queue.db.models import NOTIFY_CHANNEL, JobStatus
from sqla_queue.db.queries.common import jobs, queue_names_param, status_is

RESULTS_CHANNEL = f"{NOTIFY_CHANNEL}_results"
"""The channel on which finishing statements name (by id) the jobs that reached a final
state with something to tell a waiter: a kept result, or a failure (`sqla_queue.wait_for`)."""


def notify_queues() -> Select[Any]:
    """`pg_notify` once per queue in `:queues`; delivered by PostgreSQL only on commit."""
    names = func.unnest(queue_names_param()).table_valued("name")
    return select(func.pg_notify(NOTIFY_CHANNEL, names.c.name)).select_from(names)


CANCEL_CHANNEL = f"{NOTIFY_CHANNEL}_cancel"
"""The channel on which a cancel names the running jobs it cancelled (comma-separated ids)."""

LISTEN = f'LISTEN "{NOTIFY_CHANNEL}"; LISTEN "{CANCEL_CHANNEL}"'
"""Not expressible in Core: the one plain-text statement, sent by the listener connection."""

LISTEN_RESULTS = f'LISTEN "{RESULTS_CHANNEL}"'
"""Not expressible in Core: what `sqla_queue.wait_for`'s listener connection sends."""


def notify_cancelled() -> Select[Any]:
    """`pg_notify(CANCEL_CHANNEL, :job_ids)`: running jobs that were cancelled, on commit."""
    return select(func.pg_notify(CANCEL_CHANNEL, bindparam("job_ids", type_=Text)))


def wake_sequence_successor(sequence: Any, job_id: Any) -> Any:
    """`pg_notify` on the queue of the next queued job of `sequence` (a column) after job
    `job_id`, when there is one (else NULL): the end of the job that held a sequence lets
    the next one start, and no other notification would wake an idle worker for it (it
    would wait out its poll interval, one job of the sequence per interval). One probe of
    `ix_jobs_sequence`; none for a job of no sequence."""
    n = jobs.alias("n")
    successor = (
        select(func.pg_notify(NOTIFY_CHANNEL, n.c.queue))
        .where(n.c.sequence == sequence, status_is(JobStatus.queued, n), n.c.id > job_id)
        .order_by(n.c.id)
        .limit(1)
        .scalar_subquery()
    )
    return case((sequence.is_not(None), successor))
