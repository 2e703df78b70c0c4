"""The dashboard on 1,000,000 jobs: every job list page, whatever its filters, reads a
bounded number of rows (the rows its plan read, by EXPLAIN ANALYZE); the queues page's
counts are bounded and shared between viewers (a second viewer's request reads no jobs
row); and every page (the queues page's first load, a job, a workflow, workers, doctor)
and each of the queues page's reads answers with 900,000 jobs finished in the last hour,
its charts from the workers' rollup, not from the jobs table.

How long each takes is a figure, not a test: `python -m benchmarks.dashboard` measures it
(BENCHMARKS.md, issue 26). Nothing here reads a clock, so a loaded machine cannot fail it;
a plan that reads the table, or a page that counts it, still does."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from starlette.testclient import TestClient

from sqla_queue.dashboard import create_app, reads
from sqla_queue.dashboard.pages import Dashboard
from sqla_queue.db import rollup

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import dashboard as bench

pytestmark = pytest.mark.slow

JOBS = bench.JOBS
JOBS_TABLE = re.compile(r"\bsqla_queue\.jobs\b")
"""A statement that names the jobs table (not `job_counts`, not the history's tables)."""


@pytest.fixture
def million(engine: Engine) -> Engine:
    """A job every 0.1 s: 28 hours of history."""
    return bench.populate(engine, 0.1)


@pytest.fixture
def million_last_hour(engine: Engine) -> Engine:
    """A job every 3.6 ms: 1,000,000 in the last hour, 900,000 of them finished (done,
    failed or cancelled), and the hour's rollup."""
    return bench.add_rollup(bench.populate(engine, 3600 / JOBS))


@contextmanager
def statements_run(engine: Engine) -> Iterator[list[str]]:
    """The SQL of every statement `engine`'s connections send within the block."""
    ran: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        ran.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield ran
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_every_job_page_reads_a_bounded_window_on_a_million_jobs(million: Engine) -> None:
    web = TestClient(create_app(million))
    with million.connect() as conn:
        for filters, before in bench.job_page_cases(JOBS):
            read = bench.rows_read(bench.explain(conn, filters, before)["Plan"])
            path = bench.job_page_path(filters, before)
            page = web.get(path)
            assert page.status_code == 200, (path, page.text[:500])
            # What holds whatever the machine's load: no page reads beyond its window.
            assert read <= reads.SEARCH_WINDOW + reads.PAGE_SIZE + 1, (path, read)
            if not filters:
                assert len(re.findall(r'<tr data-job="', page.text)) == reads.PAGE_SIZE
    # The queues page's counts are bounded on a table this big (capped, or estimated), and
    # viewers share one count: within a poll, the next request reads no row of the table.
    dashboard = Dashboard(million, poll_seconds=3600)
    viewer = TestClient(dashboard.app)
    with statements_run(million) as first:
        assert viewer.get("/").status_code == 200
    with statements_run(million) as shared:
        assert viewer.get("/partials/queues").status_code == 200
    assert any(JOBS_TABLE.search(s) for s in first), first
    assert not [s for s in shared if JOBS_TABLE.search(s)], shared


def test_every_page_and_read_answers_from_bounded_reads_with_900_000_jobs_in_the_hour(
    million_last_hour: Engine,
) -> None:
    engine = million_last_hour
    with engine.connect() as conn:
        done = conn.execute(
            text(
                "SELECT count(*) FROM sqla_queue.jobs "
                "WHERE status = 'done' AND finished_at > now() - interval '1 hour'"
            )
        ).scalar()
        ended = conn.execute(
            text("SELECT sum(succeeded + failed) FROM sqla_queue.job_counts")
        ).scalar()
    # 900,000 done within the hour as populated (a minute or so of them has aged out since)
    assert done > 850_000
    assert ended == 920_000  # done and failed (cancelled jobs are not attempts that ended)

    for _, call in bench.page_checks(engine, JOBS):  # each fails unless its page answers 200
        call()
    with engine.connect() as conn:
        rows = {row.name: row for row in reads.queue_rows(conn)}
    assert rows["mail"].estimated  # a big table: bounded counts
    assert rows["mail"].hour is not None
    assert sum(rows["mail"].hour.finished) > 300_000
    # The charts read the rollup (a few thousand rows), never the finished jobs themselves.
    with engine.connect() as conn, statements_run(engine) as charts:
        rollup.recent(conn, rollup.HOUR)
        rollup.recent(conn, rollup.DAY)
        rollup.recent(conn, rollup.DAY, "mail", by_task=True)
    assert charts
    assert not [s for s in charts if JOBS_TABLE.search(s)], charts
    # doctor tells the failures of the last day from the rollup, and says so
    doctor = TestClient(create_app(engine)).get("/doctor")
    assert doctor.status_code == 200
    assert "the table is too big to count them" in doctor.text
