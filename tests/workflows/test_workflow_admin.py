"""Finding and acting on a workflow (issue 23): `admin.workflow_jobs`, `admin.job_links`,
`admin.cancel_workflow`, and `sqla-queue jobs list --workflow`, `jobs show` (parents and
children), `jobs cancel --workflow`; the `waiting` status wherever statuses are listed."""

from __future__ import annotations

import json

import psycopg
import pytest
from helpers.statements import claim_all, statuses_of, succeed
from helpers.support import cli, diamond
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import admin, enqueue
from sqla_queue.db import queries
from sqla_queue.errors import ConfigurationError

# -- the Python API --------------------------------------------------------------------------


def test_workflow_jobs_lists_the_graph_by_id_with_each_jobs_parents(engine: Engine) -> None:
    ids = diamond(engine)
    diamond(engine, "wf-other")
    with engine.connect() as conn:
        found = admin.workflow_jobs(conn, "wf-1")
        assert not found.truncated
        assert [j.id for j in found] == [ids["a"], ids["b"], ids["c"], ids["d"]]
        by_id = {j.id: j for j in found}
        assert by_id[ids["a"]].parents == ()
        assert by_id[ids["b"]].parents == (ids["a"],)
        assert by_id[ids["d"]].parents == (ids["b"], ids["c"])
        assert (by_id[ids["d"]].status, by_id[ids["d"]].deps_left) == ("waiting", 2)
        assert by_id[ids["a"]].as_dict()["created_at"].startswith("20")

        first = admin.workflow_jobs(conn, "wf-1", limit=2)
        assert first.truncated
        assert [j.id for j in first] == [ids["a"], ids["b"]]
        assert admin.workflow_jobs(conn, "no-such-workflow") == []
        with pytest.raises(ConfigurationError, match="workflow_id must be"):
            admin.workflow_jobs(conn, "x" * 1000)
        with pytest.raises(ConfigurationError, match="limit"):
            admin.workflow_jobs(conn, "wf-1", limit=0)


def test_workflow_jobs_keeps_jobs_gone_to_the_archive(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "kept", retention="archive")
    with Session(engine) as session, session.begin():
        a = enqueue(session, "t.a", {}, queue="kept", workflow_id="wf-arch")
        b = enqueue(session, "t.b", {}, depends_on=[a])
        session.flush()
        ids = (a.id, b.id)
    succeed(engine, claim_all(engine))
    with engine.connect() as conn:
        found = {j.id: j for j in admin.workflow_jobs(conn, "wf-arch")}
        links = admin.job_links(conn, ids[1])
    assert found[ids[0]].archived
    assert found[ids[0]].status == "done"
    assert not found[ids[1]].archived
    assert found[ids[1]].status == "queued"
    assert [(p.id, p.task, p.status) for p in links.parents] == [(ids[0], "t.a", "done")]


def test_list_jobs_filters_by_workflow_and_by_the_waiting_status(engine: Engine) -> None:
    ids = diamond(engine)
    diamond(engine, "wf-other")
    with engine.connect() as conn:
        listed = admin.list_jobs(conn, workflow="wf-1")
        assert [j.id for j in listed] == sorted(ids.values(), reverse=True)
        assert {j.workflow_id for j in listed} == {"wf-1"}
        waiting = admin.list_jobs(conn, workflow="wf-1", status="waiting")
        assert {j.id for j in waiting} == {ids["b"], ids["c"], ids["d"]}
        assert admin.list_jobs(conn, workflow="wf-none") == []


def test_job_links_name_parents_in_order_and_children_and_a_gone_parents_outcome(
    engine: Engine,
) -> None:
    ids = diamond(engine)
    with engine.connect() as conn:
        a = admin.job_links(conn, ids["a"])
        d = admin.job_links(conn, ids["d"])
        capped = admin.job_links(conn, ids["a"], limit=1)
    assert a.parents == []
    assert [(c.id, c.task, c.status, c.on_failure) for c in a.children] == [
        (ids["b"], "t.b", "waiting", "cancel"),
        (ids["c"], "t.c", "waiting", "run"),
    ]
    assert [p.id for p in d.parents] == [ids["b"], ids["c"]]
    assert capped.more_children
    assert [c.id for c in capped.children] == [ids["b"]]

    succeed(engine, claim_all(engine))  # a succeeds; its queue's retention deletes it
    with engine.connect() as conn:
        (gone,) = admin.job_links(conn, ids["b"]).parents
    assert (gone.id, gone.task, gone.status, gone.ended) == (ids["a"], None, None, "done")
    assert gone.state == "gone (ended done)"


