"""Moved to `sqla_queue.job.failures` (the job core both runners share); kept for old imports."""

from sqla_queue.job.failures import BURST, WINDOW, FailureReporter

__all__ = ["BURST", "WINDOW", "FailureReporter"]
