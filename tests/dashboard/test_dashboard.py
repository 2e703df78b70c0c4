"""The web dashboard over HTTP: pages, escaping, CSRF, auth, read-only, actions, mounting."""

from __future__ import annotations

import base64
import inspect
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.dashboard_kit import client, csrf_of, make_failed, new_queue
from helpers.support import enqueue_jobs, jobs_by_id, statuses, wait_for
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from sqla_queue import JobContext, admin
from sqla_queue.cli import main
from sqla_queue.dashboard import create_app, reads, wsgi_app
from sqla_queue.dashboard.pages import Dashboard, DashboardOptions
from sqla_queue.db import queries
from sqla_queue.errors import Sleeping
from sqla_queue.worker.steps import EngineJournal

SCRIPT = "<script>alert('owned')</script>"


# -- pages ----------------------------------------------------------------------------------


def test_queues_page_shows_counts_per_status_and_the_paused_flag(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail", retention="keep")
        admin.set_paused(conn, "mail", True)
    enqueue_jobs(engine, "send", 3, queue="mail")
    page = client(engine).get("/")
    assert page.status_code == 200
    row = re.search(r'<tr data-queue="mail">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    assert "paused" in row.group(1)
    assert re.search(r'count-queued">\s*<a[^>]*>3</a>', row.group(1))
    assert "succeeded jobs are kept" in row.group(1)
    assert "<svg" in row.group(1)  # the last hour's chart
    # The polled fragment carries the same counts, for the live refresh.
    fragment = client(engine).get("/partials/queues").text
    assert fragment.startswith("<table")
    assert 'hx-trigger="every' in fragment
    assert "count-queued" in fragment


def test_failed_job_page_shows_args_attempts_and_the_traceback(engine: Engine) -> None:
    (job_id,) = make_failed(engine, message="the mail server said no", to="a@example.com")
    page = client(engine).get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert "Traceback (most recent call last)" in page.text
    assert "RuntimeError: the mail server said no" in page.text
    assert "a@example.com" in page.text
    assert re.search(r"<dt>attempts</dt><dd id=\"attempts\">1 of 1</dd>", page.text)
    assert "Retry" in page.text


def test_args_and_errors_are_escaped_so_a_script_payload_stays_text(engine: Engine) -> None:
    (job_id,) = make_failed(engine, message=SCRIPT, note=SCRIPT)
    web = client(engine)
    for path in (f"/jobs/{job_id}", "/jobs", "/jobs?task=fails"):
        body = web.get(path).text
        assert "<script>alert" not in body, path
        assert "&lt;script&gt;alert(" in body, path
    # And the page forbids inline scripts anyway.
    assert "script-src 'self'" in web.get("/").headers["content-security-policy"]


def test_a_queue_name_with_markup_is_escaped(engine: Engine) -> None:
    new_queue(engine, 'q"><img src=x onerror=alert(1)>')
    enqueue_jobs(engine, "t", 1, queue='q"><img src=x onerror=alert(1)>')
    body = client(engine).get("/").text
    assert "<img src=x" not in body
    assert "&lt;img src=x onerror=alert(1)&gt;" in body


def test_unknown_job_is_404_with_a_reason(engine: Engine) -> None:
    page = client(engine).get("/jobs/999999")
    assert page.status_code == 404
    assert "no job 999999" in page.text


def test_a_bad_status_filter_is_a_400_naming_the_choices(engine: Engine) -> None:
    page = client(engine).get("/jobs?status=exploded")
    assert page.status_code == 400
    assert "queued, running, done, failed, cancelled" in page.text


def test_job_list_filters_by_queue_task_and_status(engine: Engine) -> None:
    failed = make_failed(engine)  # first: its worker would run (and fail) every due job
    new_queue(engine, "mail")
    new_queue(engine, "images")
    mail = enqueue_jobs(engine, "send", 2, queue="mail")
    enqueue_jobs(engine, "resize", 2, queue="images")
    web = client(engine)

    def listed(query: str) -> set[int]:
        return {int(i) for i in re.findall(r'<tr data-job="(\d+)">', web.get(query).text)}

    assert listed("/jobs?queue=mail") == set(mail)
    assert listed("/jobs?task=fails") == set(failed)
    assert listed("/jobs?status=failed") == set(failed)
    assert listed("/jobs?queue=mail&status=failed") == set()
    assert len(listed("/jobs")) == 5


def test_job_list_filters_by_tag_and_shows_tags_escaped(engine: Engine) -> None:
    billing = enqueue_jobs(engine, "charge", 2, tags=["billing", "<b>vip</b>"])
    enqueue_jobs(engine, "charge", 2, tags=["other"])
    web = client(engine)
    body = web.get("/jobs?tag=billing").text
    assert {int(i) for i in re.findall(r'<tr data-job="(\d+)">', body)} == set(billing)
    assert "&lt;b&gt;vip&lt;/b&gt;" in body
    assert "<b>vip</b>" not in body
    escaped = web.get("/jobs?tag=%3Cb%3Evip%3C%2Fb%3E").text
    assert {int(i) for i in re.findall(r'<tr data-job="(\d+)">', escaped)} == set(billing)
    job_page = web.get(f"/jobs/{billing[0]}").text
    assert 'href="/jobs?tag=billing"' in job_page


def test_keyset_pagination_lists_every_job_once_newest_first(engine: Engine) -> None:
    ids = enqueue_jobs(engine, "t", 120)
    web = client(engine)
    seen: list[int] = []
    path: str | None = "/jobs"
    pages = 0
    while path is not None:
        body = web.get(path).text
        seen += [int(i) for i in re.findall(r'<tr data-job="(\d+)">', body)]
        found = re.search(r'rel="next" href="([^"]+)"', body)
        path = found.group(1).replace("&amp;", "&") if found else None
        pages += 1
    assert seen == sorted(ids, reverse=True)
    assert pages == 3  # 50 + 50 + 20


def test_a_rare_filter_pages_through_bounded_windows_and_misses_nothing(engine: Engine) -> None:
    new_queue(engine, "rare")
    rare: list[int] = []
    for _ in range(5):
        enqueue_jobs(engine, "t", 17)
        rare += enqueue_jobs(engine, "t", 1, queue="rare")
    where = reads.JobFilter(queue="rare")
    seen: list[int] = []
    before: int | None = None
    short_pages = 0
    with engine.connect() as conn:
        while True:
            page = reads.list_jobs(conn, where, before, limit=2, window=10)
            seen += [row["id"] for row in page.jobs]
            short_pages += page.searched == 10
            if page.search_before is not None:
                assert page.next_before is None  # a short page offers a search, not a page
            before = page.next_before or page.search_before
            if before is None:
                break
    assert seen == sorted(rare, reverse=True)
    assert short_pages > 0  # some pages stopped at the window, not at the limit


def test_workers_page_lists_live_registrations(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            queries.beat_worker(),
            {
                "worker_id": "w-<b>1</b>",
                "hostname": "box",
                "pid": 42,
                "queues": ["mail"],
                "concurrency": 4,
                "stale_after": 30,
            },
        )
    body = client(engine).get("/workers").text
    assert "w-&lt;b&gt;1&lt;/b&gt;" in body
    assert "box" in body
    assert "mail" in body


def test_doctor_page_shows_the_findings(engine: Engine) -> None:
    body = client(engine).get("/doctor").text
    for check in ("schema", "stuck_jobs", "backlog", "failed_jobs"):
        assert f"<td>{check}</td>" in body


# -- actions --------------------------------------------------------------------------------


def test_an_action_without_the_csrf_token_is_refused_and_changes_nothing(engine: Engine) -> None:
    (job_id,) = make_failed(engine)
    web = client(engine)
    web.get("/")  # has the cookie, but the form below omits the token
    refused = web.post("/jobs/action", data={"action": "delete", "job_id": str(job_id)})
    assert refused.status_code == 403
    assert "CSRF" in refused.text
    forged = web.post(
        "/jobs/action", data={"action": "delete", "job_id": str(job_id), "csrf_token": "guess"}
    )
    assert forged.status_code == 403
    refused_pause = web.post("/queues/default/pause")
    assert refused_pause.status_code == 403
    assert statuses(engine, [job_id]) == {job_id: "failed"}


def test_retry_selected_requeues_failed_jobs_and_leaves_others(engine: Engine) -> None:
    failed = make_failed(engine, 2)
    (queued,) = enqueue_jobs(engine, "t", 1)  # after: make_failed's worker would run it
    web = client(engine)
    token = csrf_of(web.get("/jobs").text)
    answer = web.post(
        "/jobs/action",
        data={"action": "retry", "job_id": [*map(str, failed), str(queued)], "csrf_token": token},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    notice = web.get(answer.headers["location"]).text
    assert "2 job(s) retried; 1 left alone" in notice
    rows = jobs_by_id(engine, [*failed, queued])
    assert {rows[i].status for i in failed} == {"queued"}
    # A fresh budget (admin.retry_jobs): one more attempt than used, as max_attempts was 1.
    assert {rows[i].max_attempts for i in failed} == {2}
    assert rows[failed[0]].last_error is not None  # kept for the record


def test_cancel_and_delete_from_the_job_page(engine: Engine) -> None:
    (queued,) = enqueue_jobs(engine, "t", 1)
    web = client(engine)
    page = web.get(f"/jobs/{queued}").text
    assert 'value="cancel"' in page
    web.post(
        "/jobs/action",
        data={"action": "cancel", "job_id": str(queued), "csrf_token": csrf_of(page)},
    )
    assert statuses(engine, [queued]) == {queued: "cancelled"}
    page = web.get(f"/jobs/{queued}").text
    web.post(
        "/jobs/action",
        data={"action": "delete", "job_id": str(queued), "csrf_token": csrf_of(page)},
    )
    assert statuses(engine, [queued]) == {}


@pytest.mark.parametrize("back", ["//evil.example/x", "/\\evil.example/x", "https://evil.example/"])
def test_an_action_redirects_only_within_the_dashboard(engine: Engine, back: str) -> None:
    web = client(engine)
    token = csrf_of(web.get("/jobs").text)
    answer = web.post(
        "/jobs/action",
        data={"action": "retry", "job_id": "1", "csrf_token": token, "back": back},
        follow_redirects=False,
    )
    assert answer.headers["location"].startswith("/jobs?notice=")


def test_delete_leaves_running_jobs_alone(engine: Engine) -> None:
    (job_id,) = enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET status = 'running', attempts = 1 WHERE id = :i"),
            {"i": job_id},
        )
    web = client(engine)
    token = csrf_of(web.get("/jobs").text)
    web.post("/jobs/action", data={"action": "delete", "job_id": str(job_id), "csrf_token": token})
    assert statuses(engine, [job_id]) == {job_id: "running"}


def test_pause_and_resume_a_queue_from_the_page(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail")
    web = client(engine)
    token = csrf_of(web.get("/").text)
    web.post("/queues/mail/pause", data={"csrf_token": token})
    with engine.connect() as conn:
        assert {q.name: q.paused for q in admin.list_queues(conn)}["mail"] is True
    assert "Resume" in web.get("/").text
    web.post("/queues/mail/resume", data={"csrf_token": token})
    with engine.connect() as conn:
        assert {q.name: q.paused for q in admin.list_queues(conn)}["mail"] is False


def test_read_only_hides_the_actions_and_refuses_them(engine: Engine) -> None:
    (job_id,) = make_failed(engine)
    web = client(engine, read_only=True)
    for path in ("/", "/jobs", f"/jobs/{job_id}"):
        body = web.get(path).text
        assert 'method="post"' not in body, path
        assert "read-only" in body
    # A hand-made POST with a valid token is refused too.
    token = web.cookies.get("sqla_queue_csrf")
    assert token
    answer = web.post(
        "/jobs/action", data={"action": "delete", "job_id": str(job_id), "csrf_token": token}
    )
    assert answer.status_code == 403
    assert statuses(engine, [job_id]) == {job_id: "failed"}


# -- auth -----------------------------------------------------------------------------------


def basic(user: str, password: str) -> dict[str, str]:
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {encoded}"}


def test_basic_auth_is_required_when_configured(engine: Engine) -> None:
    web = client(engine, auth="admin:s3cret")
    refused = web.get("/")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Basic")
    assert web.get("/", headers=basic("admin", "wrong")).status_code == 401
    assert web.get("/static/htmx.min.js").status_code == 401
    assert web.get("/", headers=basic("admin", "s3cret")).status_code == 200


def test_a_token_works_as_bearer_or_as_the_basic_password(engine: Engine) -> None:
    web = client(engine, auth="tok3n")
    assert web.get("/").status_code == 401
    assert web.get("/", headers={"Authorization": "Bearer tok3n"}).status_code == 200
    assert web.get("/", headers=basic("anyone", "tok3n")).status_code == 200
    assert web.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_cli_refuses_a_non_loopback_host_without_auth(database_url: str, host: str) -> None:
    result = CliRunner().invoke(main, ["dashboard", "--database-url", database_url, "--host", host])
    assert result.exit_code == 1
    assert f"refusing to serve the dashboard on {host} without --auth" in result.output
    assert "--auth user:password" in result.output


def test_cli_serves_the_dashboard_and_asks_for_its_credentials(database_url: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [str(Path(sys.executable).parent / "sqla-queue"), "dashboard", "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--database-url", database_url, "--auth", "admin:s3cret"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/"

        def answers() -> int | None:
            request = urllib.request.Request(url, headers=basic("admin", "s3cret"))
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return exc.code
            except OSError:
                return None

        assert wait_for(answers, timeout=60) == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)  # a loaded server answers late, not never
        assert refused.value.code == 401
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    assert f"sqla-queue dashboard on http://127.0.0.1:{port}/" in output


def test_cli_rejects_malformed_auth(database_url: str) -> None:
    result = CliRunner().invoke(main, ["dashboard", "--database-url", database_url, "--auth", ":x"])
    assert result.exit_code == 1
    assert "--auth must be user:password" in result.output


# -- mounting -------------------------------------------------------------------------------


def test_the_app_factories_pass_on_every_option_of_the_dashboard() -> None:
    keywords = inspect.signature(Dashboard.__init__).parameters.values()
    named = {p.name for p in keywords if p.kind is p.KEYWORD_ONLY}
    assert set(DashboardOptions.__annotations__) == named


def test_mounted_in_fastapi_under_a_prefix(engine: Engine) -> None:
    from fastapi import FastAPI

    (job_id,) = make_failed(engine)
    app = FastAPI()
    app.mount("/admin/queue", create_app(engine))
    web = TestClient(app)
    page = web.get("/admin/queue/")
    assert page.status_code == 200
    assert 'href="/admin/queue/jobs"' in page.text
    assert 'src="/admin/queue/static/htmx.min.js"' in page.text
    assert web.get("/admin/queue/static/htmx.min.js").status_code == 200
    token = csrf_of(web.get(f"/admin/queue/jobs/{job_id}").text)
    answer = web.post(
        "/admin/queue/jobs/action",
        data={"action": "retry", "job_id": str(job_id), "csrf_token": token, "back": "/jobs"},
        follow_redirects=False,
    )
    assert answer.headers["location"].startswith("/admin/queue/jobs?notice=")
    assert statuses(engine, [job_id]) == {job_id: "queued"}


def test_mounted_in_flask_under_a_prefix(engine: Engine) -> None:
    from flask import Flask
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    (job_id,) = make_failed(engine)
    flask_app = Flask(__name__)
    flask_app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        flask_app.wsgi_app, {"/queue": wsgi_app(engine)}
    )
    web = flask_app.test_client()
    page = web.get(f"/queue/jobs/{job_id}")
    assert page.status_code == 200
    body = page.get_data(as_text=True)
    assert "RuntimeError: boom" in body
    assert 'href="/queue/jobs"' in body
    answer = web.post(
        "/queue/jobs/action",
        data={"action": "delete", "job_id": str(job_id), "csrf_token": csrf_of(body)},
    )
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/queue/jobs?notice=")
    assert statuses(engine, [job_id]) == {}


# -- unique keys, bad input, notices, the Older link (issue 20) -----------------------------


def failed_sharing_a_key(engine: Engine, count: int) -> list[int]:
    """Failed jobs with one unique key: each failed before the next was enqueued."""
    ids: list[int] = []
    for _ in range(count):
        (job_id,) = enqueue_jobs(engine, "t", 1, args={"k": 1}, unique=True)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE sqla_queue.jobs SET status = 'failed', attempts = 1 WHERE id = :i"),
                {"i": job_id},
            )
        ids.append(job_id)
    return ids


def test_retry_of_jobs_sharing_a_unique_key_retries_one_and_names_the_others(
    engine: Engine,
) -> None:
    first, second = failed_sharing_a_key(engine, 2)
    web = client(engine)
    token = csrf_of(web.get("/jobs").text)
    answer = web.post(
        "/jobs/action",
        data={"action": "retry", "job_id": [str(first), str(second)], "csrf_token": token},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    notice = web.get(answer.headers["location"]).text
    assert "1 job(s) retried" in notice
    assert f"job {second} not retried: its unique key is held by job {first}" in notice
    assert "left alone" not in notice
    assert statuses(engine, [first, second]) == {first: "queued", second: "failed"}


def test_a_notice_in_a_hand_made_link_is_not_shown(engine: Engine) -> None:
    web = client(engine)
    spoof = "Your session expired: log in again at evil.example"
    for path in ("/", "/jobs", "/workers", "/doctor"):
        page = web.get(path, params={"notice": spoof})
        assert page.status_code == 200
        assert "evil.example" not in page.text, path
        forged = web.get(path, params={"notice": spoof, "proof": "AAAAAAAAAAAAAAAAAAAAAAAA"})
        assert "evil.example" not in forged.text, path
    # The app's own notice shows, for the browser it was written for, and only there.
    token = csrf_of(web.get("/jobs").text)
    answer = web.post(
        "/jobs/action", data={"action": "delete", "csrf_token": token}, follow_redirects=False
    )
    location = answer.headers["location"]
    assert "no job selected" in web.get(location).text
    assert "no job selected" not in client(engine).get(location).text


def many_jobs(engine: Engine, count: int, queue: str = "default") -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_queue.jobs (queue, task, status) "
                "SELECT :queue, 't', 'done' FROM generate_series(1, :count)"
            ),
            {"queue": queue, "count": count},
        )


def test_the_older_link_is_absent_when_the_page_is_not_full(engine: Engine) -> None:
    new_queue(engine, "rare")
    many_jobs(engine, 3, queue="rare")  # the oldest jobs: beyond the first window
    many_jobs(engine, reads.SEARCH_WINDOW + 10)
    web = client(engine)
    nothing = web.get("/jobs?queue=rare").text
    assert "No job matches." in nothing
    assert 'rel="next"' not in nothing  # no Older link that searches 20,000 jobs per click
    assert "Older jobs were not searched" in nothing
    searched = re.search(r'id="search-older" href="([^"]+)"', nothing)
    assert searched, nothing
    # Asked for, the next window is searched and finds them; the end of the table offers
    # neither link.
    deeper = web.get(searched.group(1).replace("&amp;", "&")).text
    assert len(re.findall(r'<tr data-job="', deeper)) == 3
    assert 'rel="next"' not in deeper
    assert 'id="search-older"' not in deeper
    full = web.get("/jobs?queue=default").text
    assert len(re.findall(r'<tr data-job="', full)) == reads.PAGE_SIZE
    assert 'rel="next"' in full


# -- fuzzing every parameter and form field (issue 20, 1.10) ----------------------------------

"""Huge, negative, NaN, empty, unicode, NUL, surrogate and non-UTF-8 values."""


def test_the_package_s_public_names_are_those_of_its_modules() -> None:
    import sqla_queue.dashboard as dashboard
    from sqla_queue.dashboard import app, pages, security

    assert dashboard.__all__ == sorted(dashboard.__all__)
    assert [getattr(dashboard, name) for name in dashboard.__all__] == [
        security.Auth,
        pages.Dashboard,
        security.check_exposure,
        app.create_app,
        security.is_loopback,
        app.wsgi_app,
    ]


def test_the_job_page_lists_its_steps_and_when_it_sleeps_until(engine: Engine) -> None:
    (job_id,) = enqueue_jobs(engine, "t", 1)
    with engine.begin() as conn:
        (claimed,) = conn.execute(queries.claim_jobs(None), {"limit": 1, "worker_id": "w"}).all()
    ctx = JobContext(claimed.id, "t", "default", claimed.attempts, steps=EngineJournal(engine))
    ctx.step("charge", lambda: {"charge": SCRIPT})
    with pytest.raises(KeyError):
        ctx.step("mail", _raise_key_error)
    with pytest.raises(Sleeping):
        ctx.sleep(timedelta(hours=1))
    with engine.begin() as conn:  # what the worker writes for the Sleeping it raised
        params = {"job_ids": [job_id], "job_attempts": [claimed.attempts]}
        conn.execute(
            queries.park_sleeping_jobs(),
            {**params, "job_delays": [3600.0], "job_task_max_attempts": [None]},
        )
    page = client(engine).get(f"/jobs/{job_id}").text
    assert re.search(r'<dt>sleeping until</dt><dd id="sleeping-until">', page)
    charge = re.search(r'<tr data-step="charge">(.*?)</tr>', page, re.S)
    assert charge, page
    assert "done" in charge.group(1)
    assert "&lt;script&gt;" in charge.group(1)
    assert "<script>" not in page
    mail = re.search(r'<tr data-step="mail">(.*?)</tr>', page, re.S)
    assert mail, page
    assert "failed: KeyError: &#39;order&#39;" in mail.group(1)
    assert re.search(r'<tr data-step="sleep#1">.*?sleep</span>', page, re.S)


def _raise_key_error() -> None:
    raise KeyError("order")
