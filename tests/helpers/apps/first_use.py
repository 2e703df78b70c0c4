"""Tasks a new user's first worker runs: `sqla-queue worker --app helpers.apps.first_use:registry`.

`fail_once` raises on its first attempt and is retried after `first_use.RETRY_AFTER`
seconds (no jitter); the tests read when it is due again from the job row.
"""

from __future__ import annotations

from sqla_queue import JobContext, Registry, RetryPolicy

registry = Registry()

RETRY_AFTER = 2.0


@registry.task(
    name="first_use.fail_once", pass_context=True, retry=RetryPolicy(base=RETRY_AFTER, jitter=0)
)
def fail_once(ctx: JobContext) -> None:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")


@registry.task(name="first_use.pick")
def pick(a: int) -> int:
    return a
