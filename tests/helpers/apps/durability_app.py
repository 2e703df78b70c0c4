"""The task registry of the server-crash test (tests/worker/test_durability.py), run in a real
`sqla-queue worker` process.

Its handler appends the job's id and attempt to the file named by $DURABILITY_RUNS: a
record outside the database the test crashes, so that no commit of the record makes the
worker's own asynchronous commits durable before the crash.

Run as `sqla-queue worker --app helpers.apps.durability_app:registry` with tests/ on PYTHONPATH.
"""

from __future__ import annotations

import os
import threading

from sqla_queue import JobContext, Registry, RetryPolicy

registry = Registry()

_lock = threading.Lock()


@registry.task(
    name="record_run", pass_context=True, max_attempts=100, retry=RetryPolicy(base=0.0, jitter=0.0)
)
def record_run(ctx: JobContext, n: int) -> None:
    """Append "job_id attempt" to the runs file, one line per execution."""
    with _lock, open(os.environ["DURABILITY_RUNS"], "a") as runs:
        runs.write(f"{ctx.job_id} {ctx.attempt}\n")
