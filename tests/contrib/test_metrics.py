"""Prometheus metrics: scraped over HTTP from a real worker, counters move by what it did."""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from helpers.apps import observed
from helpers.fault_kit import TESTS_DIR, cli_env, free_port, run_cli
from helpers.support import (
    REPO_ROOT,
    Bounds,
    WorkerThread,
    age_bounds,
    database_clock,
    enqueue_jobs,
    subprocess_env,
    wait_for,
)
from helpers.turns_kit import turns_backlog
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import JobContext, Registry, RetryPolicy, enqueue
from sqla_queue.contrib.metrics import QueueMetrics, instrument
from sqla_queue.testing import drain

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of the endpoint, keyed by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        body = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def worker_port(database_url: str) -> Iterator[int]:
    """A `sqla-queue worker --metrics-port PORT` running helpers.apps.observed; yields PORT."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(
                sys.executable,
                "-m",
                "sqla_queue",
                "worker",
                "--app",
                "helpers.apps.observed:registry",
            ),
            *("--metrics-port", str(port), "--log-level", "warning", "--poll-interval", "0.2"),
        ],
        env=subprocess_env(database_url),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _answers(port) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.communicate()[1]
        yield port
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_scraped_counters_move_by_the_jobs_a_worker_drains(
    engine: Engine, worker_port: int
) -> None:
    enqueue_jobs(engine, "ok", 5)
    enqueue_jobs(engine, "flaky", 2)
    enqueue_jobs(engine, "boom", 1)
    finished = "sqla_queue_jobs_finished_total"

    def drained() -> Samples | None:
        # Wait for every job's outcome and for the statements that write them (the
        # completer writes a failure after the hook counted it): no fixed sleep.
        samples = scrape(worker_port)
        written = all(
            value(samples, "sqla_queue_statement_duration_seconds_count", statement=kind) >= 1
            for kind in ("fail", "retry")
        )
        done = (
            value(samples, finished, queue="default", task="flaky", outcome="succeeded") == 2
            and value(samples, finished, queue="default", task="ok", outcome="succeeded") == 5
            and value(samples, finished, queue="default", task="boom", outcome="failed") >= 1
            and value(samples, "sqla_queue_jobs_held") == 0
        )
        return samples if done and written else None

    first = wait_for(drained, timeout=30, interval=0.2)
    assert value(first, finished, queue="default", task="ok", outcome="succeeded") == 5
    assert value(first, finished, queue="default", task="flaky", outcome="retried") == 2
    assert value(first, finished, queue="default", task="boom", outcome="failed") == 1
    assert value(first, "sqla_queue_jobs_claimed_total", queue="default", task="ok") == 5
    assert value(first, "sqla_queue_jobs_claimed_total", queue="default", task="flaky") == 4
    assert (
        value(first, "sqla_queue_handler_duration_seconds_count", queue="default", task="ok") == 5
    )
    claims = sum(
        value(first, "sqla_queue_statement_duration_seconds_count", statement=kind)
        for kind in ("claim", "complete_and_claim")
    )
    assert claims >= 1
    assert value(first, "sqla_queue_statement_duration_seconds_count", statement="fail") >= 1
    assert value(first, "sqla_queue_statement_duration_seconds_count", statement="retry") >= 1
    # The lag is of this worker's own registration: a beat no older than the worker, read
    # before the scrape returned (the database's clock; how old, the machine's load decides).
    scraped = database_clock(engine)
    with engine.connect() as conn:
        registered = conn.execute(text("SELECT min(started_at) FROM sqla_queue.workers")).scalar()
    assert registered is not None
    lag = value(first, "sqla_queue_worker_heartbeat_lag_seconds")
    assert lag in Bounds(0, (scraped - registered).total_seconds())

    enqueue_jobs(engine, "ok", 3)
    second = wait_for(
        lambda: (
            s
            if value(
                s := scrape(worker_port), finished, queue="default", task="ok", outcome="succeeded"
            )
            >= 8
            else None
        ),
        timeout=30,
        interval=0.2,
    )
    assert value(second, finished, queue="default", task="ok", outcome="succeeded") == 8
    assert value(second, "sqla_queue_jobs_claimed_total", queue="default", task="ok") == 8
    assert value(second, finished, queue="default", task="boom", outcome="failed") == 1


def test_queue_depth_and_oldest_due_age_per_queue(engine: Engine) -> None:
    metrics = QueueMetrics(CollectorRegistry())
    before = database_clock(engine)
    with Session(engine) as session, session.begin():
        now = session.scalar(text("SELECT now()"))
        assert isinstance(now, dt.datetime)
        first = enqueue(session, "a", queue="default", run_at=now - dt.timedelta(minutes=5))
        enqueue(session, "a", queue="default")
        enqueue(session, "a", queue="default", run_at=now + dt.timedelta(hours=1))
        session.flush()
        first_id = first.id
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO sqla_queue.queues (name) VALUES ('other')"))
    enqueue_jobs(engine, "a", 2, queue="other", delay=3600)
    with Session(engine) as session, session.begin():
        enqueue(session, "b", queue="other", depends_on=[first_id])

    metrics.refresh(engine)
    after = database_clock(engine)

    reg = metrics.prometheus_registry

    def gauge(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    assert gauge("sqla_queue_queue_jobs", queue="default", status="queued") == 3
    assert gauge("sqla_queue_queue_due_jobs", queue="default") == 2
    age = gauge("sqla_queue_queue_oldest_due_job_age_seconds", queue="default")
    assert age is not None
    assert age in age_bounds(300, before, after)
    assert gauge("sqla_queue_queue_jobs", queue="other", status="queued") == 2
    assert gauge("sqla_queue_queue_jobs", queue="other", status="waiting") == 1
    assert gauge("sqla_queue_queue_jobs", queue="default", status="waiting") == 0
    assert gauge("sqla_queue_queue_due_jobs", queue="other") == 0
    # a claimed job whose handler has not started is claimed, not running (issue 38)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'running', attempts = 1, locked_by = 'w', "
                "locked_at = now(), heartbeat_at = now(), "
                "lease_expires_at = now() + interval '1 minute', "
                "started_at = CASE WHEN queue = 'other' THEN now() END "
                "WHERE status = 'queued' AND run_at > now()"
            )
        )
    metrics.refresh(engine)
    assert gauge("sqla_queue_queue_jobs", queue="default", status="running") == 0
    assert gauge("sqla_queue_queue_jobs", queue="default", status="claimed") == 1
    assert gauge("sqla_queue_queue_jobs", queue="other", status="running") == 2
    assert gauge("sqla_queue_queue_jobs", queue="other", status="claimed") == 0
    assert gauge("sqla_queue_queue_oldest_due_job_age_seconds", queue="other") == 0

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_queue.jobs WHERE queue = 'default'"))
    metrics.refresh(engine)
    assert gauge("sqla_queue_queue_jobs", queue="default", status="queued") == 0
    # its dependency deleted before it ended: the waiting job was cancelled
    assert gauge("sqla_queue_queue_jobs", queue="other", status="waiting") == 0
    assert gauge("sqla_queue_queue_oldest_due_job_age_seconds", queue="default") == 0


def test_a_broken_connection_counts_a_disconnect_and_a_reconnect(engine: Engine) -> None:
    prom = CollectorRegistry()
    registry = Registry()
    registry.task(name="ok")(observed.ok.func)
    metrics = instrument(registry, prometheus_registry=prom, depth_interval=0.2)
    with WorkerThread(engine, registry, poll_interval=0.1):
        wait_for(lambda: prom.get_sample_value("sqla_queue_worker_heartbeat_lag_seconds"))
        with engine.connect() as conn:  # every other session of this database goes away
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        engine.dispose()  # the test's own idle pooled connections went too; not the point here
        enqueue_jobs(engine, "ok", 2)
        wait_for(
            lambda: (
                prom.get_sample_value(
                    "sqla_queue_jobs_finished_total",
                    {"queue": "default", "task": "ok", "outcome": "succeeded"},
                )
                == 2
            ),
            timeout=60,
        )
    assert (prom.get_sample_value("sqla_queue_db_disconnects_total") or 0) >= 1
    assert (prom.get_sample_value("sqla_queue_db_reconnects_total") or 0) >= 1
    assert metrics is instrument(registry, prometheus_registry=prom)


def test_a_task_the_registry_does_not_know_is_labelled_unknown(engine: Engine) -> None:
    prom = CollectorRegistry()
    registry = Registry()
    instrument(registry, prometheus_registry=prom)
    with Session(engine) as session, session.begin():
        enqueue(session, "no-such-task-1")
        enqueue(session, "no-such-task-2")
    with WorkerThread(engine, registry, burst=True) as worker:
        worker.thread.join(60)
    claimed = prom.get_sample_value(
        "sqla_queue_jobs_claimed_total", {"queue": "default", "task": "unknown"}
    )
    assert claimed == 2
    deferred = prom.get_sample_value(
        "sqla_queue_jobs_finished_total",
        {"queue": "default", "task": "unknown", "outcome": "deferred"},
    )
    assert deferred == 2  # put back for a worker that knows the task, not failed
    assert not any(
        sample.labels.get("task", "").startswith("no-such")
        for family in prom.collect()
        for sample in family.samples
    )


def test_durable_steps_are_counted_run_then_replayed(engine: Engine) -> None:
    """A job runs two steps, fails, and its retry replays both and runs a third."""
    prom = CollectorRegistry()
    registry = Registry()
    instrument(registry, prometheus_registry=prom)

    @registry.task(name="stepped", pass_context=True, retry=RetryPolicy(base=0, jitter=0))
    def stepped(ctx: JobContext) -> None:
        ctx.step("a", lambda: 1)
        ctx.step("b", lambda: 2)
        if ctx.attempt == 1:
            raise RuntimeError("once")
        ctx.step("c", lambda: 3)

    enqueue_jobs(engine, "stepped", 1)
    with WorkerThread(engine, registry, burst=True, burst_wait=5) as worker:
        worker.thread.join(30)
    labels = {"queue": "default", "task": "stepped"}
    assert prom.get_sample_value("sqla_queue_steps_total", {**labels, "how": "run"}) == 3
    assert prom.get_sample_value("sqla_queue_steps_total", {**labels, "how": "replayed"}) == 2


def test_the_sample_grafana_dashboard_uses_only_metrics_that_exist() -> None:
    dashboard = json.loads((REPO_ROOT / "docs" / "grafana-dashboard.json").read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in expressions for name in re.findall(r"sqla_queue_\w+", expr)}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    exported = {
        family.name + suffix
        for family in QueueMetrics(CollectorRegistry()).prometheus_registry.collect()
        for suffix in suffixes[family.type]
    }
    assert len(used) >= 10
    assert used <= exported, used - exported


def test_a_metrics_port_in_use_is_refused_in_one_line(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            [
                "worker",
                "--app",
                "helpers.apps.observed:registry",
                "--burst",
                "--metrics-port",
                str(port),
            ],
            database_url,
        )
    assert result.returncode == 1
    assert f"cannot serve metrics on 0.0.0.0:{port}" in result.stderr
    assert "--metrics-port" in result.stderr
    assert "Traceback" not in result.stderr


def test_metrics_without_prometheus_client_name_the_extra(database_url: str) -> None:
    blocked = (
        "import sys; sys.modules['prometheus_client'] = None; "
        "from sqla_queue.cli import main; main()"
    )
    result = subprocess.run(
        [
            *(sys.executable, "-c", blocked, "worker", "--app", "helpers.apps.observed:registry"),
            *("--burst", "--metrics-port", "9100"),
        ],
        env=cli_env(database_url),
        cwd=TESTS_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "pip install 'sqla-queue[metrics]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_partitions_held_sequences_and_aged_jobs_per_queue(engine: Engine) -> None:
    metrics = QueueMetrics(CollectorRegistry(), partition_top=2)
    counts = (("big", 3), ("mid", 2), ("small", 1))
    before = database_clock(engine)
    failed_id = turns_backlog(engine, counts, held_minutes=20)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'running' "
                "WHERE id = (SELECT min(id) FROM sqla_queue.jobs WHERE partition = 'big')"
            )
        )

    metrics.refresh(engine)
    after = database_clock(engine)
    reg = metrics.prometheus_registry

    def gauge(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    jobs = "sqla_queue_partition_jobs"
    assert gauge(jobs, queue="tenants", partition="big", status="queued") == 2
    assert gauge(jobs, queue="tenants", partition="big", status="running") == 1
    assert gauge(jobs, queue="tenants", partition="mid", status="queued") == 2
    assert gauge(jobs, queue="tenants", partition="small", status="queued") is None  # not top 2
    assert gauge("sqla_queue_queue_held_sequences", queue="default") == 1
    assert gauge("sqla_queue_queue_held_sequence_waiting_jobs", queue="default") == 2
    longest = gauge("sqla_queue_queue_longest_held_sequence_seconds", queue="default")
    assert longest is not None
    assert longest in age_bounds(1200, before, after)
    assert gauge("sqla_queue_queue_aged_jobs", queue="slow") == 1

    # the partition "big" drained, the failed job deleted, the aged job gone
    with engine.begin() as conn:
        conn.execute(
            text(
                "DELETE FROM sqla_queue.jobs "
                "WHERE partition IN ('big', 'mid') OR id = :id OR queue = 'slow'"
            ),
            {"id": failed_id},
        )
    metrics.refresh(engine)
    assert gauge(jobs, queue="tenants", partition="big", status="queued") is None  # removed
    assert gauge(jobs, queue="tenants", partition="small", status="queued") == 1
    assert gauge(jobs, queue="tenants", partition="", status="queued") == 1  # no partition
    assert gauge("sqla_queue_queue_held_sequences", queue="default") == 0
    assert gauge("sqla_queue_queue_longest_held_sequence_seconds", queue="default") == 0
    assert gauge("sqla_queue_queue_aged_jobs", queue="slow") == 0


def test_jobs_parked_for_a_signal_are_counted_per_queue(engine: Engine) -> None:
    metrics = QueueMetrics(CollectorRegistry())
    registry = Registry()

    @registry.task(name="waiter", pass_context=True)
    def waiter(ctx: JobContext) -> None:
        ctx.wait_for_signal("metrics:1", timeout=3600)

    enqueue_jobs(engine, "waiter", 2)
    assert drain(engine, registry).waiting == 2
    metrics.refresh(engine)
    reg = metrics.prometheus_registry
    name = "sqla_queue_queue_signal_waiting_jobs"
    assert reg.get_sample_value(name, {"queue": "default"}) == 2
    with engine.begin() as conn:
        sqla_queue.signal(conn, "metrics:1", wake="all")
    metrics.refresh(engine)
    assert reg.get_sample_value(name, {"queue": "default"}) == 0
