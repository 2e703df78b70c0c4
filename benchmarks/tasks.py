"""The handlers the benchmarks run: a no-op, a probe that timestamps its own start, a
mark that writes its job's id and start time to a file (for processes of their own), and
the durable-execution jobs of benchmarks/durable.py (steps, sleeps, waits)."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

from sqlalchemy.orm import Session

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


# -- durable execution (benchmarks/durable.py) ------------------------------------------------

PARKED_FOR = timedelta(days=3)
"""How long `durable.sleeper` sleeps and `durable.waiter` waits: never over in a run."""


def step_work(i: int) -> dict[str, int]:
    """What every step of the step-cost jobs runs: a small JSON result, next to no work, so
    what a step adds is the recording."""
    return {"i": i}


def step_session_work(session: Session, i: int) -> dict[str, int]:
    """`step_work` as a `session=True` step: no statement of its own, the commit records it."""
    return {"i": i}


@registry.task(name="durable.direct")
def durable_direct(n: int) -> None:
    """Calls `step_work` `n` times, no step: the side steps are compared with."""
    for i in range(n):
        step_work(i)


@registry.task(name="durable.steps", pass_context=True)
def durable_steps(ctx: JobContext, n: int) -> None:
    """`n` recorded steps, each calling `step_work` once."""
    for i in range(n):
        ctx.step(f"s{i}", step_work, i)


@registry.task(name="durable.session_steps", pass_context=True)
def durable_session_steps(ctx: JobContext, n: int) -> None:
    """`n` recorded `session=True` steps."""
    for i in range(n):
        ctx.step(f"s{i}", step_session_work, i, session=True)


@registry.task(name="durable.sleeper", pass_context=True)
def durable_sleeper(ctx: JobContext) -> None:
    """Sleeps three days: a sleeping job for the claim to walk past."""
    ctx.sleep(PARKED_FOR, name="nap")


@registry.task(name="durable.waiter", pass_context=True)
def durable_waiter(ctx: JobContext, key: str) -> None:
    """Waits three days for signal `key`: a parked job for the claim to walk past."""
    ctx.wait_for_signal(key, timeout=PARKED_FOR)


signal_started: dict[int, float] = {}
"""seq -> time.perf_counter() when the run of `durable.signal_probe` that got its signal
started (same process only)."""
_entered: dict[int, float] = {}


@registry.task(name="durable.signal_probe", pass_context=True)
def signal_probe(ctx: JobContext, seq: int) -> None:
    """Waits for signal `probe:<seq>`; the run the signal wakes records when it started."""
    entered = time.perf_counter()
    _entered[seq] = entered  # every run's start; the last one is the woken run's
    ctx.wait_for_signal(f"probe:{seq}", timeout=PARKED_FOR)
    with probe_event:
        signal_started[seq] = _entered.pop(seq)
        probe_event.notify_all()
