"""The handlers the benchmarks run: a no-op, a probe that timestamps its own start, and a
mark that writes its job's id and start time to a file (for processes of their own)."""

from __future__ import annotations

import os
import threading
import time

from sqla_queue import JobContext, Registry

registry = Registry()

probe_started: dict[int, float] = {}
"""seq -> time.perf_counter() when the probe handler started (same process only)."""
probe_event = threading.Condition()


@registry.task(name="noop")
def noop(n: int = 0) -> None:
    """Does nothing: what is left is the queue's own cost."""


@registry.task(name="probe")
def probe(seq: int) -> None:
    """Records when it started, for commit-to-start latency."""
    started = time.perf_counter()
    with probe_event:
        probe_started[seq] = started
        probe_event.notify_all()


MARKS_ENV = "SQLAQ_BENCH_MARKS"
"""The folder where `mark` appends "job_id epoch_seconds" lines, one file per process."""
_marks: dict[int, int] = {}


@registry.task(name="mark", pass_context=True)
def mark(ctx: JobContext) -> None:
    """Appends its job id and `time.time()` at its start to $SQLAQ_BENCH_MARKS/<pid> (one
    write(2) of one line, O_APPEND: a few microseconds, no database round trip)."""
    started = time.time()
    pid = os.getpid()
    fd = _marks.get(pid)
    if fd is None:
        path = os.path.join(os.environ[MARKS_ENV], str(pid))
        fd = _marks[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"{ctx.job_id} {started:.6f}\n".encode())
