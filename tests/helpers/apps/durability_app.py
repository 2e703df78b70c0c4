"""The task registry of the server-crash test (tests/worker/test_durability.py), run in a real
`sqla-queue worker` process.

Its handler appends the job's id and attempt to the file named by $DURABILITY_RUNS: a
record outside the database the test crashes, so that no commit of the record makes the
worker's own asynchronous commits durable before the crash. With $DURABILITY_GATE (a path)
and $DURABILITY_GATE_FROM (a number), a job whose `n` is that number or more waits for the
path to exist first (at most 120 s): the drain stops midway until the test opens the gate,
so its crash comes mid-drain however fast the worker runs.

Run as `sqla-queue worker --app helpers.apps.durability_app:registry` with tests/ on PYTHONPATH.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sqla_queue import JobContext, Registry, RetryPolicy

registry = Registry()

_lock = threading.Lock()


@registry.task(
    name="record_run", pass_context=True, max_attempts=100, retry=RetryPolicy(base=0.0, jitter=0.0)
)
def record_run(ctx: JobContext, n: int) -> None:
    """Append "job_id attempt" to the runs file, one line per execution."""
    gate = os.environ.get("DURABILITY_GATE")
    if gate and n >= int(os.environ["DURABILITY_GATE_FROM"]):
        deadline = time.monotonic() + 120
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    with _lock, open(os.environ["DURABILITY_RUNS"], "a") as runs:
        runs.write(f"{ctx.job_id} {ctx.attempt}\n")