def test_cancel_workflow_ends_queued_waiting_and_running_jobs_and_tells_the_workers(
    engine: Engine, database_url: str
) -> None:
    ids = diamond(engine)
    other = diamond(engine, "wf-other")
    running = claim_all(engine)  # both roots run now
    assert set(running) == {ids["a"], other["a"]}
    listener = psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True)
    try:
        listener.execute(f'LISTEN "{queries.CANCEL_CHANNEL}"')
        with engine.begin() as conn:
            cancelled = admin.cancel_workflow(conn, "wf-1")
        payloads = [n.payload for n in listener.notifies(timeout=60, stop_after=1)]
    finally:
        listener.close()
    assert cancelled == {
        ids["a"]: "running",
        ids["b"]: "waiting",
        ids["c"]: "waiting",
        ids["d"]: "waiting",
    }
    assert payloads == [str(ids["a"])]
    assert statuses_of(engine, *ids.values()) == ["cancelled"] * 4
    assert statuses_of(engine, *other.values()) == ["running", "waiting", "waiting", "waiting"]
    with engine.begin() as conn:
        assert admin.cancel_workflow(conn, "wf-1") == {}


def test_cancelling_a_waiting_job_by_id_cancels_its_dependents(engine: Engine) -> None:
    ids = diamond(engine)
    with engine.begin() as conn:
        assert admin.cancel_jobs(conn, [ids["b"]]) == {ids["b"]: "waiting"}
    assert statuses_of(engine, *ids.values()) == ["queued", "cancelled", "waiting", "cancelled"]


# -- the CLI ---------------------------------------------------------------------------------


def test_jobs_list_workflow_and_status_waiting(database_url: str, engine: Engine) -> None:
    ids = diamond(engine)
    diamond(engine, "wf-other")
    result = cli("jobs", "list", "--workflow", "wf-1", "--json", url=database_url)
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [j["id"] for j in listed] == sorted(ids.values(), reverse=True)
    assert {j["workflow_id"] for j in listed} == {"wf-1"}
    waiting = cli("jobs", "list", "--workflow", "wf-1", "--status", "waiting", url=database_url)
    assert waiting.exit_code == 0, waiting.output
    assert f"{ids['d']}" in waiting.stdout
    assert "waiting" in waiting.stdout
    assert "t.a" not in waiting.stdout


def test_stats_count_waiting_jobs(database_url: str, engine: Engine) -> None:
    diamond(engine)
    result = cli("stats", "--json", url=database_url)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert (row["queued"], row["waiting"]) == (1, 3)
    assert "waiting" in cli("stats", url=database_url).stdout


def test_jobs_show_names_the_workflow_parents_and_children(
    database_url: str, engine: Engine
) -> None:
    ids = diamond(engine)
    succeed(engine, claim_all(engine))  # a ends done and is deleted: c and b are due
    result = cli("jobs", "show", str(ids["b"]), url=database_url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "workflow_id: wf-1" in lines
    assert "deps_left: 0" in lines
    at = lines.index("parents:")
    assert lines[at + 1] == f"  {ids['a']} - gone (ended done) on_failure=cancel"
    at = lines.index("children:")
    assert lines[at + 1] == f"  {ids['d']} t.d waiting"

    as_json = json.loads(cli("jobs", "show", str(ids["d"]), "--json", url=database_url).stdout)
    assert as_json["workflow_id"] == "wf-1"
    assert as_json["deps_left"] == 2
    assert [(p["id"], p["state"]) for p in as_json["parents"]] == [
        (ids["b"], "queued"),
        (ids["c"], "queued"),
    ]
    assert as_json["children"] == []
    assert as_json["more_children"] is False

    plain = cli("jobs", "show", str(ids["c"]), url=database_url)
    assert f"  {ids['a']} - gone (ended done) on_failure=run" in plain.stdout.splitlines()


def test_jobs_cancel_workflow_prints_counts_per_status(database_url: str, engine: Engine) -> None:
    ids = diamond(engine)
    diamond(engine, "wf-other")
    result = cli("jobs", "cancel", "--workflow", "wf-1", url=database_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "workflow wf-1: cancelled 4 job(s) (1 queued, 3 waiting)"
    assert statuses_of(engine, *ids.values()) == ["cancelled"] * 4

    again = cli("jobs", "cancel", "--workflow", "wf-1", url=database_url)
    assert again.exit_code == 0, again.output
    assert again.stdout.strip() == "workflow wf-1: cancelled 0 job(s); none was unfinished"

    unknown = cli("jobs", "cancel", "--workflow", "wf-typo", url=database_url)
    assert unknown.exit_code == 1
    assert "no job of workflow 'wf-typo'" in unknown.output


@pytest.mark.parametrize("args", [[], ["--workflow", "wf-1", "1"]], ids=["neither", "both"])
def test_jobs_cancel_takes_ids_or_a_workflow(database_url: str, args: list[str]) -> None:
    result = cli("jobs", "cancel", *args, url=database_url)
    assert result.exit_code == 2
    assert "pass job ids, --workflow or filter options" in result.output


def test_jobs_cancel_by_id_cancels_a_waiting_job(database_url: str, engine: Engine) -> None:
    ids = diamond(engine)
    result = cli("jobs", "cancel", str(ids["d"]), url=database_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"job {ids['d']}: cancelled (was waiting)"
