"""The model's durable rules (issue 36), each driven through a scenario that a random run
may take long to find: signals sent before and after a wait, committed and rolled back; a
wait's timeout; sleeps woken by the keeper as time passes; cancels of sleeping and waiting
jobs; steps jobs whose worker was killed, reaped and run again; steps jobs whose worker
was killed between two steps (after the first, after the last, twice in a row), whose
retry resumes after the last recorded step; journey jobs (an outside step, a database-only
step, a sleep and a wait, in three orders) whose worker was killed between any two of their
stages, signalled before the wait, while parked or never (their wait times out). Every
invariant of the state machine is checked after every step, as it runs them."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlalchemy import text

from system.model_kit import JOURNEYS, STEP_ROWS, replay
from system.test_model import QueueMachine

WORK = {"concurrency": 2, "batch": 5, "served": None}


def durable(b: str, queue: str = "keep") -> dict[str, Any]:
    return {
        "tb": ("plain", b),
        "queue": queue,
        **dict.fromkeys(("letter", "delay", "max_attempts", "priority", "partition", "sequence")),
    }


def status(state: QueueMachine, index: int = 0) -> str:
    return state.seen[sorted(state.jobs)[index]].status


def test_a_signal_committed_before_the_wait_is_its_answer(machine: QueueMachine) -> None:
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("wait")}),
        ("send_signal", {"index": 0, "commit": False}),
        ("send_signal", {"index": 0, "commit": True}),
        ("work", WORK),
    )
    assert status(machine) == "done"
    (got,) = machine.recorder.signal_seen.values()
    assert got == [{"s": 2}]  # the committed one, never the rolled-back one


def test_a_parked_wait_is_woken_by_a_committed_signal_not_a_rolled_back_one(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("wait")}),
        ("work", WORK),
    )
    assert machine.seen[sorted(machine.jobs)[0]].parked == "signal"
    replay(machine, ("send_signal", {"index": 0, "commit": False}))
    assert status(machine) == "waiting"
    replay(
        machine,
        ("send_signal", {"index": 0, "commit": True}),
        ("work", WORK),
        ("send_signal", {"index": 0, "commit": True}),  # after the answer: kept, unread
        ("work", WORK),
    )
    assert status(machine) == "done"
    (got,) = machine.recorder.signal_seen.values()
    assert got == [{"s": 2}]


def test_a_wait_times_out_once_its_deadline_passes_and_the_keeper_looks(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("wait")}),
        ("work", WORK),
        ("keeper", {}),
        ("time_passes", {"seconds": 40.0}),
        ("keeper", {}),
    )
    assert status(machine) == "queued"
    replay(machine, ("work", WORK), ("send_signal", {"index": 0, "commit": True}))
    assert list(machine.recorder.signal_seen.values()) == [["timed out"]]


def test_a_sleep_is_parked_then_woken_by_the_keeper_as_time_passes(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("sleep")}),
        ("work", WORK),
        ("keeper", {}),
    )
    assert machine.seen[sorted(machine.jobs)[0]].parked == "sleep"
    replay(machine, ("time_passes", {"seconds": 40.0}), ("keeper", {}), ("work", WORK))
    assert status(machine) == "done"


def test_sleeping_and_waiting_jobs_are_cancelled_for_good(machine: QueueMachine) -> None:
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("sleep")}),
        ("enqueue_durable", {"spec": durable("wait")}),
        ("work", WORK),
        ("cancel", {"indices": [0, 1]}),
        ("send_signal", {"index": 0, "commit": True}),
        ("time_passes", {"seconds": 40.0}),
        ("keeper", {}),
        ("work", WORK),
    )
    assert [status(machine, 0), status(machine, 1)] == ["cancelled", "cancelled"]


def test_steps_jobs_of_a_killed_worker_are_reaped_and_record_each_step_once(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("steps")}),
        ("enqueue_durable", {"spec": durable("steps")}),
        ("kill_worker", {"limit": 2, "started": True}),
        ("time_passes", {"seconds": 40.0}),
        ("reaper", {}),
        ("work", WORK),
    )
    assert {status(machine, 0), status(machine, 1)} == {"done"}


def outside_runs(state: QueueMachine) -> list[tuple[int, int]]:
    with state.recorder.lock:
        return list(state.recorder.outside)


def finishing_attempts(state: QueueMachine, job_id: int) -> list[int]:
    """The attempts of a job whose handler ran to its end (not a killed worker's)."""
    with state.recorder.lock:
        runs = state.recorder.runs.values()
        return sorted(r.attempt for r in runs if r.job_id == job_id and r.ended and not r.raised)


def db_rows(state: QueueMachine) -> list[tuple[int, int]]:
    with state.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT job_id, attempt FROM {STEP_ROWS}"))]


REAPED = (("time_passes", {"seconds": 40.0}), ("reaper", {}))
"""The killed worker's lease ends and the reaper gives its jobs back."""


def test_a_worker_killed_after_a_recorded_step_is_resumed_after_it(machine: QueueMachine) -> None:
    """Killed between the outside step (recorded) and the database-only one: the retry gets
    the outside step's recorded result without running it, then runs the rest, once."""
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("steps")}),
        ("kill_between_steps", {"limit": 1, "upto": 1}),
    )
    (job_id,) = machine.jobs
    assert status(machine) == "running"
    assert outside_runs(machine) == [(job_id, 1)]
    assert db_rows(machine) == []
    replay(machine, *REAPED, ("work", WORK))
    assert status(machine) == "done"
    assert outside_runs(machine) == [(job_id, 1)]  # the recorded step did not run again
    assert machine.recorder.step_seen[job_id] == [{"attempt": 1}, {"attempt": 1}]
    assert db_rows(machine) == [(job_id, 2)]
    assert finishing_attempts(machine, job_id) == [2]


