"""`sqla-queue jobs retry|cancel|delete|list` by filter (issue 26): count, confirm, batches."""

from __future__ import annotations

import json

import pytest
from helpers.support import cli, enqueue_jobs, jobs_by_id, really_failed, set_status, statuses
from sqlalchemy import Engine

from sqla_queue import admin


def test_retry_by_filter_asks_with_the_count_and_acts_only_when_confirmed(
    database_url: str, engine: Engine
) -> None:
    hits = enqueue_jobs(engine, "app.a", 3, args={"user": {"id": 42}})
    misses = enqueue_jobs(engine, "app.a", 2, args={"user": {"id": 7}})
    set_status(engine, hits + misses, "failed", "SMTPError: 421 try later")
    args = ("jobs", "retry", "--args-path", "user.id", "--args-value", "42", "--error", "smtp")
    refused = cli(*args, url=database_url, answer="n\n")
    assert refused.exit_code == 1
    assert "retry 3 job(s) matching error='smtp', args contain" in refused.output
    assert set(statuses(engine).values()) == {"failed"}
    done = cli(*args, "--batch", "2", url=database_url, answer="y\n")
    assert done.exit_code == 0, done.output
    assert "retried 3 jobs (2 batch(es))" in done.output
    now = statuses(engine)
    assert [now[i] for i in hits + misses] == ["queued"] * 3 + ["failed"] * 2


def test_retry_failed_with_filters_counts_unique_keys_held_and_exits_1(
    database_url: str, engine: Engine
) -> None:
    twins: list[int] = []
    for _ in range(2):
        (job_id,) = enqueue_jobs(engine, "app.u", 1, args={"n": 1}, unique=True)
        set_status(engine, [job_id], "failed")
        twins.append(job_id)
    result = cli(
        "jobs", "retry", "--failed", "--task", "app.u", "--yes", "--json", url=database_url
    )
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "action": "retry",
        "acted": 1,
        "skipped": 1,
        "held": 1,
        "batches": 1,
        "not_revived": 0,
    }
    now = statuses(engine)
    assert [now[i] for i in twins] == ["queued", "failed"]


def test_cancel_and_delete_by_filter(database_url: str, engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "mail")
    mail = enqueue_jobs(engine, "app.a", 3, queue="mail", tags=["t1"])
    other = enqueue_jobs(engine, "app.a", 2)
    set_status(engine, mail[:1], "running")
    cancelled = cli("jobs", "cancel", "--queue", "mail", "--tag", "t1", "-y", url=database_url)
    assert cancelled.exit_code == 0, cancelled.output
    assert "cancelled 3 jobs" in cancelled.output
    assert {statuses(engine)[i] for i in mail} == {"cancelled"}
    nothing = cli("jobs", "cancel", "--queue", "mail", url=database_url)
    assert nothing.exit_code == 0
    assert "no job to cancel matches: queue='mail'" in nothing.output
    deleted = cli("jobs", "delete", "--status", "cancelled", "--yes", url=database_url)
    assert deleted.exit_code == 0, deleted.output
    # the running one, cancelled, keeps its queue's slot until its handler returns
    assert "deleted 2 jobs" in deleted.output
    assert set(jobs_by_id(engine)) == {mail[0], *other}


def test_list_searches_by_args_error_and_time_newest_first(
    database_url: str, engine: Engine
) -> None:
    ids = enqueue_jobs(engine, "app.a", 4, args={"kind": "invoice"})
    enqueue_jobs(engine, "app.a", 2, args={"kind": "receipt"})
    set_status(engine, ids[:3], "failed", "Timeout reading")
    base = ("jobs", "list", "--json", "--args", '{"kind": "invoice"}', "--error", "TIMEOUT")
    page = cli(*base, "--limit", "2", "--finished-after", "2000-01-01T00:00Z", url=database_url)
    assert [j["id"] for j in json.loads(page.stdout)] == [ids[2], ids[1]]
    rest = cli(*base, "--limit", "2", "--before", str(ids[1]), url=database_url)
    assert [j["id"] for j in json.loads(rest.stdout)] == [ids[0]]
    several = cli(
        "jobs", "list", "--json", "--status", "failed", "--status", "queued", url=database_url
    )
    assert len(json.loads(several.stdout)) == 6


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("jobs", "retry", "--task", "a", "3"), "--queue goes with --failed or the other"),
        (("jobs", "delete"), "pass job ids or filter options"),
        (("jobs", "cancel", "--task", "a", "4"), "pass job ids or filter options, not both"),
        (("jobs", "list", "--args", "[1]"), "must be a JSON object"),
        (("jobs", "list", "--args", "{"), "not valid JSON"),
        (("jobs", "list", "--args-path", "a"), "--args-path and --args-value go together"),
        (("jobs", "list", "--finished-before", "2026-01-01"), "has no time zone"),
        (("jobs", "retry", "--status", "queued", "-y"), "retry takes failed, cancelled jobs"),
        (("jobs", "delete", "--error", "x", "--batch", "0"), "--batch"),
    ],
)
def test_bad_filter_options_are_refused_in_one_line(
    database_url: str, args: tuple[str, ...], fragment: str
) -> None:
    result = cli(*args, url=database_url)
    assert result.exit_code not in (0, None)
    assert "Traceback" not in result.output
    assert fragment in result.stderr, result.stderr


def test_retry_by_error_takes_the_error_not_the_traceback_and_shows_a_sample(
    database_url: str, engine: Engine
) -> None:
    key_error, smtp, _ = really_failed(engine)
    args = ("jobs", "retry", "--status", "failed", "--error", "smtp")
    asked = cli(*args, url=database_url, answer="n\n")
    assert "retry 1 job(s) matching status=failed, error='smtp'?" in asked.output
    assert f"  {smtp}  mail  failed  ConnectionError: SMTP server said 421" in asked.output
    assert f"  {key_error}  " not in asked.output
    by_frame = cli("jobs", "list", "--json", "--traceback", "in smtp_send", url=database_url)
    assert [j["id"] for j in json.loads(by_frame.stdout)] == [key_error]
    done = cli(*args, "--yes", url=database_url)
    assert done.exit_code == 0, done.output
    assert statuses(engine) == {key_error: "failed", smtp: "queued", _: "cancelled"}
