"""The dashboard in a real browser: Playwright driving Debian's chromium (/usr/bin/chromium).

Never `playwright install`: its browser download cannot work here. `.ci/run` installs the
chromium package when it is missing. Set SQLA_QUEUE_SCREENSHOTS=docs/images to refresh the
README's screenshots from these tests.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.fault_kit import free_port
from helpers.support import WorkerThread, enqueue_jobs, jobs_by_id, wait_for
from sqlalchemy import Engine, text

from sqla_queue import Registry, admin

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

playwright_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)

from sqla_queue.dashboard import create_app  # noqa: E402


@pytest.fixture
def dashboard_url(engine: Engine) -> Iterator[str]:
    """The dashboard served by uvicorn in a thread, polling every half second."""
    port = free_port()
    config = uvicorn.Config(
        create_app(engine, poll_seconds=0.5), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=60)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def page(dashboard_url: str) -> Iterator[Any]:
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(
            base_url=dashboard_url, viewport={"width": 1280, "height": 720}
        )
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on(
            "console",
            lambda msg: errors.append(msg.text) if msg.type == "error" else None,
        )
        yield tab
        browser.close()
        # No script error and no CSP violation on any page the test opened.
        assert errors == []


def screenshot(tab: Any, name: str, full_page: bool = True) -> None:
    """Into $SQLA_QUEUE_SCREENSHOTS when set; the viewport only for a page too long to
    capture whole."""
    folder = os.environ.get("SQLA_QUEUE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(Path(folder) / name), full_page=full_page)


def flaky_registry(state: dict[str, bool]) -> Registry:
    """Task `send` fails until `state["fixed"]`, as after a bug fix is deployed."""
    registry = Registry()

    @registry.task(name="send", queue="mail", max_attempts=1)
    def send(to: str) -> None:
        if not state["fixed"]:
            raise ConnectionError(f"SMTP server refused {to}")

    @registry.task(name="resize", queue="images")
    def resize(size: int) -> None:
        del size

    return registry


def make_queues(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail", retention="keep")
        admin.create_queue(conn, "images", retention="keep")


def test_see_a_failed_jobs_traceback_retry_it_and_see_it_succeed(engine: Engine, page: Any) -> None:
    expect = playwright_api.expect
    make_queues(engine)
    state = {"fixed": False}
    registry = flaky_registry(state)
    (job_id,) = enqueue_jobs(
        engine, "send", 1, queue="mail", args={"to": "ada@example.com"}, tags=["signup"]
    )
    enqueue_jobs(engine, "resize", 3, queue="images", args={"size": 128})
    with WorkerThread(engine, registry, poll_interval=0.2):
        wait_for(lambda: jobs_by_id(engine, [job_id])[job_id].status == "failed")
        wait_for(
            lambda: all(j.status == "done" for j in jobs_by_id(engine).values() if j.id != job_id)
        )

    page.goto("/")
    mail = page.locator('tr[data-queue="mail"]')
    expect(mail.locator(".count-failed")).to_have_text("1")
    mail.locator(".count-failed a").click()
    page.locator(f'tr[data-job="{job_id}"] a[href$="/jobs/{job_id}"]').click()
    last_error = page.locator("#last-error pre.traceback")  # the error of a failed job
    expect(last_error).to_contain_text("Traceback (most recent call last)")
    expect(page.locator("dl.facts a.tag")).to_have_text("signup")
    expect(last_error).to_contain_text("ConnectionError: SMTP server refused ada@example.com")
    screenshot(page, "dashboard-job.png")

    page.get_by_role("button", name="Retry").click()
    expect(page.locator(".notice")).to_have_text("1 job(s) retried")
    expect(page.locator("h1 .status")).to_have_text("queued")
    state["fixed"] = True
    with WorkerThread(engine, registry, poll_interval=0.2):
        wait_for(lambda: jobs_by_id(engine, [job_id])[job_id].status == "done")
    page.reload()
    expect(page.locator("h1 .status")).to_have_text("done")


def _drawn_heights(bars: Any) -> list[float]:
    """The rendered heights of `bars`, once every one is drawn (within 30 s, else the last
    reading): the table is swapped in anew every half second, and under load a reading can
    fall on rows not yet laid out, all 0 (seen beside CPU hogs, never alone)."""
    script = "rs => rs.map(r => r.getBoundingClientRect().height)"
    deadline = time.monotonic() + 30
    heights: list[float] = bars.evaluate_all(script)
    while (not heights or min(heights) <= 0) and time.monotonic() < deadline:
        time.sleep(0.1)
        heights = bars.evaluate_all(script)
    return heights


def test_the_queues_page_charts_the_last_hour_and_day(engine: Engine, page: Any) -> None:
    expect = playwright_api.expect
    make_queues(engine)
    with engine.begin() as conn:
        admin.create_queue(conn, "reports")
        admin.set_paused(conn, "reports", True)
    # The workers' rollup over the last hour (ended and failed per minute), as they write
    # it: 12 distinct minutes for mail, 30 for images; a few failed jobs and a backlog.
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.job_counts (minute, queue, task, succeeded, failed) "
                "SELECT date_trunc('minute', now()) - make_interval(mins => m), q, t, "
                "2 + (m * 7) % 9, (m % 6 = 0)::int "
                "FROM (VALUES ('mail', 'send', 5), ('images', 'resize', 2)) AS s(q, t, every), "
                "generate_series(0, 59) AS m WHERE m % every = 0"
            )
        )
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs (queue, task, status, attempts, finished_at, "
                "last_error) SELECT 'images', 'resize', 'failed', 1, now(), 'boom' "
                "FROM generate_series(1, 3)"
            )
        )
    enqueue_jobs(engine, "resize", 40, queue="images", args={"size": 64})
    enqueue_jobs(engine, "report", 7, queue="reports", args={})
    page.goto("/")
    for queue, minutes in (("mail", 12), ("images", 30)):
        bars = page.locator(f'tr[data-queue="{queue}"] td.chart-hour svg.chart rect.ok')
        expect(bars).to_have_count(minutes)
        assert min(_drawn_heights(bars)) > 0  # drawn, not just present
        day = page.locator(f'tr[data-queue="{queue}"] td.chart-day svg.chart rect.ok')
        day_heights = _drawn_heights(day)
        assert 6 <= len(day_heights) <= 7
        assert min(day_heights) > 0
    failed = int(page.locator('tr[data-queue="images"] .count-failed').inner_text())
    assert failed == 3
    assert page.locator('tr[data-queue="images"] svg.chart rect.bad').count() > 0
    expect(page.locator('tr[data-queue="images"] .count-queued')).to_have_text("40")
    expect(page.locator('tr[data-queue="reports"] td').nth(1)).to_have_text("paused")
    # retention in plain words beside the counts; no implementation words on the page
    expect(page.locator('tr[data-queue="reports"] td.retention')).to_have_text(
        "succeeded jobs are deleted"
    )
    expect(page.locator('tr[data-queue="reports"] .count-done')).to_have_text("0 deleted")
    expect(page.locator('tr[data-queue="mail"] td.retention')).to_have_text(
        "succeeded jobs are kept in the history"
    )
    shown = (
        page.locator("main").inner_text()
        if page.locator("main").count()
        else page.inner_text("body")
    )
    for word in ("route", "planner", "rollup", "job_counts"):
        assert word not in shown, word
    # the hover value: the browser's tooltip is the bar's <title>, its minute and counts
    newest = page.locator('tr[data-queue="mail"] td.chart-hour svg.chart rect.ok').last
    expect(newest.locator("title")).to_have_text(re.compile(r"^\d\d:\d\d UTC: 3 ended, 1 failed$"))
    hour_axis = page.locator('tr[data-queue="mail"] td.chart-hour svg.chart text.axis')
    expect(hour_axis).to_have_text(["-60 min", "now", re.compile(r"^\d+/min$"), "0"])
    screenshot(page, "dashboard-queues.png")
    page.goto("/queues/images")
    task_bars = page.locator('tr[data-task="resize"] td.chart-hour svg.chart rect.ok')
    expect(task_bars).to_have_count(30)
    screenshot(page, "dashboard-queue-tasks.png")


def click_until_notice(page: Any, button: Any, notice: str) -> None:
    """Click `button` until the page says `notice`: the queues table is swapped by its htmx
    poll every 0.5 s, and a click that lands on the row being replaced submits nothing
    (seen once in CI under load). The action itself is idempotent (pause, resume)."""
    for _ in range(3):
        button.click()
        try:
            playwright_api.expect(page.locator(".notice")).to_have_text(notice, timeout=3_000)
        except AssertionError:
            continue
        return
    playwright_api.expect(page.locator(".notice")).to_have_text(notice)


def test_pause_a_queue_from_the_page_and_the_worker_stops_claiming_from_it(
    engine: Engine, page: Any
) -> None:
    expect = playwright_api.expect
    make_queues(engine)
    registry = flaky_registry({"fixed": True})
    page.goto("/")
    mail = page.locator('tr[data-queue="mail"]')
    click_until_notice(page, mail.get_by_role("button", name="Pause"), "queue mail paused")
    expect(mail.locator("td").nth(1)).to_have_text("paused")

    with WorkerThread(engine, registry, poll_interval=0.2):
        held = enqueue_jobs(engine, "send", 3, queue="mail", args={"to": "x@example.com"})
        control = enqueue_jobs(engine, "resize", 3, queue="images", args={"size": 1})
        # The counts refresh without a reload (htmx poll): the paused queue's 3 wait.
        expect(mail.locator(".count-queued")).to_have_text("3", timeout=10_000)
        wait_for(lambda: {j.status for j in jobs_by_id(engine, control).values()} == {"done"})
        time.sleep(1.0)  # several poll intervals after the other queue drained
        assert {j.status for j in jobs_by_id(engine, held).values()} == {"queued"}

        resume = mail.get_by_role("button", name="Resume")
        click_until_notice(page, resume, "queue mail resumed")
        wait_for(lambda: {j.status for j in jobs_by_id(engine, held).values()} == {"done"})
        expect(mail.locator(".count-done")).to_have_text("3", timeout=10_000)


def test_a_workflows_page_draws_its_tree_and_links_each_job(engine: Engine, page: Any) -> None:
    from sqlalchemy.orm import Session

    from sqla_queue import Dependency, enqueue
    from sqla_queue.db import queries

    expect = playwright_api.expect
    with engine.begin() as conn:
        admin.create_queue(conn, "etl", retention="keep")
    with Session(engine) as session, session.begin():
        extract = enqueue(
            session,
            "etl.extract",
            {"day": "2026-12-01"},
            queue="etl",
            workflow_id="nightly-2026-12-01",
        )
        orders = enqueue(session, "etl.transform_orders", {}, queue="etl", depends_on=[extract])
        users = enqueue(session, "etl.transform_users", {}, queue="etl", depends_on=[extract])
        load = enqueue(session, "etl.load", {}, queue="etl", depends_on=[orders, users])
        enqueue(session, "etl.report", {}, queue="etl", depends_on=[load])
        enqueue(
            session, "etl.cleanup", {}, queue="etl", depends_on=[Dependency(load, on_failure="run")]
        )
        session.flush()
        ids = [extract.id, orders.id, users.id, load.id]
    # the extract succeeds, one transform runs now, the other waits for a worker
    with engine.begin() as conn:
        (row,) = conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w1"}).all()
        conn.execute(
            queries.complete_jobs(),
            {"job_ids": [row.id], "job_attempts": [row.attempts], "job_results": [None]},
        )
        conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w1"}).all()

    page.goto(f"/jobs/{ids[3]}")
    expect(page.locator("#parents tr[data-parent]")).to_have_count(2)
    page.locator("#workflow-link").click()
    expect(page.locator("h1")).to_have_text("Workflow nightly-2026-12-01")
    rows = page.locator("#workflow-tree tbody tr")
    expect(rows).to_have_count(7)  # load and its dependents under both transforms
    expect(rows.first.locator(".status")).to_have_text("done")
    expect(page.locator(f'tr[data-node="{ids[3]}"] .shared').first).to_have_text("2 parents")
    screenshot(page, "workflow.png")
    rows.nth(1).locator("a").click()
    expect(page.locator("h1")).to_contain_text(f"Job {ids[1]}")


def test_the_workers_page_shows_running_jobs_and_a_stopped_worker(
    engine: Engine, page: Any
) -> None:
    from sqla_queue.db import queries

    expect = playwright_api.expect
    (job_id,) = enqueue_jobs(engine, "report", 1)
    with engine.begin() as conn:
        for worker_id in ("w-busy", "w-gone"):
            conn.execute(
                queries.beat_worker(),
                {"worker_id": worker_id, "hostname": "box", "pid": 7, "queues": None,
                 "concurrency": 2, "stale_after": 60},
            )  # fmt: skip
        conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w-busy"}).all()
        conn.execute(queries.deregister_worker(), {"worker_id": "w-gone"})

    page.goto("/workers")
    expect(page.locator("#workers tr[data-worker]")).to_have_count(1)
    gone = page.locator('#stopped-workers tr[data-stopped="w-gone"]')
    expect(gone.locator(".how")).to_have_text("graceful")
    running = page.locator('tr[data-running-of="w-busy"] tr[data-job]')
    expect(running).to_have_count(1)
    screenshot(page, "workers.png")
    running.locator("a").click()
    expect(page.locator("h1")).to_contain_text(f"Job {job_id}")


def test_retry_every_job_matching_a_filter_after_confirming_the_count(
    engine: Engine, page: Any
) -> None:
    from helpers.support import set_status

    expect = playwright_api.expect
    make_queues(engine)
    smtp = enqueue_jobs(engine, "send", 3, queue="mail", args={"to": "ada@example.com"})
    set_status(engine, smtp, "failed", "ConnectionError: SMTP server refused ada@example.com")
    other = enqueue_jobs(engine, "resize", 2, queue="images", args={"size": 128})
    set_status(engine, other, "failed", "MemoryError")

    page.goto("/jobs")
    page.locator('form.filters input[name="error"]').fill("smtp server")
    page.locator('select[name="status"]').select_option("failed")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#jobs tbody tr[data-job]")
    expect(rows).to_have_count(3)
    page.locator("#select-all").check()
    for box in page.locator('#jobs input[name="job_id"]').all():
        expect(box).to_be_checked()
    screenshot(page, "dashboard-jobs-filtered.png")
    page.get_by_role("button", name="Retry all…", exact=True).click()
    expect(page.locator("#bulk-count")).to_contain_text("3 jobs that retry takes match")
    sample = page.locator("#bulk-sample tbody tr")  # the errors the operator is about to act on
    expect(sample).to_have_count(3)
    for row in sample.all():
        expect(row.locator(".error-head")).to_have_text(
            "ConnectionError: SMTP server refused ada@example.com"
        )
    screenshot(page, "dashboard-bulk-confirm.png")
    assert {j.status for j in jobs_by_id(engine, smtp).values()} == {"failed"}
    page.get_by_role("button", name="Retry 3 jobs").click()
    expect(page.locator(".notice")).to_have_text("retried 3 jobs")
    expect(page.locator('form.filters input[name="error"]')).to_have_value("smtp server")
    assert {j.status for j in jobs_by_id(engine, smtp).values()} == {"queued"}
    assert {j.status for j in jobs_by_id(engine, other).values()} == {"failed"}


def test_a_jobs_page_shows_its_result_progress_and_each_attempts_log_lines(
    engine: Engine, page: Any
) -> None:
    from helpers.apps import journaled
    from helpers.support import make_due

    from sqla_queue.testing import run_until_empty
    from sqla_queue.worker import WorkerConfig

    expect = playwright_api.expect
    with engine.begin() as conn:
        if not admin.create_queue(conn, "default", retention="keep"):
            admin.set_retention(conn, "default", "keep")
    (chatty,) = enqueue_jobs(engine, "journal.chatty", 1)
    (tight,) = enqueue_jobs(engine, "journal.tight", 1, args={"calls": 500})
    config = WorkerConfig(concurrency=2, poll_only=True)
    run_until_empty(engine, journaled.registry, config)
    make_due(engine)
    run_until_empty(engine, journaled.registry, config)

    page.goto(f"/jobs/{tight}")
    expect(page.locator("#attempts")).to_have_text("1 of 5")  # the budget, never 1/-
    expect(page.locator("#progress .percent")).to_have_text("100%")
    expect(page.locator("#progress .progress-message")).to_have_text("call 500")
    expect(page.locator("#progress time")).to_have_attribute("title", re.compile(r" UTC$"))
    expect(page.locator("#result")).to_contain_text('"writes": 1')

    page.goto(f"/jobs/{chatty}")
    expect(page.locator("h1 .status")).to_have_text("done")
    expect(page.locator("#last-error")).to_have_count(0)  # done: its old error is history
    first = page.locator('table.log[data-log-attempt="1"] tbody tr')
    expect(first).to_have_count(200)
    expect(first.first).to_contain_text("attempt 1 starts")
    expect(page.locator('table.log[data-log-attempt="2"] tbody tr').first).to_contain_text(
        "attempt 2 starts"
    )
    expect(page.locator("#errors tr[data-attempt='1']")).to_contain_text("first attempt fails")
    page.set_viewport_size({"width": 1280, "height": 1400})
    page.evaluate("document.querySelector('table.log').previousElementSibling.scrollIntoView()")
    screenshot(page, "dashboard-job-logs.png", full_page=False)
    page.goto(f"/jobs/{tight}")
    screenshot(page, "dashboard-job-progress.png")


def test_the_doctor_page_shows_headlines_and_fixes_with_the_figures_folded(
    engine: Engine, page: Any
) -> None:
    expect = playwright_api.expect
    failed = enqueue_jobs(engine, "send", 2)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'failed', attempts = 1, last_error = 'boom', "
                "finished_at = now() - interval '8 days' WHERE id = ANY(:ids)"
            ),
            {"ids": failed},
        )
    page.goto("/doctor")
    row = page.locator('#findings tr[data-check="failed_jobs"]')
    expect(row.locator(".fix")).to_contain_text("sqla-queue prune --status failed --older-than 7d")
    details = page.locator("#findings details.finding-details").first
    expect(details.locator("pre")).not_to_be_visible()  # folded until opened
    details.locator("summary").click()
    expect(details.locator("pre")).to_be_visible()
    screenshot(page, "dashboard-doctor.png")
