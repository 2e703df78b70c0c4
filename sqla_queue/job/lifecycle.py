"""Lifecycle hooks: functions called at moments that are not around a call.

    @registry.on_job_claimed
    def claimed(ctx: JobContext) -> None: ...

    @registry.on_job_finished
    def finished(ctx: JobContext, outcome: Outcome) -> None: ...   # outcome.kind says how

    @registry.on_worker_started / @registry.on_worker_stopping
    def started(worker: Worker) -> None: ...

A hook runs on the worker thread where the moment happens (claims on the dispatcher,
finishes on the handler thread or the dispatcher), so keep it quick. An exception in a
hook is logged and otherwise ignored: a hook cannot fail or lose a job.

The job hooks fire under both runners (`JobRunner.claimed`/`finished` in the job core):
the table worker and `worker --from nats|amqp`, whose hooks run on its event loop. The
worker hooks receive a table `Worker` and fire only there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqla_queue.job.context import JobContext
    from sqla_queue.job.outcome import Outcome

log = logging.getLogger("sqla_queue.lifecycle")

JobClaimedHook = Callable[["JobContext"], Any]
JobFinishedHook = Callable[["JobContext", "Outcome"], Any]
WorkerHook = Callable[[Any], Any]
"""Called with the table worker (`sqla_queue.Worker`) that started or is stopping. Typed `Any`
here: the job core sits below the worker and does not import it; annotate a hook's parameter
as `Worker`."""


class LifecycleHooks:
    """The hooks registered on one `Registry`, by moment."""

    def __init__(self) -> None:
        self.job_claimed: list[JobClaimedHook] = []
        self.job_finished: list[JobFinishedHook] = []
        self.worker_started: list[WorkerHook] = []
        self.worker_stopping: list[WorkerHook] = []

    def emit(self, hooks: list[Callable[..., Any]], *args: Any) -> None:
        """Call each hook with `args`; log (never raise) what one of them raises."""
        for hook in hooks:
            try:
                hook(*args)
            except Exception:
                log.exception("lifecycle hook %s raised; ignored", getattr(hook, "__name__", hook))
