"""`sqla-queue worker --processes N`: children that drain one queue together, a crashed child
restarted with nothing lost, signals forwarded, and no restart loop on a broken child."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from helpers.fault_kit import (
    FaultDatabase,
    WorkerProcess,
    executions,
    fill_kept_queue,
    run_cli,
    wait_until,
)

from sqla_queue.cli import main
from sqla_queue.job.retry import RetryPolicy
from sqla_queue.worker.supervisor import EXIT_CONFIG, EXIT_USAGE, RestartPolicy, Supervisor

REPO = Path(__file__).resolve().parents[2]

StartWorker = Callable[..., WorkerProcess]
QUICK = RestartPolicy(
    backoff=RetryPolicy(base=0.01, jitter=0.0), healthy_after=3600.0, max_crashes=3
)


def counting_child(tally: Path, status: int) -> list[str]:
    """A child that adds a line to `tally` and exits with `status`."""
    code = f"open({str(tally)!r}, 'a').write('started\\n'); raise SystemExit({status})"
    return [sys.executable, "-c", code]


def starts(tally: Path) -> int:
    return len(tally.read_text().splitlines()) if tally.exists() else 0


# -- the restart policy, with stand-in children ---------------------------------------------


def test_a_child_that_keeps_crashing_makes_the_supervisor_give_up(tmp_path: Path) -> None:
    tally = tmp_path / "tally"
    supervisor = Supervisor([counting_child(tally, 3)], policy=QUICK)

    assert supervisor.run() == 1
    assert starts(tally) == 3
    assert supervisor.failure is not None
    assert "w1 crashed 3 times within 60 s (last: exit status 3" in supervisor.failure


@pytest.mark.parametrize("status", [EXIT_CONFIG, EXIT_USAGE])
def test_a_child_that_cannot_run_with_its_configuration_is_not_restarted(
    tmp_path: Path, status: int
) -> None:
    tally = tmp_path / "tally"
    supervisor = Supervisor([counting_child(tally, status)] * 2, policy=QUICK)

    assert supervisor.run() == 1
    assert starts(tally) <= 2  # each slot started once; the second may be stopped first
    assert supervisor.failure is not None
    assert "not restarting it" in supervisor.failure


def test_a_healthy_run_starts_the_backoff_over(tmp_path: Path) -> None:
    tally = tmp_path / "tally"
    never_healthy = Supervisor([counting_child(tally, 3)], policy=QUICK)
    always_healthy = Supervisor(
        [counting_child(tally, 3)],
        policy=RestartPolicy(backoff=QUICK.backoff, healthy_after=0.0, max_crashes=3),
    )

    assert never_healthy.run() == always_healthy.run() == 1
    # Two restarts in a row, then the crash that gives up; a healthy run counts none.
    assert never_healthy.children[0].restarts_in_row == 2
    assert always_healthy.children[0].restarts_in_row == 0


def test_burst_children_that_finish_are_not_restarted(tmp_path: Path) -> None:
    tally = tmp_path / "tally"
    supervisor = Supervisor([counting_child(tally, 0)] * 2, burst=True, policy=QUICK)

    assert supervisor.run() == 0
    assert starts(tally) == 2
    assert supervisor.failure is None


# -- the command line -----------------------------------------------------------------------


def invoke_worker(*args: str) -> Result:
    return CliRunner().invoke(main, ["worker", "--app", "helpers.apps.fault_app:registry", *args])


@pytest.mark.parametrize("value", ["0", "-2"])
def test_processes_below_one_are_refused(value: str) -> None:
    done = invoke_worker("--processes", value)

    assert done.exit_code == 2
    assert "Invalid value for '--processes'" in done.output
    assert f"must be a number of processes, a whole number from 1 to 1000, got {value}" in (
        done.output
    )


def test_a_bad_worker_option_is_refused_before_any_child_starts() -> None:
    done = invoke_worker("--processes", "2", "--poll-interval", "0")

    assert done.exit_code == 1
    assert "poll interval must be positive, got 0" in done.output
    assert "started worker process" not in done.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("app", "error"),
    [
        (
            "helpers.apps.fault_app_broken:registry",
            "Cannot load the task registry 'helpers.apps.fault_app_broken:registry'",
        ),
        (
            "helpers.apps.fault_app:not_a_registry",
            "'not_a_registry' is a dict, not a sqla_queue.Registry",
        ),
    ],
)
def test_children_with_a_configuration_error_are_not_restarted(
    database_url: str, app: str, error: str
) -> None:
    done = run_cli(["worker", "--app", app, "--processes", "2"], url=database_url)

    assert done.returncode == 1
    assert "not restarting it" in done.stderr
    assert 1 <= done.stderr.count(error) <= 2  # once per child at most: no restart loop
    assert "restarted worker process" not in done.stderr


@pytest.mark.slow
def test_children_on_a_database_without_the_schema_are_not_restarted(
    empty_database_url: str,
) -> None:
    done = run_cli(
        ["worker", "--app", "helpers.apps.fault_app:registry", "--processes", "2"],
        url=empty_database_url,
    )

    assert done.returncode == 1
    assert "has no sqla-queue schema" in done.stderr
    assert "not restarting it" in done.stderr
    assert "restarted worker process" not in done.stderr


# -- real workers ---------------------------------------------------------------------------


def worker_rows(db: FaultDatabase) -> list[tuple[str, int, int, list[str]]]:
    """(id, pid, concurrency, queues) of each registered worker, by id."""
    rows = db.rows("SELECT id, pid, concurrency, queues FROM sqla_queue.workers ORDER BY id")
    return [(str(i), int(pid), int(c), list(q)) for i, pid, c, q in rows]


def children_registered(db: FaultDatabase, count: int = 2) -> list[tuple[str, int, int, list[str]]]:
    rows = worker_rows(db)
    return rows if len(rows) == count else []


def pid_of(db: FaultDatabase, name: str) -> int:
    (pid,) = [pid for worker_id, pid, _, _ in worker_rows(db) if worker_id.endswith(f":{name}")]
    return pid


@pytest.mark.slow
def test_two_processes_drain_one_queue_together(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    parent = workers(fault_db.url, "--processes", "2", "-q", "pair", "-c", "3")
    fill_kept_queue(fault_db.url, "pair", "record", [])  # the queue, so -q finds it
    rows = wait_until(lambda: children_registered(fault_db), 60, what="two children")
    assert [worker_id.rsplit(":", 1)[1] for worker_id, _, _, _ in rows] == ["w1", "w2"]
    assert {(c, tuple(q)) for _, _, c, q in rows} == {(3, ("pair",))}  # options passed on
    assert parent.pid not in {pid for _, pid, _, _ in rows}

    ids = fill_kept_queue(
        fault_db.url, "pair", "record", [{"n": n, "work": 0.02} for n in range(300)]
    )
    wait_until(lambda: not fault_db.unfinished(), 120, what="the queue to drain")

    assert fault_db.status_counts() == {"done": 300}
    assert set(executions(fault_db)) == set(ids)
    ran_in = {pid for (pid,) in fault_db.rows("SELECT DISTINCT pid FROM public.fault_runs")}
    assert ran_in == {pid for _, pid, _, _ in rows}
    assert parent.stop() == 0
    assert worker_rows(fault_db) == []


@pytest.mark.slow
def test_a_sigkilled_child_is_restarted_and_no_job_is_lost(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    parent = workers(fault_db.url, "--processes", "2", "-q", "kill", "--lease", "5")
    fill_kept_queue(fault_db.url, "kill", "record", [])
    wait_until(lambda: children_registered(fault_db), 60, what="two children")
    ids = fill_kept_queue(
        fault_db.url, "kill", "record", [{"n": n, "work": 0.05} for n in range(400)]
    )
    wait_until(lambda: len(executions(fault_db)) >= 50, 60, what="50 jobs to run")
    victim = pid_of(fault_db, "w1")
    os.kill(victim, signal.SIGKILL)

    restarted = wait_until(
        lambda: [p for w, p, _, _ in worker_rows(fault_db) if w.endswith(":w1") and p != victim],
        60,
        what="w1 to be restarted",
    )
    wait_until(lambda: not fault_db.unfinished(), 120, what="the queue to drain")
    assert fault_db.status_counts() == {"done": 400}
    assert set(executions(fault_db)) == set(ids)  # every job ran; the victim's ones again
    assert parent.alive()
    assert f"w1 (pid {victim}) crashed (killed by SIGKILL)" in parent.log()
    assert f"restarted worker process w1 (pid {restarted[0]})" in parent.log()
    assert parent.stop() == 0


def four_jobs_running(
    db: FaultDatabase, workers: StartWorker, queue: str, seconds: float
) -> tuple[WorkerProcess, list[int]]:
    """A parent of two children, each running two `sleep` jobs of `seconds`."""
    parent = workers(db.url, "--processes", "2", "-q", queue, "-c", "2", "--batch", "1")
    fill_kept_queue(db.url, queue, "sleep", [])
    wait_until(lambda: children_registered(db), 60, what="two children")
    ids = fill_kept_queue(db.url, queue, "sleep", [{"seconds": seconds}] * 4)
    wait_until(
        lambda: db.value("SELECT count(*) FROM public.fault_runs") == 4,
        60,
        what="four jobs started (each child holds two at most)",
    )
    return parent, ids


@pytest.mark.slow
def test_sigterm_to_the_parent_lets_children_finish_their_jobs_and_exits_0(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    parent, ids = four_jobs_running(fault_db, workers, "term", seconds=2.0)

    parent.signal(signal.SIGTERM)
    assert parent.proc is not None
    assert parent.proc.wait(60) == 0
    finished = fault_db.rows("SELECT job_id FROM public.fault_runs WHERE event = 'finished'")
    assert sorted(job_id for (job_id,) in finished) == sorted(ids)
    assert fault_db.status_counts() == {"done": 4}
    assert worker_rows(fault_db) == []
    assert "all worker processes stopped" in parent.log()


@pytest.mark.slow
def test_a_second_signal_makes_the_children_requeue_their_jobs_and_exit_now(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    parent, _ = four_jobs_running(fault_db, workers, "twice", seconds=600.0)

    parent.signal(signal.SIGINT)
    wait_until(lambda: "received SIGINT: stopping" in parent.log(), 60, what="the first signal")
    parent.signal(signal.SIGINT)
    assert parent.proc is not None
    assert parent.proc.wait(120) == 1  # not a clean shutdown: the jobs did not finish
    assert fault_db.status_counts() == {"queued": 4}


@pytest.mark.slow
def test_children_of_a_sigkilled_parent_shut_down(
    fault_db: FaultDatabase, workers: StartWorker
) -> None:
    parent = workers(fault_db.url, "--processes", "2", "-q", "orphan")
    fill_kept_queue(fault_db.url, "orphan", "record", [])
    rows = wait_until(lambda: children_registered(fault_db), 60, what="two children")

    parent.kill()
    wait_until(lambda: not worker_rows(fault_db), 60, what="the children to deregister")
    for _, pid, _, _ in rows:
        wait_until(lambda pid=pid: not alive(pid), 60, what=f"child {pid} to exit")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_child_that_always_crashes_at_start_makes_the_parent_give_up(
    database_url: str,
) -> None:
    done = run_cli(
        ["worker", "--app", "helpers.apps.crash_app:registry", "--processes", "2"],
        url=database_url,
        timeout=120,
    )

    assert done.returncode == 1
    assert "crashed 5 times within 60 s (last: exit status 3" in done.stderr
    assert "giving up" in done.stderr


@pytest.mark.slow
def test_burst_children_drain_the_queue_and_the_parent_exits_0(
    fault_db: FaultDatabase,
) -> None:
    ids = fill_kept_queue(fault_db.url, "burst", "record", [{"n": n} for n in range(100)])
    done = run_cli(
        [
            "worker",
            "--app",
            "helpers.apps.fault_app:registry",
            "--processes",
            "2",
            "-q",
            "burst",
            "--burst",
        ],
        url=fault_db.url,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("finished: nothing is due") == 2
    assert fault_db.status_counts() == {"done": 100}
    assert set(executions(fault_db)) == set(ids)


@pytest.mark.slow
def test_the_processes_benchmark_drains_with_two_children(admin_url: str) -> None:
    command = [
        sys.executable, "-m", "benchmarks.processes", "--database-url", admin_url,
        "--jobs", "500", "--processes", "2", "--repeat", "1",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r"drain --processes 2 -c 4 --batch 50: ([\d,]+) jobs/s", done.stdout)
    assert match is not None, done.stdout
    assert int(match[1].replace(",", "")) > 0
