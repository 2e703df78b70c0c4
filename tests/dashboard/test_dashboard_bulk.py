"""The jobs page's search filters, select-all box and "every job matching this filter"
actions: a confirmation with the count, then the batched action (issue 26)."""

from __future__ import annotations

import re

from helpers.dashboard_kit import client, csrf_of, new_queue
from helpers.support import enqueue_jobs, really_failed, set_status, statuses
from sqlalchemy import Engine


def listed(page: str) -> set[int]:
    return {int(i) for i in re.findall(r'<tr data-job="(\d+)">', page)}


def test_the_page_filters_by_args_error_and_finish_time(engine: Engine) -> None:
    hit = enqueue_jobs(engine, "t", 2, args={"user": {"id": 42}})
    miss = enqueue_jobs(engine, "t", 2, args={"user": {"id": "42"}})
    set_status(engine, hit[:1] + miss[:1], "failed", "ConnectionResetError: peer")
    web = client(engine)
    assert listed(web.get("/jobs?args_path=user.id&args_value=42").text) == set(hit)
    assert listed(web.get('/jobs?args_path=user.id&args_value="42"').text) == set(miss)
    assert listed(web.get("/jobs?error=connectionreset").text) == {hit[0], miss[0]}
    assert listed(web.get("/jobs?finished_after=2000-01-01T00:00").text) == {hit[0], miss[0]}
    assert listed(web.get("/jobs?finished_before=2000-01-01T00:00").text) == set()
    page = web.get("/jobs?error=peer&args_path=user.id&args_value=42").text
    assert listed(page) == {hit[0]}
    assert 'id="select-all"' in page
    assert 'name="args_value" value="42"' in page  # the form keeps the filter
    assert 'id="bulk-form"' in page
    assert 'id="bulk-form"' not in web.get("/jobs").text  # no filter: no action on every job


def test_bad_search_filters_are_a_400_naming_the_field(engine: Engine) -> None:
    web = client(engine)
    for query, fragment in [
        ("args_path=user.id", "args path and args value go together"),
        ("args_path=a..b&args_value=1", "must be keys joined by dots"),
        ("finished_after=yesterday", "finished after must be a time like 2026-12-03T12:00"),
        ("finished_after=2026-02-01T00:00&finished_before=2026-01-01T00:00", "must be earlier"),
    ]:
        page = web.get(f"/jobs?{query}")
        assert page.status_code == 400, query
        assert fragment in page.text, (query, page.text)


def test_retry_every_match_confirms_the_count_then_retries_in_batches(engine: Engine) -> None:
    new_queue(engine, "mail")
    mail = enqueue_jobs(engine, "send", 3, queue="mail")
    twins = [enqueue_jobs(engine, "send", 1, queue="mail", args={"k": 1}, unique=True)[0]]
    set_status(engine, mail + twins, "failed", "SMTP 421")
    twins += enqueue_jobs(engine, "send", 1, queue="mail", args={"k": 1}, unique=True)
    set_status(engine, twins[1:], "failed", "SMTP 421")
    other = enqueue_jobs(engine, "send", 2)
    set_status(engine, other, "failed", "SMTP 421")
    web = client(engine)
    token = csrf_of(web.get("/jobs?queue=mail&status=failed").text)
    form = {"queue": "mail", "status": "failed", "action": "retry", "csrf_token": token}
    confirm = web.post("/jobs/bulk", data=form)
    assert confirm.status_code == 200
    assert "5 jobs that retry takes match status=failed, queue=&#39;mail&#39;" in confirm.text
    assert 'name="confirmed" value="yes"' in confirm.text
    assert statuses(engine, mail) == dict.fromkeys(mail, "failed")  # nothing done yet
    done = web.post("/jobs/bulk", data={**form, "confirmed": "yes"}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"].startswith("/jobs?queue=mail&status=failed&notice=")
    notice = web.get(done.headers["location"]).text
    assert "retried 4 jobs, 1 skipped: unique key held" in notice
    assert set(statuses(engine, mail).values()) == {"queued"}
    assert statuses(engine, twins) == {twins[0]: "queued", twins[1]: "failed"}
    assert set(statuses(engine, other).values()) == {"failed"}


def test_cancel_and_delete_every_match_and_their_refusals(engine: Engine) -> None:
    jobs = enqueue_jobs(engine, "t", 3, tags=["nightly"])
    web = client(engine)
    token = csrf_of(web.get("/jobs?tag=nightly").text)
    form = {"tag": "nightly", "csrf_token": token, "confirmed": "yes"}
    cancelled = web.post("/jobs/bulk", data={**form, "action": "cancel"})
    assert "cancelled 3 jobs" in cancelled.text
    assert set(statuses(engine, jobs).values()) == {"cancelled"}
    none_left = web.post("/jobs/bulk", data={**form, "action": "cancel", "confirmed": ""})
    assert "no job to cancel matches this filter" in none_left.text
    deleted = web.post("/jobs/bulk", data={**form, "action": "delete"})
    assert "deleted 3 jobs" in deleted.text
    assert statuses(engine, jobs) == {}
    every = web.post("/jobs/bulk", data={"csrf_token": token, "action": "delete"})
    assert "set a filter first" in every.text
    wrong = web.post("/jobs/bulk", data={**form, "action": "retry", "status": "queued"})
    assert "retry takes failed, cancelled jobs" in wrong.text
    forged = web.post("/jobs/bulk", data={**form, "csrf_token": "guess", "action": "delete"})
    assert forged.status_code == 403
    assert web.post("/jobs/bulk", data={**form, "action": "explode"}).status_code == 400


def test_read_only_refuses_bulk_actions(engine: Engine) -> None:
    (job_id,) = enqueue_jobs(engine, "t", 1)
    web = client(engine, read_only=True)
    assert 'id="bulk-form"' not in web.get("/jobs?task=t").text
    web.get("/")
    answer = web.post("/jobs/bulk", data={"task": "t", "action": "cancel", "confirmed": "yes"})
    assert answer.status_code == 403
    assert statuses(engine, [job_id]) == {job_id: "queued"}


def test_error_contains_matches_the_class_and_message_and_the_confirmation_shows_a_sample(
    engine: Engine,
) -> None:
    key_error, smtp, _ = really_failed(engine)
    web = client(engine)
    assert listed(web.get("/jobs?error=smtp").text) == {smtp}
    assert listed(web.get("/jobs?traceback=smtp_send").text) == {key_error}
    page = web.get("/jobs?error=smtp").text
    assert 'name="traceback"' in page
    assert "ConnectionError: SMTP server said 421: try later" in page  # the error shown
    token = csrf_of(page)
    form = {"error": "smtp", "status": "failed", "action": "retry", "csrf_token": token}
    asked = web.post("/jobs/bulk", data=form)
    assert asked.status_code == 200, asked.text
    sample = asked.text.split('id="bulk-sample"', 1)[1].split("</table>", 1)[0]
    assert f'href="/jobs/{smtp}"' in sample
    assert "mail" in sample
    assert "ConnectionError: SMTP server said 421: try later" in sample
    assert str(key_error) not in re.findall(r'href="/jobs/(\d+)"', sample)
    assert statuses(engine, [key_error, smtp]) == {key_error: "failed", smtp: "failed"}
    web.post("/jobs/bulk", data={**form, "confirmed": "yes"})
    assert statuses(engine, [key_error, smtp]) == {key_error: "failed", smtp: "queued"}
