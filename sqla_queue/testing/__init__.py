"""Testing applications that use sqla-queue, against a real PostgreSQL.

- `enqueued_jobs`, `assert_enqueued`, `assert_not_enqueued`: what your code enqueued;
- `drain`: run due jobs in this thread with the real claim and finish statements (inside a
  test's transaction too); `run_until_empty`: a real burst-mode worker;
- `inline`: every commit runs the jobs it made due, for unit tests;
- `TemplateDatabases`, `find_test_server`: a migrated template database, a clone per test;
- `QueueHelper`: all of the above bound to one session and registry.

The pytest plugin (`sqla_queue.testing.pytest_plugin`, loaded by pytest's `pytest11` entry
point when sqla-queue is installed) gives fixtures built from these; see its docstring.
"""

from __future__ import annotations

from sqla_queue.testing.assertions import assert_enqueued, assert_not_enqueued, enqueued_jobs
from sqla_queue.testing.databases import TemplateDatabases, find_test_server
from sqla_queue.testing.drain import DRAIN_WORKER_ID, DrainResult, drain, run_until_empty
from sqla_queue.testing.helper import QueueHelper
from sqla_queue.testing.inline import inline

__all__ = [
    "DRAIN_WORKER_ID",
    "DrainResult",
    "QueueHelper",
    "TemplateDatabases",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued_jobs",
    "find_test_server",
    "inline",
    "run_until_empty",
]
