"""Workers that stopped, and how: a clean stop leaves a `graceful` row in stopped_workers, an
expired registration a `lost` one once the reaper took its jobs back, rows older than a day
are pruned; each live worker's running jobs (bounded per worker); `sqla-queue workers list`
and the dashboard's workers page show both."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
from collections.abc import Callable
from typing import Any

import pytest
from helpers.dashboard_kit import client
from helpers.fault_kit import FaultDatabase, WorkerProcess, wait_until
from helpers.statements import claim_rows
from helpers.support import age_bounds, cli, database_clock, enqueue_jobs
from sqlalchemy import Connection, Engine, text

from sqla_queue import Registry
from sqla_queue.admin import workers as admin_workers
from sqla_queue.db import queries
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig


def register(conn: Connection, worker_id: str, stale_after: float = 30, **fields: Any) -> None:
    """A registration as a worker's heartbeat writes it; expired with a negative stale_after."""
    values = {"hostname": "box", "pid": 42, "queues": None, "concurrency": 4, **fields}
    conn.execute(
        queries.beat_worker(), {"worker_id": worker_id, "stale_after": stale_after, **values}
    )


def claim_ids(conn: Connection, worker_id: str, count: int) -> list[int]:
    """Claim `count` due jobs for `worker_id`, as its producer would: they are running."""
    return sorted(row["id"] for row in claim_rows(conn, count, worker_id=worker_id))


def stopped_rows(conn: Connection) -> dict[str, str]:
    rows = conn.execute(text("SELECT id, how FROM sqla_queue.stopped_workers"))
    return {row.id: row.how for row in rows}


def test_a_clean_stop_is_recorded_as_graceful(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="noop")(lambda: None)
    enqueue_jobs(engine, "noop", 2)
    config = WorkerConfig(worker_id="drainer", queues=["default"], concurrency=3)
    assert run_until_empty(engine, registry, config).succeeded == 2
    with engine.connect() as conn:
        assert admin_workers.live_workers(conn) == []
        (gone,) = admin_workers.stopped_workers(conn)
    assert (gone.id, gone.how, gone.pid) == ("drainer", "graceful", os.getpid())
    assert (gone.hostname, gone.queues, gone.concurrency) == (socket.gethostname(), ["default"], 3)
    assert gone.started_at <= gone.heartbeat_at <= gone.stopped_at


def test_an_expired_registration_is_lost_once_the_reaper_took_its_jobs(engine: Engine) -> None:
    enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        register(conn, "alive")
        register(conn, "dead", stale_after=-1, hostname="gone-box", pid=7)
        claim_ids(conn, "dead", 1)
    with engine.begin() as conn:  # it holds a running job: the reaper must requeue it first
        assert conn.execute(queries.delete_expired_workers()).all() == []
        assert stopped_rows(conn) == {}
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET lease_expires_at = now() - interval '1 s'"))
        assert len(conn.execute(queries.reap_stale_jobs()).all()) == 1
        assert conn.execute(queries.delete_expired_workers()).all() == [("dead", "gone-box", 7)]
    with engine.connect() as conn:
        assert stopped_rows(conn) == {"dead": "lost"}
        assert [w.id for w in admin_workers.live_workers(conn)] == ["alive"]


def test_a_lost_worker_that_came_back_and_stopped_cleanly_is_graceful(engine: Engine) -> None:
    with engine.begin() as conn:
        register(conn, "w", stale_after=-1)
    with engine.begin() as conn:
        conn.execute(queries.delete_expired_workers())
        lost_at = conn.execute(text("SELECT stopped_at FROM sqla_queue.stopped_workers")).scalar()
        assert stopped_rows(conn) == {"w": "lost"}
    with engine.begin() as conn:  # it was only paused: its next heartbeat registers it again
        register(conn, "w", pid=43)
    with engine.begin() as conn:
        stopped = conn.execute(queries.deregister_worker(), {"worker_id": "w"}).all()
        assert stopped == [("w", "box", 43)]
    with engine.connect() as conn:
        (row,) = admin_workers.stopped_workers(conn)
    assert (row.how, row.pid) == ("graceful", 43)
    assert row.stopped_at > lost_at


def test_stopped_workers_older_than_a_day_are_pruned_and_never_listed(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.stopped_workers "
                "(id, hostname, pid, queues, concurrency, started_at, heartbeat_at, stopped_at, "
                "how) SELECT id, 'box', 1, NULL, 1, now() - ago, now() - ago, now() - ago, "
                "'graceful' FROM (VALUES ('old', interval '25 hours'), "
                "('recent', interval '23 hours'), ('back', interval '2 days')) AS v(id, ago)"
            )
        )
        register(conn, "back", stale_after=-1)  # an old id, lost again now
    with engine.connect() as conn:
        assert [w.id for w in admin_workers.stopped_workers(conn)] == ["recent"]
    with engine.begin() as conn:
        conn.execute(queries.delete_expired_workers())
    with engine.connect() as conn:
        assert stopped_rows(conn) == {"recent": "graceful", "back": "lost"}
        assert [w.id for w in admin_workers.stopped_workers(conn)] == ["back", "recent"]
        assert [w.id for w in admin_workers.stopped_workers(conn, limit=1)] == ["back"]