def test_a_worker_killed_after_its_last_step_leaves_the_retry_nothing_to_run(
    machine: QueueMachine,
) -> None:
    replay(
        machine,
        ("enqueue_durable", {"spec": durable("steps")}),
        ("kill_between_steps", {"limit": 1, "upto": 2}),
        *REAPED,
        ("work", WORK),
    )
    (job_id,) = machine.jobs
    assert status(machine) == "done"
    assert outside_runs(machine) == [(job_id, 1)]
    assert machine.recorder.step_seen[job_id] == [{"attempt": 1}, {"attempt": 1}]
    assert db_rows(machine) == [(job_id, 1)]  # written once, by the killed attempt
    assert finishing_attempts(machine, job_id) == [2]


def test_two_kills_in_a_row_between_steps_each_resume_after_the_last_record(
    machine: QueueMachine,
) -> None:
    """Attempt 1 dies after step 1; attempt 2 replays it, records step 2 and dies too;
    attempt 3 replays both and finishes. Beside them, a plain job the kills claim."""
    replay(
        machine,
        ("enqueue_durable", {"spec": {**durable("steps"), "max_attempts": 3}}),
        ("kill_between_steps", {"limit": 1, "upto": 1}),
        *REAPED,
        ("kill_between_steps", {"limit": 1, "upto": 2}),
        *REAPED,
        ("work", WORK),
    )
    (job_id,) = machine.jobs
    assert status(machine) == "done"
    assert outside_runs(machine) == [(job_id, 1)]
    assert machine.recorder.step_seen[job_id] == [{"attempt": 1}] * 3
    assert db_rows(machine) == [(job_id, 2)]
    assert finishing_attempts(machine, job_id) == [3]


def test_a_kill_between_steps_takes_other_jobs_too_and_the_kept_result_is_the_steps(
    machine: QueueMachine,
) -> None:
    """A kill that claims two steps jobs (one of the kept task) runs each one's first step;
    a worker then finishes both, the kept one keeping its result."""
    replay(
        machine,
        ("enqueue_durable", {"spec": {**durable("steps"), "tb": ("kept", "steps")}}),
        ("enqueue_durable", {"spec": durable("steps")}),
        ("kill_between_steps", {"limit": 2, "upto": 1}),
        *REAPED,
        ("work", WORK),
    )
    assert {status(machine, 0), status(machine, 1)} == {"done"}
    kept = machine.seen[sorted(machine.jobs)[0]]
    assert kept.result == {"n": machine.jobs[kept.id].n}
    assert sorted(outside_runs(machine)) == [(job_id, 1) for job_id in sorted(machine.jobs)]
    assert sorted(db_rows(machine)) == [(job_id, 2) for job_id in sorted(machine.jobs)]


ROUND = (
    ("time_passes", {"seconds": 40.0}),
    ("reaper", {}),
    ("keeper", {}),
    ("work", WORK),
)
"""Time passes past a sleep's end, a wait's deadline, a retry's wait and a killed worker's
lease; the reaper and the keeper look; a worker runs what is due."""


