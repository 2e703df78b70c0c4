"""Logging of failed attempts: each retry at WARNING, each final failure at ERROR, with the
task, job id, attempt and traceback; a retry storm is summarised, not logged line by line.

Per task, at most `BURST` attempts are logged with their traceback in each `WINDOW`
seconds; beyond that they are counted, and one line per task reports how many were not
shown when the window closes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqla_queue.job.outcome import Outcome

log = logging.getLogger("sqla_queue.worker")

BURST = 10
WINDOW = 10.0


class FailureReporter:
    """Logs failed attempts with a per-task budget per window."""

    def __init__(self, burst: int = BURST, window: float = WINDOW) -> None:
        self.burst = burst
        self.window = window
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int, int]] = {}  # task: (start, shown, hidden)

    def report(self, outcome: Outcome, max_attempts: int) -> None:
        job = outcome.job
        now = time.monotonic()
        with self._lock:
            start, shown, hidden = self._windows.get(job.task, (now, 0, 0))
            if now - start >= self.window:
                if hidden:
                    log.warning(
                        "%d more failed attempt(s) of task %s were not logged in the last %.0f s",
                        hidden,
                        job.task,
                        now - start,
                    )
                start, shown, hidden = now, 0, 0
            show = shown < self.burst
            self._windows[job.task] = (start, shown + show, hidden + (not show))
        if not show:
            return
        last_line = outcome.error.rstrip().splitlines()[-1] if outcome.error else ""
        if outcome.retry_in is not None:
            log.warning(
                "job %s (%s) attempt %d of %d failed (%s); retrying in %.1f s\n%s",
                job.id,
                job.task,
                job.attempt,
                max_attempts,
                last_line,
                outcome.retry_in,
                outcome.error,
            )
        else:
            log.error(
                "job %s (%s) failed for good on attempt %d of %d (%s)\n%s",
                job.id,
                job.task,
                job.attempt,
                max_attempts,
                last_line,
                outcome.error,
            )
