"""Tasks for the metrics, tracing and log tests: `--app helpers.apps.observed:registry`."""

from __future__ import annotations

from sqla_queue import JobContext, Registry, RetryPolicy

registry = Registry()

NO_WAIT = RetryPolicy(base=0.0, jitter=0.0)


@registry.task(name="ok")
def ok(n: int = 0) -> int:
    """Succeeds."""
    return n


@registry.task(name="flaky", pass_context=True, max_attempts=3, retry=NO_WAIT)
def flaky(ctx: JobContext) -> None:
    """Fails its first attempt, succeeds on the second."""
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


@registry.task(name="boom", max_attempts=1)
def boom() -> None:
    """Fails for good on its only attempt."""
    raise ValueError("always fails")
