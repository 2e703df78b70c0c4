"""`JobContext`: what a job's handler, its middleware and the lifecycle hooks receive.

Both runners (the table worker and the broker worker) make one per attempt; it carries the
job's identity, the shared resources, the cancel signal (`cancelled`) and, for a job that
has a row in PostgreSQL, the session that finishes it (`session()`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqla_queue.errors import ConfigurationError, JobCancelledError, JobLostError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["JobContext"]


class JobContext:
    """What middleware, hooks and handlers registered with `pass_context=True` receive.

    `attempt` is the fencing token: pass it to outside systems so that a write from a
    stale attempt (a worker that lost its lease and woke up late) can be rejected.
    `resources` are what the registry and the worker were given (an engine, a
    sessionmaker, a client), shared by every job: `ctx.resources["db"]`. `tags` and `meta`
    are the job's own, as enqueued (meta is decoded on first use).
    """

    __slots__ = (
        "_heartbeat",
        "_lost",
        "_meta",
        "_parent_results",
        "_session_factory",
        "_state",
        "attempt",
        "committed",
        "job_id",
        "queue",
        "resources",
        "tags",
        "task",
    )

    def __init__(
        self,
        job_id: int,
        task: str,
        queue: str,
        attempt: int,
        heartbeat: Callable[[JobContext], bool] | None = None,
        resources: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        meta: Mapping[str, Any] | str | None = None,
        session_factory: Callable[[JobContext], Session] | None = None,
        parent_results: Callable[[JobContext], list[Any]] | None = None,
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.resources: Mapping[str, Any] = resources if resources is not None else {}
        self._state: dict[str, Any] | None = None
        self._heartbeat = heartbeat
        self._lost: str | None = None
        self.tags: list[str] = list(tags or ())
        """The job's tags."""
        self._meta = meta
        self._session_factory = session_factory
        self._parent_results = parent_results
        self.committed = False
        """True once a `session()` of this job committed: the job is finished already."""

    @property
    def meta(self) -> dict[str, Any]:
        """The job's meta (a dict; empty if it has none), decoded from the claim's JSON text
        on first use, so a job whose meta is never read never pays for it."""
        meta = self._meta
        if not isinstance(meta, dict):
            decoded = json.loads(meta) if isinstance(meta, str) else meta
            meta = self._meta = dict(decoded) if isinstance(decoded, Mapping) else {}
        return meta

    @property
    def state(self) -> dict[str, Any]:
        """Scratch space for middleware and hooks of this one job (e.g. a start time)."""
        if self._state is None:
            self._state = {}
        return self._state

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out, or its lease was lost: stop and return."""
        return self._lost is not None

    @property
    def lost_reason(self) -> str | None:
        """Why the job is no longer this worker's: "cancelled", "lost", "timed out", or None."""
        return self._lost

    def raise_if_cancelled(self) -> None:
        """Raise `JobCancelledError` (cancelled) or `JobLostError` (reaped, timed out, or the
        worker stopping), for long loops."""
        if self._lost == "cancelled":
            raise JobCancelledError(job_id=self.job_id)
        if self._lost is not None:
            raise JobLostError(job_id=self.job_id)

    def heartbeat(self) -> bool:
        """Extend this job's lease now; returns False if the worker no longer holds it."""
        if self._heartbeat is None:
            return self._lost is None
        return self._heartbeat(self)

    def session(self) -> Session:
        """A new SQLAlchemy `Session` on the job's database whose commit also finishes this
        job as succeeded, in the same transaction (as River's `JobCompleteTx`).

        Write your rows (and enqueue follow-up jobs) in it and commit: either all of it
        commits with the job marked succeeded (by its queue's retention), or none of it
        does. The finishing statement is fenced on the job's id, attempt and `running`
        status: if this attempt no longer holds the job (its lease expired and it was
        reaped, or it was cancelled), `commit()` raises `JobLostError` and the writes roll
        back. The worker does not finish the job again; when the task has `keep_result`,
        what the handler returns is stored in place of the result the commit left pending.
        Use it as a context manager (`with ctx.session() as session:`) and commit once; a
        session that is never committed changes nothing.
        """
        if self._session_factory is None:
            raise ConfigurationError(
                detail="ctx.session() needs a job run by a worker (or sqla_queue.testing."
                "drain) that knows the job's database; this context has none"
            )
        return self._session_factory(self)

    def parent_results(self) -> list[Any]:
        """The results of the jobs this one depends on, in its `depends_on` order (a
        chord's callback: its group's, in the group's order): each one's kept result (its
        task has `keep_result=True`), None for one that kept none (or did not succeed, for
        a job with `on_failure="run"`). An empty list for a job without dependencies.

        Read from the database on each call (the jobs table, else the archive)."""
        if self._parent_results is None:
            raise ConfigurationError(
                detail="ctx.parent_results() needs a job run by a worker (or sqla_queue."
                "testing.drain) that knows the job's database; this context has none"
            )
        return self._parent_results(self)

    def resource(self, name: str) -> Any:
        """The resource named `name`, or a `ConfigurationError` naming the ones there are."""
        try:
            return self.resources[name]
        except KeyError:
            known = ", ".join(sorted(self.resources)) or "none"
            raise ConfigurationError(
                detail=f"no resource named {name!r} (known: {known}); pass it as "
                f"Registry(resources={{{name!r}: ...}}) or WorkerConfig(resources=...)"
            ) from None

    def mark_lost(self, reason: str = "lost") -> None:
        """Called by the worker when the job is no longer its own (the first reason stays)."""
        if self._lost is None:
            self._lost = reason

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, task={self.task!r}, attempt={self.attempt})"