def journey_of(state: QueueMachine, order: int, queue: str) -> int:
    """Enqueue a `journey` job whose stages run in `JOURNEYS[order]`; its id."""
    # its n: n % 3 == order, and no other job's (its signal key is its own)
    state.numbers = itertools.count(order + len(JOURNEYS) * (len(state.jobs) + 1))
    before = set(state.jobs)
    replay(state, ("enqueue_durable", {"spec": durable("journey", queue)}))
    (job_id,) = set(state.jobs) - before
    assert state.jobs[job_id].n % len(JOURNEYS) == order
    return job_id


@pytest.mark.parametrize("upto", [1, 2, 3, 4])
@pytest.mark.parametrize("order", range(len(JOURNEYS)))
def test_a_worker_killed_between_any_two_stages_of_a_journey_resumes_it_once(
    machine: QueueMachine, order: int, upto: int
) -> None:
    """A job of an outside step, a database-only step, a sleep and a wait (in three orders
    that put every kind of stage beside every other) whose worker is SIGKILLed after its
    first `upto` stages: the killed run's record stands (a sleep recorded but not parked, a
    wait parked in its own transaction or answered), the job runs to its end once, its
    outside step ran once and every run saw its recorded result, its database-only row
    exists once, and its wait's answer is the one signal committed (before the wait, or
    while it is parked) or its timeout, never the rolled-back one; a signal sent after the
    answer stays in the mailbox. Every invariant is checked after every step."""
    job_id = journey_of(machine, order, "keep" if upto % 2 else "default")
    signalled = (order + upto) % 2 == 0
    replay(machine, ("kill_between_steps", {"limit": 1, "upto": upto}))
    stages = JOURNEYS[order][:upto]
    if "wait" in stages and "sleep" not in stages[: stages.index("wait")]:
        assert machine.seen[job_id].parked == "signal"  # its run ended in the wait's park
    elif "sleep" in stages:
        assert machine.seen[job_id].status == "running"  # its sleep recorded, not parked
    replay(machine, ("send_signal", {"index": 0, "commit": False}))
    if signalled:
        replay(machine, ("send_signal", {"index": 0, "commit": True}))
    for _ in range(8):
        row = machine.seen.get(job_id)
        if row is None or row.status == "done":
            break
        replay(machine, *ROUND)
    row = machine.seen.get(job_id)
    assert row is None or row.status == "done", row  # gone: done in a deleting queue
    assert machine.jobs[job_id].removed in (None, "finished (retention delete)")
    replay(machine, ("send_signal", {"index": 0, "commit": True}), ("work", WORK))
    assert len(outside_runs(machine)) == 1
    (seen_first, *seen_later) = machine.recorder.step_seen[job_id]
    assert outside_runs(machine) == [(job_id, seen_first["attempt"])]
    assert all(seen == seen_first for seen in seen_later)
    assert [job for job, _ in db_rows(machine)] == [job_id]
    (answer, *answers) = machine.recorder.signal_seen[job_id]
    assert answer == ({"s": 2} if signalled else "timed out")
    assert all(a == answer for a in answers)
    assert len(finishing_attempts(machine, job_id)) == 1


def test_journeys_cancelled_after_a_kill_stay_cancelled_and_leave_their_signal_unread(
    machine: QueueMachine,
) -> None:
    """Two journeys whose worker was killed after their first stage: one parked in its
    wait (order 1), one with its sleep recorded and not parked, held by the dead worker
    (order 2). Both are cancelled; the signal sent afterwards wakes nothing and stays in
    the mailbox; the reaper, the keeper and a worker leave both cancelled."""
    parked = journey_of(machine, 1, "keep")
    replay(machine, ("kill_between_steps", {"limit": 1, "upto": 1}))
    assert machine.seen[parked].parked == "signal"
    asleep = journey_of(machine, 2, "keep")
    replay(machine, ("kill_between_steps", {"limit": 1, "upto": 1}))
    assert machine.seen[asleep].status == "running"
    replay(machine, ("cancel", {"indices": [0, 1]}), ("send_signal", {"index": 0, "commit": True}))
    replay(machine, *ROUND, *ROUND)
    assert [machine.seen[parked].status, machine.seen[asleep].status] == ["cancelled"] * 2
    assert machine.recorder.signal_seen == {}
