"""Completing a job in the handler's own transaction: what `JobContext.session()` returns.

The session's `before_commit` hook runs the finishing statement of a succeeded job, fenced
on the job's id, attempt and `running` status, on the session's own connection: the
handler's writes, the follow-up jobs it enqueued and the job's completion commit together,
or not at all. If the attempt no longer holds the job (reaped while it was paused, or
cancelled), the statement finishes nothing, the hook raises `JobLostError`, and `commit()`
raises it with nothing committed. A savepoint's release (`begin_nested()`) is not the
commit: the job is finished by the transaction's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from sqla_queue.db import queries
from sqla_queue.db.savepoints import commits_the_transaction
from sqla_queue.errors import JobLostError

if TYPE_CHECKING:
    from sqla_queue.job.context import JobContext
    from sqla_queue.registry import Registry


def job_session(engine: Engine, ctx: JobContext, registry: Registry | None = None) -> Session:
    """A `Session` on `engine` whose commit finishes `ctx`'s job as succeeded (fenced).

    The worker gives it to `JobContext` as its session factory; once a commit succeeded,
    `ctx.committed` is True and the worker writes no outcome for the job, but for a task of
    `registry` that keeps its result: the commit keeps the job with `PENDING_RESULT` (by
    its queue's retention, as any kept result), and the worker stores what the handler
    returns in its place (`queries.store_results`); `wait_for` waits meanwhile.
    """
    session = Session(engine)
    fence: dict[str, list[Any]] = {"job_ids": [ctx.job_id], "job_attempts": [ctx.attempt]}
    task = registry.get(ctx.task) if registry is not None else None
    if task is not None and task.keep_result:
        fence["job_results"] = [queries.PENDING_RESULT]

    @event.listens_for(session, "before_commit")
    def finish_job(session: Session) -> None:
        if ctx.committed:  # a second commit of the same session: the job is finished
            return
        if not commits_the_transaction(session):  # a savepoint's release: not yet
            return
        if ctx.cancelled:  # timed out (its row stays running until it returns), or lost
            raise JobLostError(job_id=ctx.job_id)
        session.flush()  # the handler's rows first, then the job, one transaction
        finished = session.execute(queries.complete_jobs(), fence).scalar_one()
        if not finished:
            raise JobLostError(job_id=ctx.job_id)

    @event.listens_for(session, "after_commit")
    def mark_committed(session: Session) -> None:
        if commits_the_transaction(session):
            ctx.committed = True

    return session


__all__ = ["job_session"]
