"""The autoscaling signal on a worker's health port (`GET /scaling`): every queue's ready
jobs and the live workers' free slots, a second worker counted once it has started and
dropped once it has stopped, or at once when it is SIGKILLed (its session ends)."""

from __future__ import annotations

from pathlib import Path

from helpers.fault_kit import WorkerProcess, free_port
from helpers.support import WorkerThread, answers_with, enqueue_jobs, http_get, make_queue, wait_for
from sqlalchemy import Engine, text

from sqla_queue import Registry, admin
from sqla_queue.admin import workers as admin_workers
from sqla_queue.doctor import DoctorOptions, diagnose


def signal_of(port: int, queue: str) -> dict[str, object]:
    status, report = http_get(port, "/scaling")
    assert status == 200
    return report["queues"][queue]  # type: ignore[no-any-return]


def test_the_health_port_serves_the_signal_and_follows_the_fleet(engine: Engine) -> None:
    make_queue(engine, "port_q")
    make_queue(engine, "port_unserved")
    enqueue_jobs(engine, "noop", 4, queue="port_unserved")
    registry = Registry()
    registry.task(name="noop")(lambda: None)
    port = free_port()
    first = WorkerThread(
        engine,
        registry,
        queues=["port_q"],
        concurrency=2,
        health_port=port,
        health_host="127.0.0.1",
    )
    with first:
        wait_for(lambda: answers_with(port, "/readyz", 200), timeout=30)
        wait_for(lambda: signal_of(port, "port_q")["workers"] == 1, timeout=30)
        mine = signal_of(port, "port_q")
        assert mine["free_slots"] == 2
        other = signal_of(port, "port_unserved")
        assert other["ready"] == 4  # no worker serves it: the backlog an autoscaler sees
        assert other["workers"] == 0
        second = WorkerThread(engine, registry, queues=["port_q"], concurrency=3)
        with second:
            wait_for(lambda: signal_of(port, "port_q")["workers"] == 2, timeout=30)
            assert signal_of(port, "port_q")["free_slots"] == 5
        # a worker that stopped is gone from the signal (it deregistered as it stopped)
        wait_for(lambda: signal_of(port, "port_q")["workers"] == 1, timeout=30)
        assert signal_of(port, "port_q")["free_slots"] == 2
        status, missing = http_get(port, "/nowhere")
        assert status == 404
        assert "/scaling" in missing["paths"]


def serving(engine: Engine, queue: str) -> int:
    """Live workers serving `queue`, as the autoscaling signal counts them."""
    with engine.begin() as conn:
        (found,) = admin.scaling_signal(conn, queue)
    return found.workers


def registration(engine: Engine, pid: int) -> tuple[str, int | None]:
    """(worker id, session_pid) of the registration of OS process `pid`."""
    with engine.begin() as conn:
        row = conn.execute(
            text("SELECT id, session_pid FROM sqla_queue.workers WHERE pid = :pid"), {"pid": pid}
        ).one()
    return row[0], row[1]


def outlive_expiry(engine: Engine, worker_id: str) -> None:
    """Push a dead worker's registration an hour ahead: only its session can drop it now."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.workers SET expires_at = now() + interval '1 hour' "
                "WHERE id = :id"
            ),
            {"id": worker_id},
        )


def test_a_sigkilled_worker_leaves_the_signal_and_the_workers_list_when_its_session_ends(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    make_queue(engine, "kill_q")
    worker = WorkerProcess(
        database_url, tmp_path / "worker.log", "-q", "kill_q", app="helpers.apps.tasks:registry"
    ).start()
    try:
        worker.wait_started()
        wait_for(lambda: serving(engine, "kill_q") == 1, timeout=30)
        # its next beat records the backend of the connection it keeps open (its LISTEN's)
        wait_for(lambda: registration(engine, worker.pid)[1] is not None, timeout=30)
        worker_id, session_pid = registration(engine, worker.pid)
        with engine.connect() as conn:
            assert worker_id in [w.id for w in admin_workers.live_workers(conn)]
    finally:
        worker.kill()
    outlive_expiry(engine, worker_id)  # the registration alone would count it for an hour
    # the server ends a killed client's backend at once; the deadline is for a loaded machine
    wait_for(lambda: serving(engine, "kill_q") == 0, timeout=60)
    with engine.begin() as conn:  # the server ended its session: that is what the signal saw
        gone = conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": session_pid}
        ).scalar_one()
    assert gone == 0
    assert registration(engine, worker.pid)[0] == worker_id  # still registered, not counted
    # nor listed: `workers list`, the workers page, the API and doctor read the same workers
    with engine.connect() as conn:
        assert worker_id not in [w.id for w in admin_workers.live_workers(conn)]
    (found,) = [f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "workers"]
    assert worker_id not in str(found.details)


def test_a_poll_only_worker_has_no_session_and_is_judged_by_its_registration(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    make_queue(engine, "poll_q")
    worker = WorkerProcess(
        database_url,
        tmp_path / "worker.log",
        "-q",
        "poll_q",
        "--poll-only",
        app="helpers.apps.tasks:registry",
    ).start()
    try:
        worker.wait_started()
        wait_for(lambda: serving(engine, "poll_q") == 1, timeout=30)
        worker_id, session_pid = registration(engine, worker.pid)
    finally:
        worker.kill()
    assert session_pid is None  # no connection held open (as behind transaction pooling)
    outlive_expiry(engine, worker_id)
    assert serving(engine, "poll_q") == 1  # counted until its registration expires
