"""A claimed row becomes a job in two steps (issue 39, round 8): the dispatcher keeps only
what the board and the keeper read of every job; the args and the `JobContext` are made on
first use, by whichever thread asks first, once."""

from __future__ import annotations

import sys
import threading
from typing import Any

from sqla_queue.worker.jobs import ClaimColumns, ClaimedJob, ContextParts

KEYS = ["id", "task", "args_json", "attempts", "max_attempts", "queue", "status", "tags",
        "meta_json", "about"]  # fmt: skip


def _job(args_json: str = '{"n": 7}') -> ClaimedJob:
    row = (41, "t", args_json, 3, 5, "q", "running", ["a"], "{}", "orders:1")
    return ClaimedJob(row, ClaimColumns(KEYS), ContextParts(resources={"r": 1}))


def test_the_dispatcher_makes_only_what_every_job_needs_and_the_rest_on_first_use() -> None:
    job = _job()

    assert (job.id, job.attempt, job.key, job.task, job.queue, job.max_attempts) == (
        41, 3, (41, 3), "t", "q", 5,
    )  # fmt: skip
    assert job._ctx is None  # not built by the dispatcher
    assert job.args == {"n": 7}
    ctx = job.ctx
    assert (ctx.job_id, ctx.attempt, ctx.task, ctx.queue) == (41, 3, "t", "q")
    assert (ctx.tags, ctx.about, dict(ctx.resources)) == (["a"], "orders:1", {"r": 1})
    assert job.decode_error is None
    assert job.ctx is ctx


def test_a_row_whose_args_cannot_be_decoded_says_why_on_first_use() -> None:
    job = _job('{"n": ')

    assert job.args == {}
    assert job.decode_error is not None
    assert "cannot be decoded" in job.decode_error


def test_threads_asking_for_the_context_at_once_all_get_the_same_one() -> None:
    """Race, held on purpose: the handler thread and the keeper (a heartbeat, a cancel)
    may ask at the same moment; a second context would lose a cancel or a commit mark. The
    interpreter switches threads every microsecond here, so an unguarded build is caught."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _race_for_the_context()
    finally:
        sys.setswitchinterval(switch)


def _race_for_the_context() -> None:
    for _ in range(50):
        job = _job()
        start = threading.Barrier(8)
        seen: list[Any] = []

        def ask(
            job: ClaimedJob = job, start: threading.Barrier = start, seen: list[Any] = seen
        ) -> None:
            start.wait(10)
            seen.append(job.ctx)

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(seen) == 8
        assert all(ctx is seen[0] for ctx in seen)
