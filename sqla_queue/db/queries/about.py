"""Jobs about a row (`enqueue(..., about=order)`, `sqla_queue.orm`): the cancel when the row
is deleted."""

from __future__ import annotations

from sqlalchemy import Text, Update, bindparam, func, update

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
