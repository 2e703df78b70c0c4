"""The worker's health endpoints (`--health-port`): /livez and /readyz answer 200 while it
runs, /readyz 503 while its database is away (and 200 once it is back; in a worker thread,
and /health of a real `sqla-queue worker` process on a private cluster), /livez 503 while a
loop is stuck, bad ports are one-line errors, the port is free again once the worker stops,
and with --processes the parent answers for all its children."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.fault_kit import (
    TESTS_DIR,
    PrivateCluster,
    WorkerProcess,
    cli_env,
    free_port,
    free_port_run,
    port_is_free,
)
from helpers.support import WorkerThread, answers_with, cli, http_get, wait_for
from sqlalchemy import Engine, create_engine, event

from sqla_queue import ConfigurationError, Registry
from sqla_queue.db.migrate import upgrade
from sqla_queue.worker import Worker, WorkerConfig
from sqla_queue.worker.health import DATABASE_CACHE, DATABASE_TIMEOUT, DatabaseCheck


def browser_sees(port: int, path: str) -> tuple[int, str] | None:
    """(status, body text) of `path` as Debian's chromium shows it (Playwright), or None
    when the browser is not installed (the HTTP checks around it still run)."""
    try:
        from dashboard.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS
        from playwright.sync_api import sync_playwright
    except (ImportError, pytest.skip.Exception):
        return None
    if not Path(CHROMIUM).exists():
        return None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page()
            response = tab.goto(f"http://127.0.0.1:{port}{path}")
            assert response is not None
            return response.status, tab.inner_text("body")
        finally:
            browser.close()


def registry() -> Registry:
    reg = Registry()
    reg.task(name="noop")(lambda: None)
    return reg


def health_worker(engine: Engine, **config: Any) -> tuple[WorkerThread, int]:
    port = free_port()
    config.setdefault("health_host", "127.0.0.1")
    return WorkerThread(engine, registry(), health_port=port, **config), port


def test_livez_and_readyz_answer_200_while_the_worker_runs(engine: Engine) -> None:
    worker, port = health_worker(engine, poll_only=False)
    with worker:
        wait_for(lambda: answers_with(port, "/readyz", 200), timeout=60)
        status, live = http_get(port, "/livez")
        assert status == 200
        assert live["status"] == "ok"
        assert live["worker"] == "running"
        assert live["loops"] == {"producer": "ok", "keeper": "ok", "listener": "ok"}
        status, ready = http_get(port, "/readyz")
        assert (status, ready["database"], ready["status"]) == (200, "ok", "ok")
        assert http_get(port, "/health")[0] == 200  # an alias of /readyz
        assert http_get(port, "/nowhere")[0] == 404
    # stopped with the worker: the port is free again
    assert worker.worker.health is None
    assert port_is_free(port)


def test_an_async_registry_reports_its_event_loop(engine: Engine) -> None:
    reg = registry()

    @reg.task(name="later")
    async def later() -> None:
        return None

    port = free_port()
    with WorkerThread(engine, reg, health_port=port, health_host="127.0.0.1"):
        wait_for(lambda: answers_with(port, "/readyz", 200), timeout=60)  # started: the loop runs
        assert http_get(port, "/livez")[1]["loops"]["event_loop"] == "ok"


def test_livez_is_503_while_a_loop_is_stuck(engine: Engine) -> None:
    worker, port = health_worker(engine)
    keeper = worker.worker.keeper
    entered, release = threading.Event(), threading.Event()
    watch = keeper._watch_overruns

    def stuck() -> None:  # the keeper's next round hangs here, as on a statement
        entered.set()
        release.wait(30)
        watch()

    with worker:
        wait_for(lambda: answers_with(port, "/readyz", 200), timeout=60)
        keeper._watch_overruns = stuck  # type: ignore[method-assign]
        assert entered.wait(60)
        # Its round is busy; make it look an hour old rather than wait a minute.
        keeper.pulse.busy_since = time.monotonic() - 3600
        status, live = http_get(port, "/livez")
        assert status == 503
        assert live["status"] == "failing"
        assert live["loops"]["keeper"] == "stuck for 3600 s"
        assert live["loops"]["producer"] == "ok"
        status, ready = http_get(port, "/readyz")
        assert status == 503
        assert ready["database"] == "not checked (not live)"
        keeper._watch_overruns = watch  # type: ignore[method-assign]
        release.set()  # the round ends: the keeper is live again
        wait_for(lambda: answers_with(port, "/livez", 200), timeout=60)


def test_a_waiting_loop_is_never_stuck(engine: Engine) -> None:
    worker, port = health_worker(engine, health_stuck_after=0.2)
    with worker:
        wait_for(lambda: answers_with(port, "/readyz", 200), timeout=60)
        time.sleep(0.5)  # idle: every loop waits, longer than health_stuck_after
        assert http_get(port, "/livez")[0] == 200


def test_readyz_follows_the_database(cluster: PrivateCluster) -> None:
    cluster.start()
    cluster.create_database()
    engine = create_engine(cluster.url)
    upgrade(engine)
    worker, port = health_worker(engine)
    try:
        with worker:
            wait_for(lambda: answers_with(port, "/readyz", 200), timeout=60)
            cluster.stop()
            wait_for(lambda: answers_with(port, "/readyz", 503), timeout=60)
            status, ready = http_get(port, "/readyz")
            assert status == 503
            assert ready["status"] == "failing"
            assert ready["database"] != "ok"
            # alive while it waits out the outage: no restart would bring the database back
            status, live = http_get(port, "/livez")
            assert status == 200, live
            cluster.start()
            wait_for(lambda: answers_with(port, "/readyz", 200), timeout=30)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_worker_process_health_follows_its_database(
    cluster: PrivateCluster, tmp_path: Path
) -> None:
    """A real `sqla-queue worker --health-port` process: /health 200, 503 once its database
    has stopped (the process lives on), 200 again once the database is back. The waits are
    deadlines against a hang, not measures: how soon it says so is the cached check's
    (`test_readyz_probes_in_a_row_share_one_database_check`)."""
    cluster.start()
    cluster.create_database()
    engine = create_engine(cluster.url)
    upgrade(engine)
    engine.dispose()
    port = free_port()
    options = ("--health-port", str(port), "--health-host", "127.0.0.1")
    worker = WorkerProcess(cluster.url, tmp_path / "worker.log", *options).start()
    try:
        wait_for(lambda: answers_with(port, "/health", 200) or not worker.alive(), timeout=60)
        status, health = http_get(port, "/health")
        assert (status, health["database"], health["worker"]) == (200, "ok", "running")
        cluster.stop()
        wait_for(lambda: answers_with(port, "/health", 503), timeout=60)
        status, health = http_get(port, "/health")
        assert (status, health["status"]) == (503, "failing")
        assert health["database"] != "ok"
        seen = browser_sees(port, "/health")  # as an operator's browser shows it
        if seen is not None:
            assert seen[0] == 503
            assert '"failing"' in seen[1]
        assert http_get(port, "/livez")[0] == 200
        assert worker.alive()
        cluster.start()
        wait_for(lambda: answers_with(port, "/health", 200), timeout=30)
        assert worker.stop() == 0
        assert "Traceback" not in worker.log()
    finally:
        if worker.alive():
            worker.kill()


def test_readyz_probes_in_a_row_share_one_database_check(engine: Engine) -> None:
    """Probes in a row cost one check of the database per `cache` seconds, each on a
    connection of its own with the database timeout: counted by the connections the check
    opened (no clock: a slow machine may make the probes slower, not more costly)."""
    worker, port = health_worker(engine)
    with worker:
        wait_for(lambda: answers_with(port, "/readyz", 200), timeout=60)
        for _ in range(20):
            assert http_get(port, "/readyz")[0] == 200

    def connections_opened(cache: float) -> int:
        """Connections a check kept `cache` seconds opens for 20 probes in a row."""
        check = DatabaseCheck(engine, cache=cache)
        opened: list[object] = []
        event.listen(check._engine, "connect", lambda *args: opened.append(args))
        try:
            assert [check() for _ in range(20)] == [None] * 20
        finally:
            check.dispose()
        return len(opened)

    assert connections_opened(3600.0) == 1
    assert connections_opened(0.0) == 20
    assert DatabaseCheck.__init__.__defaults__ == (DATABASE_TIMEOUT, DATABASE_CACHE)


def test_a_worker_waiting_for_its_database_is_live_not_ready() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    port = free_port()
    worker = WorkerThread(url, registry(), health_port=port, health_host="127.0.0.1")  # type: ignore[arg-type]
    with worker:
        wait_for(lambda: answers_with(port, "/readyz", 503), timeout=60)
        assert http_get(port, "/readyz")[1]["worker"] == "starting"
        assert http_get(port, "/livez")[0] == 200
    assert port_is_free(port)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--health-port", "0"), "a TCP port, a whole number from 1 to 65535, got 0"),
        (("--health-port", "65536"), "a TCP port, a whole number from 1 to 65535"),
        (("--health-port", "http"), "'http'"),
        (("--health-port", "65535", "--processes", "2"), "the last must be at most 65535"),
        (("--health-port", "9000", "--from", "nats://x", "-q", "q"), "not served"),
        (("--health-port", "9000", "--health-stuck-after", "0"), "health_stuck_after"),
    ],
)
def test_bad_health_options_are_one_line_errors(
    database_url: str, args: tuple[str, ...], fragment: str
) -> None:
    result = cli(
        "worker", "--app", "helpers.apps.fault_app:registry", *args, url=database_url, catch=True
    )
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert fragment in result.output
    assert "--health" in result.output or "health" in result.output


def test_bad_health_config_values_are_configuration_errors() -> None:
    for bad in ({"health_port": 0}, {"health_port": 70000}, {"health_host": ""}):
        with pytest.raises(ConfigurationError):
            WorkerConfig(**bad)  # type: ignore[arg-type]


def test_a_health_port_in_use_is_a_configuration_error(engine: Engine) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = Worker(engine, registry(), WorkerConfig(health_port=port, health_host="127.0.0.1"))
        with pytest.raises(
            ConfigurationError, match=f"cannot serve health checks on 127.0.0.1:{port}"
        ):
            worker.run(install_signal_handlers=False)


@pytest.mark.slow
def test_the_parent_of_processes_answers_for_its_children(database_url: str) -> None:
    port = free_port_run(3)  # the parent's and its two children's
    proc = subprocess.Popen(
        [
            *(
                sys.executable,
                "-m",
                "sqla_queue",
                "worker",
                "--app",
                "helpers.apps.fault_app:registry",
            ),
            *("--processes", "2", "--health-port", str(port), "--health-host", "127.0.0.1"),
            *("--log-level", "warning"),
        ],
        env=cli_env(database_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS_DIR,
    )
    try:
        wait_for(lambda: answers_with(port, "/readyz", 200) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.communicate()[1]
        status, ready = http_get(port, "/readyz")
        assert status == 200
        assert set(ready["processes"]) == {"w1", "w2"}
        assert all(child["database"] == "ok" for child in ready["processes"].values())
        status, live = http_get(port, "/livez")
        assert status == 200
        assert live["processes"]["w2"]["loops"]["keeper"] == "ok"
        # each child answers on 127.0.0.1:PORT + its slot
        assert http_get(port + 1, "/livez")[0] == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert all(port_is_free(p) for p in (port, port + 1, port + 2))
