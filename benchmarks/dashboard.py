"""The dashboard on 1,000,000 jobs (issue 26): how long each page and each read takes.

    python -m benchmarks.dashboard [SERVER_URL] [--jobs N] [--times N]

Fills a database of its own (benchmarks.database) with `--jobs` jobs created one every
3600/N seconds up to now: 90% done, 2% failed, 1% cancelled, 7% queued, 0.1% running, in
four `keep` queues and ten tasks (900,000 of 1,000,000 finished in the last hour);
VACUUM ANALYZE; then the rollup the workers would have written for them (`job_counts`,
one row per minute, queue and task) and a workflow of 20 jobs. Then, through Starlette's
TestClient (in process, no network) and on connections of its own:

1. `pages`: each page and each of the queues page's reads, one warm-up then the median of
   `--times` (the queues page's "first load" forgets the shared counts before each
   request, so each one counts again);
2. `job_pages`: each filter of the jobs page: EXPLAIN ANALYZE's execution time (best of
   3), the rows its plan read, and the HTTP request (best of 3).

These are figures, for BENCHMARKS.md with the load average printed beside them:
`tests/dashboard/test_dashboard_scale.py` asserts what holds whatever the machine's load
(the rows each plan reads, which statements a page runs), never a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text

from sqla_queue.dashboard import create_app, reads
from sqla_queue.dashboard.pages import Dashboard
from sqla_queue.db import rollup
from sqla_queue.db.models import JobStatus
from sqla_queue.db.queries import dashboard as statements

from .database import LOCAL_URL, BenchDatabase

JOBS = 1_000_000

# 40% mail, 40% images, 20% reports, one in a thousand `rare`; 90% done, 2% failed, 1%
# cancelled, ~7% queued, one in a thousand running. Ids ascend with time.
POPULATE = """
INSERT INTO sqla_queue.queues (name, retention)
VALUES ('mail', 'keep'), ('images', 'keep'), ('reports', 'keep'), ('rare', 'keep');
INSERT INTO sqla_queue.jobs
    (queue, task, args, status, attempts, run_at, created_at, finished_at, last_error)
SELECT
    CASE WHEN g % 1000 = 7 THEN 'rare' WHEN g % 5 < 2 THEN 'mail'
         WHEN g % 5 < 4 THEN 'images' ELSE 'reports' END,
    'task_' || (g % 10),
    jsonb_build_object('n', g),
    CASE WHEN g % 1000 = 3 THEN 'running' WHEN g % 100 < 2 THEN 'failed'
         WHEN g % 100 = 2 THEN 'cancelled' WHEN g % 100 < 10 THEN 'queued' ELSE 'done' END,
    1,
    now() - make_interval(secs => (:jobs - g) * :spacing),
    now() - make_interval(secs => (:jobs - g) * :spacing),
    CASE WHEN g % 100 >= 10 OR g % 100 < 3
         THEN now() - make_interval(secs => (:jobs - g) * :spacing) END,
    CASE WHEN g % 100 < 2 THEN 'Traceback (most recent call last):' || chr(10) || 'boom' END
FROM generate_series(1, :jobs) AS g;
"""

# The rollup the workers would have written for those jobs (one row per minute, queue and
# task: 2,400 rows for the hour), and a workflow of 20 of them.
ROLLUP = """
INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed, retried, run_seconds)
SELECT date_trunc('minute', finished_at), queue, task, count(*) FILTER (WHERE status = 'done'),
       count(*) FILTER (WHERE status = 'failed'), 0, count(*) * 0.01
