"""Jobs about a row (`enqueue(..., about=order)`, `sqla_queue.orm`): the cancel when the row
is deleted."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, Text, Update, bindparam, func, select, update

from sqla_queue.db.queries.common import jobs
from sqla_queue.job.states import NOT_STARTED, JobStatus


def cancel_jobs_about() -> Update:
    """Cancel the jobs about row `:about_key` that no handler has started (queued,
    waiting), with `:reason` as their error; returns their ids. By the partial index
    `ix_jobs_about`; the jobs that depend on them are cancelled by the workflow trigger."""
    return (
        update(jobs)
        .where(
            jobs.c.about == bindparam("about_key", type_=Text),
            jobs.c.status.in_(NOT_STARTED),
        )
        .values(
            status=JobStatus.cancelled.value,
            finished_at=func.now(),
            last_error=bindparam("reason", type_=Text),
        )
        .returning(jobs.c.id)
    )


def later_job_about() -> Select[Any]:
    """The id of a job of task `:job_task` about row `:about_key`, enqueued after job
    `:job_id` and not finished (None: there is none): what `changed="latest"` asks (a later
    job loads the row as it is when it starts)."""
    return (
        select(jobs.c.id)
        .where(
            jobs.c.about == bindparam("about_key", type_=Text),
            jobs.c.task == bindparam("job_task", type_=Text),
            jobs.c.id > bindparam("job_id"),
            jobs.c.status.in_(
                [JobStatus.queued.value, JobStatus.waiting.value, JobStatus.running.value]
            ),
        )
        .order_by(jobs.c.id.desc())
        .limit(1)
    )
