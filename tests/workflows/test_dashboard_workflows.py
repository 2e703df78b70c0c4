"""The dashboard's workflow views (issue 23): a job's parents and children, a workflow's
page as an indented tree, the jobs list filtered by workflow; escaped, bounded."""

from __future__ import annotations

import re

from helpers.dashboard_kit import client, csrf_of
from helpers.support import diamond
from markupsafe import escape
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import admin, enqueue, enqueue_many
from sqla_queue.dashboard import reads

SCRIPT = "<script>alert('owned')</script>"


def tree_rows(page: str) -> list[tuple[int, int]]:
    """(job id, depth) of each row of the tree, top to bottom."""
    return [
        (int(node), int(depth))
        for node, depth in re.findall(r'<tr data-node="(\d+)" data-depth="(\d+)"', page)
    ]


def test_the_workflow_page_draws_the_graph_as_a_tree_with_states_and_links(
    engine: Engine,
) -> None:
    ids = diamond(engine)
    diamond(engine, "wf-other")
    page = client(engine).get("/workflows/wf-1")
    assert page.status_code == 200, page.text
    a, b, c, d = ids["a"], ids["b"], ids["c"], ids["d"]
    # d has two parents: it appears under each, its first row the one with its dependents
    assert tree_rows(page.text) == [(a, 0), (b, 1), (d, 2), (c, 1), (d, 2)]
    for job_id in ids.values():
        assert f'href="/jobs/{job_id}"' in page.text
    rows = re.findall(r'<tr data-node="(\d+)"[^>]*>(.*?)</tr>', page.text, re.S)
    assert all("2 parents" in row for node, row in rows if int(node) == d)
    assert 'class="again"' in page.text  # d's second row refers back to its first
    assert '<span class="status waiting">waiting</span>' in rows[1][1]
    assert "├─ " in page.text
    assert "└─ " in page.text
    assert "1 queued" in page.text
    assert "3 waiting" in page.text
    assert 'href="/jobs?workflow=wf-1"' in page.text
    assert 'id="workflow-cut"' not in page.text


def test_a_job_page_lists_parents_and_children_and_links_its_workflow(engine: Engine) -> None:
    ids = diamond(engine, "wf/with space")
    web = client(engine)
    body = web.get(f"/jobs/{ids['b']}").text
    assert 'href="/workflows/wf/with%20space"' in body
    parents = re.search(r'<table class="grid" id="parents">(.*?)</table>', body, re.S)
    children = re.search(r'<table class="grid" id="children">(.*?)</table>', body, re.S)
    assert parents
    assert children
    assert f'<tr data-parent="{ids["a"]}">' in parents.group(1)
    assert f'href="/jobs/{ids["a"]}"' in parents.group(1)
    assert "queued" in parents.group(1)
    assert "cancel this job" in parents.group(1)
    assert f'<tr data-child="{ids["d"]}">' in children.group(1)
    assert "waiting" in children.group(1)
    assert "<dt>waits for</dt><dd>1 job(s) still to end</dd>" in body
    # the link leads to the workflow's page, a slash in its id and all
    tree = web.get("/workflows/wf/with%20space")
    assert tree.status_code == 200
    assert len(tree_rows(tree.text)) == 5
    c_page = web.get(f"/jobs/{ids['c']}").text
    assert "run anyway" in c_page
    # a job outside any workflow says so, without the sections
    (alone,) = enqueue_in(engine, 1)
    plain = web.get(f"/jobs/{alone}").text
    assert "<dt>workflow</dt><dd>—</dd>" in plain
    assert 'id="parents"' not in plain


def enqueue_in(engine: Engine, count: int, **fields: object) -> list[int]:
    with Session(engine) as session, session.begin():
        return enqueue_many(session, [{"task": "t.x", **fields} for _ in range(count)])


