"""The dashboard and signals: a job's page names the signal it waits for and until when,
and lists its waits; the jobs page filters by the signal waited for; its cancel works."""

from __future__ import annotations

import re

from helpers.dashboard_kit import client, csrf_of
from helpers.signal_kit import park_jobs
from helpers.support import enqueue_jobs, statuses
from sqlalchemy import Engine

import sqla_queue


def test_the_job_page_names_the_signal_and_lists_the_waits(engine: Engine) -> None:
    (job_id,) = park_jobs(engine, "payment:<42>")
    page = client(engine).get(f"/jobs/{job_id}").text
    waits_for = re.search(r'<dd id="waits-for-signal">(.*?)</dd>', page, re.S)
    assert waits_for is not None
    assert "payment:&lt;42&gt;" in waits_for.group(1)  # escaped
    assert " until " in waits_for.group(1)
    table = re.search(r'<table class="grid" id="signal-waits">(.*?)</table>', page, re.S)
    assert table is not None
    assert "<td>waiting</td>" in table.group(1)


def test_the_jobs_page_filters_by_the_signal_waited_for(engine: Engine) -> None:
    waiting = park_jobs(engine, "approval:1")
    other = enqueue_jobs(engine, "other", 1)
    page = client(engine).get("/jobs?waiting_for=approval:1").text
    listed = {int(n) for n in re.findall(r'href="[^"]*/jobs/(\d+)"', page)}
    assert set(waiting) <= listed
    assert not set(other) & listed


def test_cancel_from_the_job_page_ends_a_waiting_job(engine: Engine) -> None:
    (job_id,) = park_jobs(engine, "approval:2")
    web = client(engine)
    page = web.get(f"/jobs/{job_id}").text
    response = web.post(
        "/jobs/action",
        data={
            "csrf_token": csrf_of(page),
            "job_id": str(job_id),
            "action": "cancel",
            "back": f"/jobs/{job_id}",
        },
    )
    assert response.status_code in (200, 303)
    assert statuses(engine, [job_id]) == {job_id: "cancelled"}
    with engine.begin() as conn:
        assert sqla_queue.signal(conn, "approval:2") == 0