FROM sqla_queue.jobs WHERE finished_at IS NOT NULL GROUP BY 1, 2, 3;
UPDATE sqla_queue.jobs SET workflow_id = 'wf-1' WHERE id <= 20;
ANALYZE sqla_queue.job_counts
"""


def job_page_cases(jobs: int = JOBS) -> list[tuple[dict[str, str], int | None]]:
    """(filters, before) of the jobs page: common and rare filters, one matching nothing,
    first and deep pages."""
    return [
        ({}, None),
        ({}, jobs // 2),
        ({"queue": "mail"}, None),
        ({"queue": "rare"}, None),
        ({"queue": "rare"}, jobs // 2),
        ({"task": "task_3"}, jobs // 3),
        ({"status": "failed"}, None),
        ({"status": "queued"}, None),
        ({"status": "running"}, None),
        ({"status": "cancelled"}, jobs // 4),
        ({"queue": "rare", "status": "failed"}, None),  # matches nothing
        ({"queue": "nosuch"}, None),
        ({"tag": "nosuch"}, None),
        ({"queue": "mail", "task": "task_2", "status": "done"}, jobs // 5),
    ]


def populate(engine: Engine, spacing: float, jobs: int = JOBS) -> Engine:
    """`jobs` jobs, one every `spacing` seconds up to now, vacuumed and analyzed."""
    with engine.begin() as conn:
        for statement in POPULATE.strip().split(";\n"):
            if statement.strip():
                conn.execute(text(statement), {"jobs": jobs, "spacing": spacing})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE sqla_queue.jobs"))
    return engine


def add_rollup(engine: Engine) -> Engine:
    """The rollup of the jobs populated, and the workflow `wf-1` of 20 of them."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for statement in ROLLUP.strip().split(";\n"):
            conn.execute(text(statement))
    return engine


def explain(conn: Connection, filters: dict[str, str], before: int | None) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, FORMAT JSON) of the jobs page's statement for these filters."""
    status = JobStatus(filters["status"]) if "status" in filters else None
    where = reads.JobFilter(
        queue=filters.get("queue"), task=filters.get("task"), status=status, tag=filters.get("tag")
    )
    statement = statements.job_page(where, before is not None)
    params: dict[str, Any] = {
        "limit": reads.PAGE_SIZE + 1,
        "window": reads.SEARCH_WINDOW,
        "before_id": before,
    }
    compiled = statement.compile(dialect=conn.dialect)
    values = compiled.construct_params(params)
    (plan,) = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}", values).one()
    return dict((plan if isinstance(plan, list) else json.loads(plan))[0])


def rows_read(node: dict[str, Any]) -> int:
    """Rows the scans of a plan's tables produced (the rows it read from the jobs table and
    the history; a subquery's scan reads no table)."""
    own = node.get("Actual Rows", 0) if "Relation Name" in node else 0
    return int(own) + sum(rows_read(child) for child in node.get("Plans", []))


def job_page_path(filters: dict[str, str], before: int | None) -> str:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    return f"/jobs?{query}" + (f"&before={before}" if before else "")


def page_checks(engine: Engine, jobs: int = JOBS) -> list[tuple[str, Callable[[], Any]]]:
    """(what, call) of every page and every read of the queues page; each call fails on a
    page that does not answer 200."""
    from starlette.testclient import TestClient

    dashboard = Dashboard(engine)
    first = TestClient(dashboard.app)

    def first_load(path: str) -> Callable[[], Any]:
        """A GET with the shared counts forgotten: counted again, as on the first load."""

        def get() -> None:
            dashboard._forget_counts()
            page = first.get(path)
            assert page.status_code == 200, page.text[:500]

        return get

    web = TestClient(create_app(engine))

    def get(path: str) -> Callable[[], Any]:
        def call() -> None:
            page = web.get(path)
            assert page.status_code == 200, page.text[:500]

        return call

    def read(function: Callable[[Any], Any]) -> Callable[[], Any]:
        def call() -> None:
            with engine.connect() as conn:
                function(conn)

        return call

    return [
        ("GET / (queues page, first load: counts and charts)", first_load("/")),
        ("GET /partials/queues (first load)", first_load("/partials/queues")),
        ("GET /queues/mail (per-task charts)", get("/queues/mail")),
        ("GET /jobs", get("/jobs")),
        ("GET /jobs?status=failed", get("/jobs?status=failed")),
        ("GET /jobs?status=running", get("/jobs?status=running")),
        (f"GET /jobs/{jobs // 2}", get(f"/jobs/{jobs // 2}")),
        ("GET /workflows/wf-1", get("/workflows/wf-1")),
        ("GET /workers", get("/workers")),
        ("GET /doctor", get("/doctor")),
        (
            "read: the jobs table's estimated size",
            read(lambda c: rollup.plan_rows(c, statements.ESTIMATED_ROWS)),
        ),
        (
            "read: queued, running, waiting (capped) and oldest due, every queue",
            read(
                lambda c: (
                    c.execute(statements.NO_JIT),
                    c.execute(statements.BOUNDED_COUNTS, {"cap": reads.COUNT_CAP}).all(),
                )
            ),
        ),
        (
            "read: done, failed, cancelled estimates, one queue",
            read(
                lambda c: [
                    rollup.plan_rows(c, statements.ESTIMATED_COUNT, {"queue": "mail", "status": s})
                    for s in reads.ESTIMATED
                ]
            ),
        ),
        ("read: every queue's counts (bounded_rows)", read(reads.bounded_rows)),
        ("read: last hour per minute, every queue", read(lambda c: rollup.recent(c, rollup.HOUR))),
        (
            "read: last day per 10 minutes, every queue",
            read(lambda c: rollup.recent(c, rollup.DAY)),
        ),
        (
            "read: last day per task of a queue",
            read(lambda c: rollup.recent(c, rollup.DAY, "mail", by_task=True)),
        ),
    ]