def test_running_jobs_are_listed_per_worker_and_bounded(engine: Engine) -> None:
    enqueue_jobs(engine, "t", 4)
    with engine.begin() as conn:
        for worker_id in ("w1", "w2", "idle"):
            register(conn, worker_id)
        first = claim_ids(conn, "w1", 3)
        second = claim_ids(conn, "w2", 1)
    with engine.connect() as conn:
        found = admin_workers.running_jobs(conn, ["w1", "w2", "idle"], per_worker=2)
        counts = {w.id: (w.running, w.claimed) for w in admin_workers.live_workers(conn)}
    assert [job.id for job in found["w1"]] == first[:2]
    assert [job.id for job in found["w2"]] == second
    assert "idle" not in found
    # claimed, none started: held, not running (trap 8 of issue 33)
    assert counts == {"w1": (0, 3), "w2": (0, 1), "idle": (0, 0)}
    job = found["w2"][0]
    assert (job.task, job.queue, job.attempts, job.running_seconds) == ("t", "default", 1, None)


def test_workers_list_prints_live_and_stopped_workers(database_url: str, engine: Engine) -> None:
    before = database_clock(engine)
    with engine.begin() as conn:
        register(conn, "w-live", queues=["mail"])
        register(conn, "w-gone")
        conn.execute(queries.deregister_worker(), {"worker_id": "w-gone"})
    live = cli("workers", "list", url=database_url, catch=True)
    assert live.exit_code == 0, live.output
    assert "w-live" in live.output
    assert "mail" in live.output
    assert "w-gone" not in live.output
    stopped = cli("workers", "list", "--stopped", url=database_url, catch=True)
    assert stopped.exit_code == 0, stopped.output
    assert re.search(r"w-gone .* graceful", stopped.output)
    assert "w-live" not in stopped.output
    (row,) = json.loads(
        cli("workers", "list", "--stopped", "--json", url=database_url, catch=True).output
    )
    assert (row["id"], row["how"], row["pid"]) == ("w-gone", "graceful", 42)
    assert dt.datetime.fromisoformat(row["stopped_at"]).tzinfo is not None
    (worker,) = json.loads(cli("workers", "list", "--json", url=database_url, catch=True).output)
    after = database_clock(engine)
    assert (worker["id"], worker["running"], worker["queues"]) == ("w-live", 0, ["mail"])
    assert worker["silent_seconds"] in age_bounds(0, before, after)  # registered, not heard


def test_workers_list_says_when_there_is_none(database_url: str) -> None:
    assert "no live worker" in cli("workers", "list", url=database_url, catch=True).output
    result = cli("workers", "list", "--stopped", url=database_url, catch=True)
    assert "no worker stopped in the last day" in result.output
    assert (
        cli("workers", "list", "--stopped", "--limit", "0", url=database_url, catch=True).exit_code
        == 2
    )


def test_workers_page_shows_running_jobs_under_each_worker_and_the_stopped(
    engine: Engine,
) -> None:
    enqueue_jobs(engine, "<i>t</i>", admin_workers.RUNNING_SHOWN + 3)
    with engine.begin() as conn:
        register(conn, "busy", concurrency=50)
        register(conn, "calm")
        register(conn, "w-gone", hostname="old-box")
        busy = claim_ids(conn, "busy", admin_workers.RUNNING_SHOWN + 2)
        calm = claim_ids(conn, "calm", 1)
        conn.execute(queries.deregister_worker(), {"worker_id": "w-gone"})
    body = client(engine).get("/workers").text
    live, stopped = body.split('id="stopped-workers"')
    sections = {}  # each worker's running jobs: from its row to the next worker's
    for chunk in live.split('data-running-of="')[1:]:
        worker, html = chunk.split('"', 1)
        sections[worker] = html.split("<tr data-worker=")[0]
    shown = {worker: re.findall(r'href="/jobs/(\d+)"', html) for worker, html in sections.items()}
    assert shown == {
        "busy": [str(i) for i in busy[: admin_workers.RUNNING_SHOWN]],
        "calm": [str(calm[0])],
    }
    assert "and 2 more held" in sections["busy"]
    assert "more held" not in sections["calm"]
    assert "&lt;i&gt;t&lt;/i&gt;" in sections["calm"]
    assert re.search(r'data-stopped="w-gone">.*old-box.*graceful', stopped, re.S)


def test_the_workers_page_says_when_none_stopped(engine: Engine) -> None:
    body = client(engine).get("/workers").text
    assert "No worker stopped in the last day." in body


@pytest.mark.slow
def test_real_workers_a_killed_one_is_lost_a_stopped_one_graceful(
    fault_db: FaultDatabase, workers: Callable[..., WorkerProcess]
) -> None:
    victim = workers(fault_db.url)
    survivor = workers(fault_db.url)
    victim.wait_started()
    survivor.wait_started()
    victim.kill()
    how_of = "SELECT how FROM sqla_queue.stopped_workers WHERE pid = %s"
    # its registration expires after dead_after (6 s); the survivor reaps every 2 s or so
    wait_until(lambda: fault_db.value(how_of, victim.pid), 60, what="the killed worker's row")
    assert fault_db.value(how_of, victim.pid) == "lost"
    assert "recorded as lost" in survivor.log()
    assert survivor.stop() == 0
    assert fault_db.value(how_of, survivor.pid) == "graceful"
    assert fault_db.value("SELECT count(*) FROM sqla_queue.workers") == 0
