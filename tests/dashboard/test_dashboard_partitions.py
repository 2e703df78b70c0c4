"""A queue's page: its settings, its deepest partitions (fair or partition-limited), the
sequences its failed jobs hold (with a link to the job) and its aged jobs (aging), every
partition and sequence key escaped."""

from __future__ import annotations

import html
import re

from helpers.dashboard_kit import client, new_queue
from helpers.turns_kit import HELD_SEQUENCE, turns_backlog
from sqlalchemy import Engine, text

from sqla_queue import admin
from sqla_queue.admin import partitions

SCRIPT = "<script>alert('owned')</script>"


def _table(page: str, table_id: str) -> str:
    found = re.search(rf'<table id="{table_id}".*?</table>', page, re.S)
    assert found, f"no table {table_id}"
    return found.group(0)


def test_a_fair_queue_page_shows_its_deepest_partitions_escaped(engine: Engine) -> None:
    turns_backlog(engine, ((SCRIPT, 3), ("globex", 1)))
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'running' "
                "WHERE id = (SELECT min(id) FROM sqla_queue.jobs WHERE partition = 'globex')"
            )
        )

        partitions.set_partition_weight(conn, "tenants", "globex", 2.5)  # issue 38: shown

    page = client(engine).get("/queues/tenants").text

    assert SCRIPT not in page
    rows = re.findall(
        r"<tr[^>]*>\s*<td>(.*?)</td>\s*<td class=\"num weight\">([\d.]+)</td>"
        r"\s*<td class=\"num\">(\d+)</td>\s*<td class=\"num\">(\d+)</td>",
        _table(page, "partitions"),
        re.S,
    )
    assert [(html.unescape(p), w, int(q), int(r)) for p, w, q, r in rows] == [
        (SCRIPT, "1", 3, 0),
        ('<span class="muted">(no partition)</span>', "1", 1, 0),
        ("globex", "2.5", 0, 1),
    ]
    weights = _table(page, "partition-weights")
    assert re.search(r"<td>globex</td><td class=\"num\">2.5</td>", weights)
    assert "yes: claims take turns between its partitions" in page
    assert "held-sequences" not in page
    assert 'id="aged"' not in page  # the queue does not age


def test_a_queue_page_links_each_held_sequence_to_its_failed_job(engine: Engine) -> None:
    failed_id = turns_backlog(engine, held_minutes=20)

    page = client(engine).get("/queues/default").text

    held = _table(page, "held-sequences")
    assert HELD_SEQUENCE not in page
    assert html.escape(HELD_SEQUENCE, quote=False) in held
    assert f'href="/jobs/{failed_id}"' in held
    assert "20 min" in held
    assert re.search(r'<td class="num">2</td>', held)  # two jobs waiting behind it
    assert 'id="partitions"' not in page  # not fair, not partition-limited
    assert "hold: a failed job holds its sequence until retried or deleted" in page


def test_an_aging_queue_page_counts_its_aged_jobs_and_shows_its_policy(engine: Engine) -> None:
    turns_backlog(engine)
    new_queue(engine, "capped")
    with engine.begin() as conn:
        partitions.set_partition_limit(conn, "capped", 2)
        partitions.set_sequence_on_failure(conn, "capped", "skip")
        admin.set_max_running(conn, "capped", 7)

    slow = client(engine).get("/queues/slow").text
    capped = client(engine).get("/queues/capped").text

    assert re.search(r'<dd id="aged">1 due job', slow)
    assert "one priority step per 60.0 s" in slow
    assert "2 running per partition" in capped
    assert "skip: a sequence goes on past a failed job" in capped
    assert re.search(r"<dt>max running</dt><dd>7</dd>", capped)
    assert 'id="partitions"' not in capped  # a partition-limited queue with no job: no rows
    assert 'id="settings"' not in client(engine).get("/queues/nosuch").text  # no row
