"""Tags (text[], GIN-indexed) and meta (jsonb) on every enqueue path, in the handler's context,
and in `jobs list --tag` (issue 9)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import jobs_by_id
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    InvalidJobError,
    Job,
    JobContext,
    Registry,
    admin,
    enqueue,
    enqueue_many,
    enqueue_many_async,
)
from sqla_queue.cli import main
from sqla_queue.db import queries
from sqla_queue.db.database import normalize_url
from sqla_queue.enqueue import COPY_MIN_ROWS
from sqla_queue.job.new_job import NewJob
from sqla_queue.testing import drain, run_until_empty


def stored(engine: Engine) -> dict[int, tuple[list[str], dict[str, Any]]]:
    return {i: (job.tags, job.meta) for i, job in jobs_by_id(engine).items()}


def test_enqueue_and_a_constructed_job_store_tags_without_repeats_and_meta(
    engine: Engine,
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = enqueue(
            session, "t", tags=["billing", "eu", "billing"], meta={"trace": "00-ab"}, flush=True
        )
        second = Job(task="t", tags=("vip",), meta={"by": "admin"})
        session.add(second)
        plain = enqueue(session, "t", flush=True)
    rows = stored(engine)
    assert rows[first.id] == (["billing", "eu"], {"trace": "00-ab"})
    assert rows[second.id] == (["vip"], {"by": "admin"})
    assert rows[plain.id] == ([], {})


@pytest.mark.parametrize("count", [3, COPY_MIN_ROWS], ids=["insert", "copy"])
def test_enqueue_many_stores_tags_and_meta_per_row_by_insert_and_by_copy(
    engine: Engine, count: int
) -> None:
    rows = [{"task": "t", "tags": [f"n{i}", "bulk"], "meta": {"i": i}} for i in range(count)]
    rows[0] = {"task": "t"}
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, rows)
    found = stored(engine)
    assert found[ids[0]] == ([], {})
    assert [found[i] for i in ids[1:]] == [([f"n{i}", "bulk"], {"i": i}) for i in range(1, count)]


def test_an_async_session_stores_tags_and_meta_on_both_paths(
    database_url: str, engine: Engine
) -> None:
    async def scenario() -> list[int]:
        async_engine = create_async_engine(normalize_url(database_url))
        try:
            async with async_sessionmaker(async_engine)() as session:
                enqueue(session, "t", tags=["a"], meta={"one": 1})
                ids = await enqueue_many_async(session, [{"task": "t", "tags": ["b"]}])
                await session.commit()
                return ids
        finally:
            await async_engine.dispose()

    (many,) = asyncio.run(scenario())
    found = stored(engine)
    assert found.pop(many) == (["b"], {})
    assert list(found.values()) == [(["a"], {"one": 1})]


def test_an_insert_hook_sees_and_changes_tags_and_meta_on_every_path(engine: Engine) -> None:
    registry = Registry()
    seen: list[tuple[list[str], dict[str, Any]]] = []

    @registry.on_insert
    def trace(job: NewJob) -> None:
        seen.append((list(job.tags), dict(job.meta)))
        job.meta["traceparent"] = "00-trace"
        job.tags.append("traced")

    registry.task(name="t")(lambda: None)
    caller_tags = ["mine"]
    with Session(engine, expire_on_commit=False) as session, session.begin():
        one = enqueue(session, "t", tags=caller_tags, registry=registry, flush=True)
        many = enqueue_many(session, [{"task": "t", "meta": {"k": 1}}], registry=registry)
    assert caller_tags == ["mine"]  # the hook changed a copy
    assert seen == [(["mine"], {}), ([], {"k": 1})]
    found = stored(engine)
    assert found[one.id] == (["mine", "traced"], {"traceparent": "00-trace"})
    assert found[many[0]] == (["traced"], {"k": 1, "traceparent": "00-trace"})


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"tags": "billing"}, "tags must be a list of str"),
        ({"tags": [""]}, "tag must be a non-empty string"),
        ({"tags": ["x" * 201]}, "tag must be at most 200 characters"),
        ({"tags": [f"t{i}" for i in range(51)]}, "at most 50 tags"),
        ({"meta": ["not", "a", "dict"]}, "meta must be a dict of JSON values"),
        ({"meta": {"big": "x" * 100_001}}, "meta are 100012 bytes as JSON; the limit is 100000"),
        ({"meta": {"nul": "\x00"}}, "meta contain a NUL character"),
    ],
)
def test_bad_tags_or_meta_are_refused_by_name_and_the_transaction_goes_on(
    engine: Engine, fields: dict[str, Any], fragment: str
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        with pytest.raises(InvalidJobError, match=fragment):
            enqueue(session, "t", **fields)
        with pytest.raises(InvalidJobError, match=fragment):
            enqueue_many(session, [{"task": "t", **fields}])
        kept = enqueue(session, "t", flush=True)
    assert list(jobs_by_id(engine)) == [kept.id]


def test_the_database_refuses_meta_that_is_not_an_object(engine: Engine) -> None:
    with pytest.raises(Exception, match="ck_jobs_meta_object"), engine.begin() as conn:
        conn.execute(text("INSERT INTO sqla_queue.jobs (task, meta) VALUES ('t', '[1]')"))


def test_a_handler_sees_its_jobs_tags_and_meta_in_the_context(engine: Engine) -> None:
    registry = Registry()
    seen: list[tuple[list[str], dict[str, Any]]] = []

    @registry.task(name="t", pass_context=True)
    def handler(ctx: JobContext) -> None:
        seen.append((ctx.tags, ctx.meta))

    with Session(engine) as session, session.begin():
        enqueue(session, "t", tags=["a", "b"], meta={"trace": {"id": 7}})
        enqueue(session, "t")
    drain(engine, registry)
    assert sorted(seen, key=len) == sorted([(["a", "b"], {"trace": {"id": 7}}), ([], {})], key=len)


def test_a_real_worker_hands_its_jobs_tags_and_meta_to_the_handler(engine: Engine) -> None:
    registry = Registry()
    seen: dict[int, tuple[list[str], dict[str, Any]]] = {}

    @registry.task(name="t", pass_context=True)
    def handler(ctx: JobContext, n: int) -> None:
        seen[n] = (ctx.tags, ctx.meta)

    with Session(engine) as session, session.begin():
        enqueue(session, "t", {"n": 1}, tags=["a", "b"], meta={"trace": {"id": 7}})
        enqueue(session, "t", {"n": 2})
    stats = run_until_empty(engine, registry)
    assert stats.succeeded == 2
    assert seen == {1: (["a", "b"], {"trace": {"id": 7}}), 2: ([], {})}


def test_the_claim_returns_tags_and_meta_for_the_workers_context(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        enqueue(session, "t", tags=["a"], meta={"k": [1, 2]})
    with engine.begin() as conn:
        row = (
            conn.execute(queries.claim_jobs(None), {"worker_id": "w", "limit": 1}).mappings().one()
        )
    context = JobContext(
        row["id"],
        row["task"],
        row["queue"],
        row["attempts"],
        tags=row["tags"],
        meta=row["meta_json"],
    )
    assert (context.tags, context.meta) == (["a"], {"k": [1, 2]})


def test_jobs_list_finds_jobs_by_tag_through_the_gin_index(
    database_url: str, engine: Engine
) -> None:
    with Session(engine) as session, session.begin():
        ids = enqueue_many(
            session,
            [{"task": "t", "tags": ["eu", "vip"]}, {"task": "t", "tags": ["eu"]}, {"task": "t"}],
        )
    with engine.connect() as conn:
        assert [j.id for j in admin.list_jobs(conn, tag="eu")] == [ids[1], ids[0]]
        assert [j.id for j in admin.list_jobs(conn, tag=["eu", "vip"])] == [ids[0]]
        conn.execute(text("SET enable_seqscan = off"))
        compiled = queries.list_jobs(tags=True).compile(dialect=conn.dialect)
        params = {**compiled.params, "tags": ["eu"], "limit": 10}
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}", params).scalars())
    assert "ix_jobs_tags" in plan, plan
    result = CliRunner().invoke(
        main,
        ["jobs", "list", "--json", "--tag", "vip"],
        env={"SQLA_QUEUE_DATABASE_URL": database_url},
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert (row["id"], row["tags"]) == (ids[0], ["eu", "vip"])


def test_cli_enqueue_takes_tags_and_meta(database_url: str, engine: Engine) -> None:
    env = {"SQLA_QUEUE_DATABASE_URL": database_url}
    runner = CliRunner()
    result = runner.invoke(
        main, ["enqueue", "t", "--tag", "ops", "--tag", "eu", "--meta", '{"by": "cli"}'], env=env
    )
    assert result.exit_code == 0, result.output
    assert stored(engine)[int(result.stdout)] == (["ops", "eu"], {"by": "cli"})
    bad = runner.invoke(main, ["enqueue", "t", "--meta", "{nope"], env=env)
    assert bad.exit_code == 2
    assert "--meta" in bad.stderr
    assert "not valid JSON" in bad.stderr
