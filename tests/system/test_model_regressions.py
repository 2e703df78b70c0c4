"""Examples the model-based test (tests/system/test_model.py) found, kept as plain tests.

Each replays the shrunk steps Hypothesis printed on a `QueueMachine` of its own database,
checking the model's invariants after every step, as the state machine does. Each names
the defect it found (those of issue 20, of issue 24's claim and of issue 33: all fixed since).
"""

from __future__ import annotations

from typing import Any

import pytest

from system.model_kit import replay
from system.test_model import QueueMachine


def job(task: str, b: str, queue: str = "default", letter: str | None = None, **more: Any) -> Any:
    return {
        "tb": (task, b),
        "queue": queue,
        "letter": letter,
        "delay": more.get("delay"),
        "max_attempts": more.get("max_attempts"),
        "partition": more.get("partition"),
        "sequence": more.get("sequence"),
        "priority": more.get("priority"),
    }


# defect 1.6 of issue 20
def test_wait_for_with_timeout_0_reports_a_cancelled_job(machine: QueueMachine) -> None:
    replay(
        machine,
        ("enqueue", {"spec": job("plain", "ok"), "via": "connection"}),
        ("cancel", {"indices": [0]}),
        ("poll_result", {"index": 0}),
    )


# defect 1.1 of issue 20
def test_retry_of_two_failed_jobs_sharing_a_unique_key(machine: QueueMachine) -> None:
    replay(
        machine,
        ("enqueue", {"spec": job("plain", "fail", letter="a", max_attempts=1), "via": "task"}),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
        ("enqueue", {"spec": job("plain", "fail", letter="a", max_attempts=1), "via": "task"}),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
        ("retry", {"indices": None, "queue": None, "attempts": None}),
    )


# defect 1.2 of issue 20
def test_a_kept_result_jsonb_refuses_is_a_failure_written_at_once(machine: QueueMachine) -> None:
    replay(
        machine,
        ("enqueue", {"spec": job("kept", "surrogate"), "via": "connection"}),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
    )


# defect 1.3 of issue 20
def test_a_huge_result_ttl_does_not_stop_the_reaper(machine: QueueMachine) -> None:
    replay(
        machine,
        ("result_ttl", {"queue": "default", "seconds": 99999999999999 * 7 * 86400.0}),
        ("enqueue", {"spec": job("kept", "ok"), "via": "connection"}),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
        ("reaper", {}),
    )


# defect 1.5 of issue 20
def test_a_timed_out_handler_keeps_its_queue_slot(machine: QueueMachine) -> None:
    replay(
        machine,
        (
            "enqueue_many",
            {"specs": [job("timed", "slow", queue="lim"), job("timed", "ok", queue="lim")]},
        ),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
    )


# defect 1.7 of issue 20
def test_a_kept_result_of_a_handler_that_commits_its_session(machine: QueueMachine) -> None:
    replay(
        machine,
        ("enqueue", {"spec": job("kept", "session", queue="keep"), "via": "connection"}),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
    )


# found by the model under load: a sync handler that returned after its timeout, before the
# producer's watch saw the deadline pass, was settled as a success
def test_a_handler_that_overran_its_timeout_is_not_a_success(machine: QueueMachine) -> None:
    """Found on a loaded machine (load average 12 on 2 cores): the `slow` job (0.4 s on a
    0.15 s timeout) ended `done` (archived): the producer's watch (`Producer._time_out`) was
    in a statement when the handler returned late. Now the handler's own thread compares
    the clock with the deadline (`Executor._past_deadline`); a deterministic version is
    tests/worker/test_worker_handlers.py::
    test_a_handler_that_returns_past_its_deadline_unseen_by_a_busy_worker_timed_out."""
    replay(
        machine,
        ("prune", {"archive": False, "older_than": 0.0, "statuses": {"done"}}),
        ("enqueue_many", {"specs": [job("plain", "ok", queue="arch")] * 2}),
        (
            "enqueue_many",
            {
                "specs": [
                    job("timed", "slow", queue="arch"),
                    job("plain", "ok", queue="lim", max_attempts=1),
                ]
            },
        ),
        ("time_passes", {"seconds": 200000.0}),
        ("work", {"batch": 5, "concurrency": 2, "served": None}),
    )


# Defects of issue 24's claim the model found (fixed: `claim_turns` and `sequence_free`);
# the replays run with none of the model's excuses.


ONCE = {"max_attempts": 1}


def enqueue_one(spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("enqueue", {"spec": spec, "via": "connection"})


def replay_unexcused(state: QueueMachine, *steps: tuple[str, dict[str, Any]]) -> None:
    """`replay` with none of the model's known defects excused."""
    state.excused = frozenset()
    replay(state, *steps)


def test_a_retried_job_of_a_sequence_waits_for_the_later_one_running(
    machine: QueueMachine,
) -> None:
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", sequence="s1")),
        enqueue_one(job("plain", "ok", sequence="s1")),
        ("cancel", {"indices": [0]}),
        ("kill_worker", {"limit": 1, "started": True}),  # job 2 runs (its worker died)
        ("retry", {"indices": [0], "queue": None, "attempts": None}),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),  # job 1 starts
    )


