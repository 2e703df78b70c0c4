"""The queues page's charts read the rollup (`job_counts`), per queue and per task; its
counts stay bounded on a big table (capped, or the planner's estimates, and said so); every
time the dashboard shows says it is UTC."""

from __future__ import annotations

import re

import pytest
from helpers.dashboard_kit import client, make_failed, new_queue
from helpers.support import enqueue_jobs
from sqlalchemy import Engine, text

from sqla_queue.dashboard import reads
from sqla_queue.db import rollup

# mail: 1 + m % 4 jobs ended at each of the minutes m = 0, 5, ..., 55 ago (12 bars), one
# failed every 10 minutes; a `fetch` task of mail 3 hours ago (the day's chart only).
ROLLUP = """
INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed, retried, run_seconds)
SELECT date_trunc('minute', now()) - make_interval(mins => m), 'mail', 'send',
       1 + m % 4, (m % 10 = 0)::int, 1, 0.5
FROM generate_series(0, 55, 5) AS m
UNION ALL
SELECT date_trunc('minute', now()) - interval '3 hours', 'mail', 'fetch', 7, 0, 0, 14.0
"""


def _row(page: str, queue: str) -> str:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', page, re.S)
    assert row, page
    return row.group(1)


def _bars(cell: str, kind: str) -> list[float]:
    return [float(h) for h in re.findall(rf'<rect class="{kind}"[^>]*height="([0-9.]+)"', cell)]


def test_the_queues_page_charts_the_rollup_per_minute_and_per_ten_minutes(
    engine: Engine,
) -> None:
    new_queue(engine, "mail")
    with engine.begin() as conn:
        conn.execute(text(ROLLUP))
    row = _row(client(engine).get("/").text, "mail")
    hour, day = re.findall(r'<td class="chart-cell chart-(?:hour|day)">(.*?)</td>', row, re.S)
    ok = _bars(hour, "ok")
    assert len(ok) == 12  # one bar per minute with jobs
    # the tallest bar is the minute with 4 + 1 failed = 5 ended (m % 4 == 3 and m % 10 == 0
    # never meet; m = 15, 35, 55: 4 ended), drawn at the chart's full height
    ended = [1 + m % 4 + (m % 10 == 0) for m in range(55, -1, -5)]
    assert ok == pytest.approx([32 * n / max(ended) for n in ended], abs=0.06)
    assert len(_bars(hour, "bad")) == 6  # m = 0, 10, ..., 50
    assert 'aria-label="jobs ended, last hour, per minute"' in hour
    assert re.search(rf"</svg>\s*<span class=\"muted\">{sum(ended)}</span>", hour)
    # per 10 minutes: the hour's 12 minutes fall in 6 or 7 buckets, plus 3 hours ago's
    assert len(_bars(day, "ok")) in (7, 8)
    assert "per 10 minutes" in day
    assert f'<span class="muted">{sum(ended) + 7}</span>' in day


def test_a_queue_page_charts_each_task(engine: Engine) -> None:
    new_queue(engine, "mail")
    with engine.begin() as conn:
        conn.execute(text(ROLLUP))
    page = client(engine).get("/queues/mail")
    assert page.status_code == 200
    send = re.search(r'<tr data-task="send">(.*?)</tr>', page.text, re.S)
    fetch = re.search(r'<tr data-task="fetch">(.*?)</tr>', page.text, re.S)
    assert send
    assert fetch
    assert len(_bars(send.group(1).split("chart-day")[0], "ok")) == 12
    assert _bars(fetch.group(1).split("chart-day")[0], "ok") == []  # not in the last hour
    assert len(_bars(fetch.group(1).split("chart-day")[1], "ok")) == 1
    assert re.search(r'count-failed">6<', send.group(1))
    assert re.search(r'count-retried">12<', send.group(1))
    assert "2.0 s" in fetch.group(1)  # 14 s over 7 jobs
    assert client(engine).get("/queues/nosuch").status_code == 200  # no task: said so
    assert "No job of this queue ended" in client(engine).get("/queues/nosuch").text


def test_a_burst_worker_fills_the_chart(engine: Engine) -> None:
    make_failed(engine, 2)
    row = _row(client(engine).get("/").text, "default")
    assert len(_bars(row, "bad")) >= 1
    assert re.search(r'chart-hour">.*?<span class="muted">2</span>', row, re.S)


def test_on_a_big_table_the_counts_are_capped_or_estimated_and_say_so(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    new_queue(engine, "mail")
    enqueue_jobs(engine, "send", 5, queue="mail")
    make_failed(engine, 1)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE sqla_queue.jobs"))
    monkeypatch.setattr(rollup, "BIG_TABLE", 0)  # as if the table were big
    monkeypatch.setattr(reads, "COUNT_CAP", 3)
    with engine.connect() as conn:
        rows = {row.name: row for row in reads.queue_rows(conn)}
    mail = rows["mail"]
    assert mail.counts["queued"] == 3
    assert mail.capped == {"queued"}
    assert mail.estimated == {"done", "failed", "cancelled"}
    assert rows["default"].counts["failed"] >= 1  # the planner's estimate: at least a row
    row = _row(client(engine).get("/").text, "mail")
    assert re.search(r'count-queued" title="counted up to 3[^"]*">.*?>3</a>\+</td>', row)
    assert re.search(r'count-failed" title="about this many: estimated[^"]*">~', row)


def test_every_time_shown_says_utc(engine: Engine) -> None:
    (job_id,) = make_failed(engine, 1)
    page = client(engine).get(f"/jobs/{job_id}").text
    times = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( UTC)?", page)
    assert times
    assert all(suffix == " UTC" for suffix in times)
    listing = client(engine).get("/jobs").text
    assert re.findall(r"\d\d:\d\d:\d\d UTC", listing)


def test_a_chart_has_a_time_axis_a_scale_with_its_unit_and_each_bars_minute_on_hover(
    engine: Engine,
) -> None:
    # issue 38: the bars were unlabelled, with no axis, scale or hover time
    new_queue(engine, "mail")
    with engine.begin() as conn:
        conn.execute(text(ROLLUP))
    page = client(engine).get("/").text
    assert 'id="chart-legend"' in page
    hour, day = re.findall(
        r'<td class="chart-cell chart-(?:hour|day)">(.*?)</td>', _row(page, "mail"), re.S
    )
    assert '<text class="axis" x="0" y="42">-60 min</text>' in hour
    assert ">now</text>" in hour
    assert '<text class="axis scale" x="243" y="8">4/min</text>' in hour  # the tallest bar
    assert "-24 h</text>" in day
    assert "/10 min</text>" in day
    titles = re.findall(r"<title>(\d\d:\d\d) UTC: (\d+) ended, (\d+) failed</title>", hour)
    assert len(titles) == 12
    assert max(int(ended) for _, ended, _ in titles) == 4
