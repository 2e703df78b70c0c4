"""Retry meets unique keys and workflows (issue 33, defect 5): a retried parent's cancelled
unique dependent whose key another job took since stays cancelled, says so, and the rest of
the retry goes on (it used to fail every time, retrying nothing)."""

from __future__ import annotations

import json

import pytest
from helpers.dashboard_kit import client, csrf_of
from helpers.statements import claim_all, fail, states
from helpers.support import cli
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Unique, admin, enqueue
from sqla_queue.admin import filters as bulk

PER_ACCOUNT = Unique(args=["account"])


def held_dependent(engine: Engine) -> dict[str, int]:
    """A failed parent whose unique dependent (with a dependent of its own) was cancelled, a
    new job that took the dependent's key since, and an unrelated failed job."""
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t.parent", {})
        unrelated = enqueue(session, "t.other", {})
        session.flush()  # a unique job is written at once: its parent must have its id
        child = enqueue(session, "t.sync", {"account": 3}, unique=PER_ACCOUNT, depends_on=[parent])
        grandchild = enqueue(session, "t.after", {}, depends_on=[child])
        session.flush()
        ids = {"parent": parent.id, "unrelated": unrelated.id, "child": child.id}
        ids["grandchild"] = grandchild.id
    fail(engine, claim_all(engine))
    assert [s for s, _ in states(engine, *ids.values())] == ["failed"] * 2 + ["cancelled"] * 2
    with Session(engine) as session, session.begin():
        taker = enqueue(session, "t.sync", {"account": 3}, unique=PER_ACCOUNT)
        assert taker.duplicate is False  # a cancelled job blocks no one by default
        ids["taker"] = taker.id
    return ids


def assert_retried_around_the_held_key(engine: Engine, ids: dict[str, int]) -> None:
    now = dict(zip(ids, (s for s, _ in states(engine, *ids.values())), strict=True))
    assert now == {
        "parent": "queued",
        "unrelated": "queued",
        "child": "cancelled",  # its key is the taker's
        "grandchild": "cancelled",  # it depends on the one left cancelled
        "taker": "queued",
    }


def test_retry_failed_leaves_a_dependent_whose_key_is_held_cancelled_and_names_it(
    engine: Engine,
) -> None:
    ids = held_dependent(engine)
    with engine.begin() as conn:
        retried = admin.retry_jobs(conn, all_failed=True)
    assert set(retried) == {ids["parent"], ids["unrelated"]}
    assert retried.skipped == {}
    (kept,) = retried.not_revived.values()
    assert (kept.job_id, kept.status, kept.held_by) == (ids["child"], "cancelled", ids["taker"])
    assert_retried_around_the_held_key(engine, ids)


def test_retry_by_id_and_a_second_retry_in_one_transaction_report_only_their_own(
    engine: Engine,
) -> None:
    ids = held_dependent(engine)
    with engine.begin() as conn:
        first = admin.retry_jobs(conn, [ids["parent"]])
        second = admin.retry_jobs(conn, [ids["unrelated"]])
    assert (set(first), set(first.not_revived)) == ({ids["parent"]}, {ids["child"]})
    assert (set(second), second.not_revived) == ({ids["unrelated"]}, {})
    assert_retried_around_the_held_key(engine, ids)


def test_retry_by_filter_counts_the_dependents_left_cancelled(engine: Engine) -> None:
    ids = held_dependent(engine)
    result = bulk.bulk_retry(engine, bulk.JobFilter(status="failed"))
    assert (result.acted, result.skipped, result.held, result.not_revived) == (2, 0, 0, 1)
    assert "1 dependent left cancelled: unique key held" in result.notice
    assert_retried_around_the_held_key(engine, ids)


@pytest.mark.parametrize("how", ["--failed", "id", "filter"])
def test_the_retry_command_names_the_dependent_left_cancelled(
    database_url: str, engine: Engine, how: str
) -> None:
    ids = held_dependent(engine)
    args = {
        "--failed": ["--failed"],
        "id": [str(ids["parent"]), str(ids["unrelated"])],
        "filter": ["--status", "failed", "--yes"],
    }[how]
    result = cli("jobs", "retry", *args, url=database_url)
    assert "took the unique keys" not in result.output
    if how == "filter":
        assert "retried 2 jobs, 1 dependent left cancelled: unique key held" in result.output
    else:
        expected = (
            f"job {ids['child']}: a dependent not revived, its unique key is held by job "
            f"{ids['taker']} (cancelled)"
        )
        assert expected in result.output
    assert result.exit_code == 0, result.output
    assert_retried_around_the_held_key(engine, ids)


def test_retry_json_output_keeps_its_shape_and_says_what_was_not_revived(
    database_url: str, engine: Engine
) -> None:
    ids = held_dependent(engine)
    result = cli("jobs", "retry", "--failed", "--json", url=database_url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        str(ids["parent"]): "failed",
        str(ids["unrelated"]): "failed",
    }
    assert f"job {ids['child']}: a dependent not revived" in result.stderr


def test_a_revived_dependent_whose_key_is_free_still_waits_again(engine: Engine) -> None:
    ids = held_dependent(engine)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_queue.jobs WHERE id = :id"), {"id": ids["taker"]})
        retried = admin.retry_jobs(conn, [ids["parent"]])
    assert retried.not_revived == {}
    child, grandchild = states(engine, ids["child"], ids["grandchild"])
    assert (child, grandchild) == (("waiting", 1), ("waiting", 1))


def test_the_dashboards_retry_says_how_many_dependents_stay_cancelled(engine: Engine) -> None:
    ids = held_dependent(engine)
    web = client(engine)
    token = csrf_of(web.get("/jobs").text)
    answer = web.post(
        "/jobs/action",
        data={"action": "retry", "job_id": [str(ids["parent"])], "csrf_token": token},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    notice = web.get(answer.headers["location"]).text
    assert "1 job(s) retried" in notice
    assert "1 cancelled dependent(s) not revived: unique key held" in notice
    assert states(engine, ids["child"])[0][0] == "cancelled"
