"""The dashboard refuses bad input in paths, filters and forms with a 400 or a 404 naming it,
never a 500 (fuzzed)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from helpers.dashboard_kit import client, csrf_of
from helpers.support import enqueue_jobs, statuses
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from sqla_queue.dashboard import params as checks


@pytest.mark.parametrize("job_id", ["99999999999999999999", "9223372036854775808", "0"])
def test_a_job_id_no_job_can_have_is_404_in_the_path(engine: Engine, job_id: str) -> None:
    page = client(engine).get(f"/jobs/{job_id}")
    assert page.status_code == 404
    assert "no such job: job_id must be a job id from 1 to 9223372036854775807" in page.text


@pytest.mark.parametrize(
    ("query", "message"),
    [
        *((f"before={before}", "before must be a job id") for before in ("1" * 20, "-5", "0")),
        ("before=1e3", "before must be a job id"),
        ("before=%D9%A1%D9%A2", "before must be a job id"),  # digits int() would take
        ("queue=a%00b", "queue must not contain a NUL character"),
        ("tag=%00", "tag must not contain a NUL character"),
    ],
)
def test_a_filter_that_is_no_job_id_or_no_text_is_a_400_naming_it(
    engine: Engine, query: str, message: str
) -> None:
    page = client(engine).get(f"/jobs?{query}")
    assert (page.status_code, f"bad filter: {message}" in page.text) == (400, True), page.text


@pytest.mark.parametrize("job_id", ["99999999999999999999", "-1", "1.5", "x", ""])
def test_a_posted_job_id_that_is_no_job_id_is_a_400_and_changes_nothing(
    engine: Engine, job_id: str
) -> None:
    (queued,) = enqueue_jobs(engine, "t", 1)
    web = client(engine)
    token = csrf_of(web.get("/jobs").text)
    answer = web.post(
        "/jobs/action",
        data={"action": "cancel", "job_id": [str(queued), job_id], "csrf_token": token},
    )
    assert answer.status_code == 400
    assert "job_id must be a job id" in answer.text
    assert statuses(engine, [queued]) == {queued: "queued"}


ODD = st.one_of(
    st.sampled_from(
        [
            "",
            "0",
            "-1",
            "99999999999999999999",
            "9223372036854775808",
            "NaN",
            "-inf",
            "1e999",
            "1.5",
            " 1",
            "+1",
            "1_0",
            "١٢",
            "\x00",
            "a\x00b",
            "%",
            "<b>x</b>",
        ]
    ),
    st.integers().map(str),
    st.text(max_size=40),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3),  # lone surrogates
    st.binary(max_size=12),  # bytes that are not UTF-8, percent-encoded as they are
)


QUERY_NAMES = ("queue", "task", "status", "tag", "before", "notice", "proof")


PAGES = ("/", "/jobs", "/workers", "/partials/queues")


FUZZ = settings(
    max_examples=25,
    deadline=None,  # a database test: its time is the machine's load, not a defect
    # too_slow as in the profile (tests/conftest.py): a loaded CI box draws slowly
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


HUGE = "99999999999999999999"


def encoded(value: str | bytes) -> str:
    """`value` percent-encoded; a surrogate as the bytes a careless client would send."""
    if isinstance(value, str):
        value = value.encode(errors="surrogatepass")
    return quote(value, safe="")


def answered(response: Any) -> int:
    status = int(response.status_code)
    assert status < 500, response.text[:500]
    return status


@pytest.mark.parametrize("name", QUERY_NAMES)
@FUZZ
@given(
    page=st.sampled_from(PAGES),
    value=ODD,
    others=st.lists(st.tuples(st.sampled_from(QUERY_NAMES), ODD), max_size=3),
)
@example(page="/jobs", value=HUGE, others=[])
@example(page="/jobs", value="a\x00b", others=[])
@example(page="/jobs", value="\udc80", others=[("status", "failed")])
def test_no_query_parameter_makes_a_page_answer_500(
    engine: Engine,
    name: str,
    page: str,
    value: str | bytes,
    others: list[tuple[str, str | bytes]],
) -> None:
    fields = [(name, value), *others]
    query = "&".join(f"{field}={encoded(text)}" for field, text in fields)
    assert answered(client(engine).get(f"{page}?{query}")) in (200, 400)


@FUZZ
@given(job_id=ODD)
@example(job_id=HUGE)
@example(job_id="0")
def test_no_job_path_makes_the_job_page_answer_500(engine: Engine, job_id: str | bytes) -> None:
    assert answered(client(engine).get(f"/jobs/{encoded(job_id)}")) in (200, 404, 405)


@FUZZ
@given(
    action=st.one_of(st.sampled_from(["retry", "cancel", "delete"]), ODD),
    job_ids=st.lists(ODD, max_size=3),
    back=st.one_of(st.just("/jobs"), ODD),
)
@example(action="cancel", job_ids=[HUGE], back="/jobs")
@example(action="retry", job_ids=["1", "1"], back="/jobs?queue=a\x00b")
@example(action=b"\xff", job_ids=[], back=b"/\xed\xa0\x80")
def test_no_form_field_makes_an_action_answer_500(
    engine: Engine, action: str | bytes, job_ids: list[str | bytes], back: str | bytes
) -> None:
    web = client(engine)
    token = csrf_of(web.get("/jobs").text)
    fields = [("action", action), ("back", back), ("csrf_token", token)]
    fields += [("job_id", job_id) for job_id in job_ids]
    body = "&".join(f"{name}={encoded(value)}" for name, value in fields)
    answer = web.post(
        "/jobs/action",
        content=body,
        headers={"content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert answered(answer) in (303, 400)
    if answer.status_code == 303:
        assert answered(web.get(answer.headers["location"])) in (200, 400, 404)


@FUZZ
@given(name=ODD.filter(lambda value: len(value) > 0), paused=st.booleans())
@example(name="a\x00b", paused=True)
def test_no_queue_name_makes_pause_or_resume_answer_500(
    engine: Engine, name: str | bytes, paused: bool
) -> None:
    web = client(engine)
    token = csrf_of(web.get("/").text)
    verb = "pause" if paused else "resume"
    answer = web.post(
        f"/queues/{encoded(name)}/{verb}", data={"csrf_token": token}, follow_redirects=False
    )
    assert answered(answer) in (303, 404, 405)


@settings(max_examples=200, deadline=None)
@given(value=ODD)
def test_the_dashboards_checks_answer_a_value_or_one_bad_parameter(value: str | bytes) -> None:
    text_value = value.decode("latin-1") if isinstance(value, bytes) else value
    problems: list[str] = []
    try:
        job_id = checks.job_id(text_value)
    except checks.BadParameter as exc:
        problems.append(str(exc))
    else:
        assert 0 < job_id <= checks.MAX_JOB_ID
        assert text_value.isascii()
        assert text_value.isdigit()
    try:
        kept = checks.text_filter(text_value, "queue")
    except checks.BadParameter as exc:
        problems.append(str(exc))
    else:
        assert kept is None or kept.encode().decode() == text_value
    assert all(problem and "\n" not in problem for problem in problems)


ARGS_JSONB_CANNOT_HOLD = [
    ('"\\u0000"', "NUL"),
    ('{"a": ["\\u0000"]}', "NUL"),
    ('"\\ud800"', "lone surrogate"),
    ("[" * 150 + "]" * 150, "nested more than 100 levels"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
]


@pytest.mark.parametrize(("value", "message"), ARGS_JSONB_CANNOT_HOLD)
def test_an_args_value_jsonb_cannot_hold_is_a_400_naming_it_and_acts_on_no_job(
    engine: Engine, value: str, message: str
) -> None:
    (queued,) = enqueue_jobs(engine, "t", 1, args={"a": 1})
    web = client(engine)
    page = web.get("/jobs", params={"args_path": "a", "args_value": value})
    assert page.status_code == 400, page.text[:300]
    assert "bad filter: " in page.text
    assert message in page.text
    token = csrf_of(web.get("/jobs").text)
    form = {"action": "cancel", "args_path": "a", "args_value": value, "csrf_token": token}
    for confirmed in ("", "yes"):
        answer = web.post("/jobs/bulk", data={**form, "confirmed": confirmed})
        assert answer.status_code == 400, answer.text[:300]
        assert message in answer.text
    assert statuses(engine, [queued]) == {queued: "queued"}