def test_a_delayed_job_of_a_fair_queue_does_not_starve_another_partition(
    machine: QueueMachine,
) -> None:
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", queue="keep", partition="p2")),
        ("kill_worker", {"limit": 1, "started": True}),  # p2 has one running
        enqueue_one(job("plain", "ok", queue="keep", partition="p1", delay=3600.0)),
        enqueue_one(job("plain", "ok", queue="keep", partition="p2")),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),  # leaves p2's due job
    )


def test_a_claim_over_several_queues_keeps_a_fair_queues_turns(machine: QueueMachine) -> None:
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", queue="keep", partition="p1")),
        enqueue_one(job("plain", "ok", queue="keep", partition="p1")),
        enqueue_one(job("plain", "ok")),
        enqueue_one(job("plain", "ok", queue="keep", partition="p2")),
        ("kill_worker", {"limit": 3, "started": True}),  # takes p1's two, not p2's one
    )


# Defects of issue 33 the model's progress and race checks found (defects 2 and 3), fixed:
# their replays run without the excuses.


def test_partitions_held_by_their_sequences_do_not_starve_another_partition(
    machine: QueueMachine,
) -> None:
    """p1 and p2 were served first; their next jobs wait behind the failed jobs of their
    sequences (the queue holds them). p3 was served last, so it is not among the 2 least
    served partitions a claim of one reads: a worker serving "keep" claims nothing."""
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "fail", queue="keep", partition="p1", sequence="s1", **ONCE)),
        enqueue_one(job("plain", "fail", queue="keep", partition="p2", sequence="s2", **ONCE)),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
        enqueue_one(job("plain", "ok", queue="keep", partition="p3")),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
        enqueue_one(job("plain", "ok", queue="keep", partition="p1", sequence="s1")),
        enqueue_one(job("plain", "ok", queue="keep", partition="p2", sequence="s2")),
        enqueue_one(job("plain", "ok", queue="keep", partition="p3")),
    )


def race(held: str, beside: str, spec: dict[str, Any], commit: bool = True, **more: Any) -> Any:
    draw = {
        "spec": spec,
        "indices": more.get("indices", [0]),
        "kinds": more.get("kinds", ["cancel"] * 3),
        "limit": more.get("limit", 1),
        "mode": more.get("mode", "replace"),
        "outcome": more.get("outcome", "done"),
        "attempts": more.get("attempts"),
    }
    return ("race", {"held": held, "beside": beside, "commit": commit, **draw})


def test_a_replacing_enqueue_beside_a_held_claim_of_its_holder_returns(
    machine: QueueMachine,
) -> None:
    """The claim of the holder is held open while a `replace` enqueue of its key runs: the
    enqueue waits for the claim (its INSERT meets the claim's new row version), then lets
    the running holder's key go and writes a new job. (Defect 1 of issue 33 needs the claim
    to land between that INSERT and the enqueue's UPDATE, a point no held transaction
    reaches; its own test holds the enqueue there.)"""
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", letter="a")),
        race("claim", "replace", job("plain", "ok", letter="a")),
    )


def test_a_job_cancelled_while_it_runs_keeps_its_sequence(machine: QueueMachine) -> None:
    """Job 1 of s1 runs on a (killed) worker and is cancelled: its handler still runs until
    the worker sees the cancel (or the reaper clears its lease), so job 2 must wait."""
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", sequence="s1")),
        enqueue_one(job("plain", "ok", sequence="s1")),
        ("kill_worker", {"limit": 1, "started": True}),  # job 1 runs
        ("cancel", {"indices": [0]}),
        ("kill_worker", {"limit": 1, "started": True}),  # takes job 2
    )


def test_a_job_cancelled_while_it_runs_keeps_its_partition_slot(machine: QueueMachine) -> None:
    replay_unexcused(
        machine,
        ("take_turns", {"queue": "default", "setting": ("partition_limit", 1)}),
        enqueue_one(job("plain", "ok", partition="p1")),
        enqueue_one(job("plain", "ok", partition="p1")),
        ("kill_worker", {"limit": 1, "started": True}),  # job 1 runs
        ("cancel", {"indices": [0]}),
        ("kill_worker", {"limit": 1, "started": True}),  # takes job 2
    )


# Races of issue 33, section 3 (tests/system/model_races.py): each holds one command after its
# statements while another runs on the same job; every invariant runs after.


def test_a_cancel_beside_a_held_claim_of_its_job(machine: QueueMachine) -> None:
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", sequence="s1")),
        enqueue_one(job("plain", "ok", sequence="s1")),
        race("claim", "cancel", job("plain", "ok"), indices=[0]),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
    )


def test_a_retry_beside_a_held_finish_that_fails_the_job(machine: QueueMachine) -> None:
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", queue="keep")),
        ("kill_worker", {"limit": 1, "started": True}),
        race("finish", "retry", job("plain", "ok"), indices=[0], outcome="failed"),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
    )


@pytest.mark.parametrize(("held", "beside"), [("dependent", "cancel"), ("cancel", "dependent")])
def test_an_enqueue_with_depends_on_beside_the_cancel_of_its_parent(
    machine: QueueMachine, held: str, beside: str
) -> None:
    replay_unexcused(
        machine,
        enqueue_one(job("plain", "ok", queue="keep")),
        race(held, beside, job("plain", "ok", queue="keep"), indices=[0]),
        ("work", {"concurrency": 1, "batch": 1, "served": None}),
    )
