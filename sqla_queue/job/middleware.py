"""Middleware: functions wrapped around every execution of a job, sync and async alike.

A middleware is `def mw(ctx: JobContext, call_next: Callable[[], Any]) -> Any`. `call_next()`
runs the rest of the chain and the handler and returns the handler's result (or raises its
exception). A middleware may observe, time, wrap the call in a span or a transaction, change
nothing, raise to fail the attempt (it is retried by the task's rules), or return without
calling `call_next` to skip the handler (the job then counts as succeeded).

One protocol serves both kinds of handler: middleware always runs on a handler thread.
For an `async def` handler, `call_next()` runs the coroutine on the worker's event loop
and waits for it, so the middleware sees its result, not a coroutine.

Order: the registry's middleware (in list order) wraps the task's own (in list order),
which wraps the handler: `Registry(middleware=[a, b])` with `@task(middleware=[c])` runs
a -> b -> c -> handler -> c -> b -> a.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqla_queue.job.context import JobContext

CallNext = Callable[[], Any]
Middleware = Callable[["JobContext", CallNext], Any]


def compose(
    middleware: Sequence[Middleware], call: Callable[[JobContext], Any]
) -> Callable[[JobContext], Any]:
    """One callable that runs `call(ctx)` inside every middleware, the first outermost."""
    wrapped = call
    for mw in reversed(middleware):
        wrapped = _wrap(mw, wrapped)
    return wrapped


def _wrap(mw: Middleware, inner: Callable[[JobContext], Any]) -> Callable[[JobContext], Any]:
    def run(ctx: JobContext) -> Any:
        return mw(ctx, lambda: inner(ctx))

    return run