def test_the_jobs_list_filters_by_workflow(engine: Engine) -> None:
    ids = diamond(engine)
    diamond(engine, "wf-other")
    web = client(engine)
    body = web.get("/jobs?workflow=wf-1").text
    assert {int(i) for i in re.findall(r'<tr data-job="(\d+)">', body)} == set(ids.values())
    assert 'name="workflow" value="wf-1"' in body
    # the actions come back to the same filter
    assert 'name="back" value="/jobs?workflow=wf-1"' in body
    waiting = web.get("/jobs?workflow=wf-1&status=waiting").text
    assert {int(i) for i in re.findall(r'<tr data-job="(\d+)">', waiting)} == {
        ids["b"],
        ids["c"],
        ids["d"],
    }


def test_hostile_task_names_and_workflow_ids_stay_text(engine: Engine) -> None:
    hostile = 'wf"><img src=x onerror=alert(1)>'
    ids = diamond(engine, hostile, task=SCRIPT)
    web = client(engine)
    tree = web.get("/workflows/" + hostile.replace('"', "%22").replace(">", "%3E"))
    assert tree.status_code == 200, tree.text
    job = web.get(f"/jobs/{ids['b']}")
    listed = web.get("/jobs", params={"workflow": hostile})
    for page in (tree, job, listed):
        assert "<script>alert" not in page.text
        assert "<img src=x" not in page.text
        assert "&lt;script&gt;alert(" in page.text
    assert str(escape(hostile)) in tree.text
    assert len(tree_rows(tree.text)) == 5
    assert "%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E" in job.text  # the link, quoted


def test_an_unknown_or_impossible_workflow_is_a_404(engine: Engine) -> None:
    web = client(engine)
    missing = web.get("/workflows/nothing-here")
    assert missing.status_code == 404
    assert "no job of workflow nothing-here" in missing.text
    too_long = web.get("/workflows/" + "x" * 500)
    assert too_long.status_code == 404
    assert "workflow_id must be" in too_long.text
    assert web.get("/workflows/a%00b").status_code == 404


def test_a_big_workflow_page_is_capped_with_a_note(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        root = enqueue(session, "fan.root", {}, workflow_id="wf-big")
        session.flush()
        enqueue_many(
            session,
            [{"task": "fan.leaf", "depends_on": [root.id]} for _ in range(admin.MAX_WORKFLOW_JOBS)],
        )
    page = client(engine).get("/workflows/wf-big")
    assert page.status_code == 200
    assert len(tree_rows(page.text)) == admin.MAX_WORKFLOW_JOBS
    assert 'id="workflow-cut"' in page.text
    assert "sqla-queue jobs list --workflow wf-big" in page.text


def test_the_tree_stays_linear_in_the_edges_of_a_dense_graph() -> None:
    """Layers of jobs each depending on every job of the layer before: drawn as a tree with
    every subtree repeated, 10 layers of 10 would be 10**10 rows."""
    layers = [[layer * 10 + i + 1 for i in range(10)] for layer in range(10)]
    found = [
        admin.WorkflowJob(
            job_id, "t", "q", "waiting", 0, None, None, False, tuple(layers[n - 1]) if n else ()
        )
        for n, layer in enumerate(layers)
        for job_id in layer
    ]
    tree = reads.workflow_tree(found)
    assert len(tree.rows) == 10 + 9 * 10 * 10  # each root once, each job under each parent
    assert not tree.cut
    assert sum(row.first for row in tree.rows) == 100
    capped = reads.workflow_tree(found, max_rows=50)
    assert len(capped.rows) == 50
    assert capped.cut


def test_cancelling_from_the_page_of_a_waiting_job_cancels_it(engine: Engine) -> None:
    ids = diamond(engine)
    web = client(engine)
    page = web.get(f"/jobs/{ids['d']}").text
    assert 'value="cancel">Cancel</button>' in page
    sent = web.post(
        "/jobs/action",
        data={"csrf_token": csrf_of(page), "action": "cancel", "job_id": str(ids["d"])},
        follow_redirects=True,
    )
    assert "1 job(s) cancelled" in sent.text
    with engine.connect() as conn:
        assert admin.job_statuses(conn, [ids["d"]]) == {ids["d"]: "cancelled"}
