"""The handlers the benchmarks run: a no-op, and a probe that timestamps its own start."""

from __future__ import annotations

import threading
import time

from sqla_queue import Registry

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