def median_ms(call: Callable[[], Any], times: int = 5) -> float:
    """The median of `times` timed calls, after one untimed warm-up call."""
    call()
    timings = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def pages(engine: Engine, jobs: int = JOBS, times: int = 5) -> dict[str, float]:
    """The median ms of each page and read of `page_checks`."""
    return {name: median_ms(call, times) for name, call in page_checks(engine, jobs)}


def job_pages(engine: Engine, jobs: int = JOBS) -> list[dict[str, Any]]:
    """Each filter of the jobs page: the rows its plan read, EXPLAIN ANALYZE's execution
    ms and the HTTP request's ms (each the best of 3)."""
    from starlette.testclient import TestClient

    web = TestClient(create_app(engine))
    found = []
    with engine.connect() as conn:
        for filters, before in job_page_cases(jobs):
            plans = [explain(conn, filters, before) for _ in range(3)]
            path = job_page_path(filters, before)
            timings = []
            for _ in range(3):
                started = time.perf_counter()
                assert web.get(path).status_code == 200
                timings.append((time.perf_counter() - started) * 1000)
            found.append(
                {
                    "path": path,
                    "rows_read": rows_read(plans[0]["Plan"]),
                    "execution_ms": min(p["Execution Time"] for p in plans),
                    "http_ms": min(timings),
                }
            )
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dashboard", description=__doc__)
    p.add_argument("server_url", nargs="?", default=LOCAL_URL)
    p.add_argument("--jobs", type=int, default=JOBS, help="jobs in the last hour")
    p.add_argument("--times", type=int, default=5, help="timed calls per page (median)")
    args = p.parse_args(argv)
    db = BenchDatabase(args.server_url)
    db.create()
    try:
        assert db.engine is not None
        add_rollup(populate(db.engine, 3600 / args.jobs, args.jobs))
        load_before = os.getloadavg()
        results: dict[str, Any] = {
            "jobs": args.jobs,
            "pages": pages(db.engine, args.jobs, args.times),
            "job_pages": job_pages(db.engine, args.jobs),
        }
        load_after = os.getloadavg()
    finally:
        db.drop()
    results["load"] = {"before": load_before, "after": load_after}
    print(
        f"\n{args.jobs:,} jobs; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(f"what | median ms of {args.times} (after a warm-up)")
    for name, ms in results["pages"].items():
        print(f"{name} | {ms:.1f}")
    print("\npath | rows read | EXPLAIN ANALYZE ms | HTTP ms (best of 3)")
    for row in results["job_pages"]:
        print(
            f"{row['path']} | {row['rows_read']} | {row['execution_ms']:.1f} | {row['http_ms']:.1f}"
        )
    print(json.dumps(results, default=str))
    return results


if __name__ == "__main__":
    main()
