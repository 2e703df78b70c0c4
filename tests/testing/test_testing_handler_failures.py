"""sqla_queue.testing where tests go wrong: handlers that commit, abort, or run on another loop."""

from __future__ import annotations

import asyncio

import pytest
from helpers.support import task_statuses
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import Registry, enqueue
from sqla_queue.testing import DrainResult, drain, inline


def test_inline_runs_no_nested_round_when_an_async_handler_commits(
    sqla_queue_database_url: str, sqla_queue_engine: Engine
) -> None:
    # An async handler runs on another thread's loop when the commit came from async code;
    # its own commit there must not start a round that runs (and fails) the other jobs.
    registry = Registry()
    async_engine = create_async_engine(sqla_queue_database_url)

    @registry.task(name="writes")
    async def writes() -> None:
        async with AsyncSession(async_engine) as session, session.begin():
            await session.execute(text("SELECT 1"))

    @registry.task(name="breaks", max_attempts=1)
    async def breaks() -> None:
        raise RuntimeError("breaks")

    async def place_order() -> None:
        async with AsyncSession(async_engine) as session, session.begin():
            enqueue(session, "writes", {}, priority=0)
            enqueue(session, "breaks", {}, priority=1)

    async def scenario() -> DrainResult:
        try:
            with inline(registry) as runs, pytest.raises(RuntimeError, match="breaks"):
                await place_order()  # the commit runs both; "breaks" is raised from it
            return runs
        finally:
            await async_engine.dispose()

    assert asyncio.run(scenario()) == DrainResult(succeeded=1, failed=1)
    assert task_statuses(sqla_queue_engine) == [("breaks", "failed", 1)]  # "writes" done, deleted


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_drain_leaves_no_job_running_when_a_handler_raises_a_base_exception(
    sqla_queue_engine: Engine, raised: type[BaseException]
) -> None:
    registry = Registry()

    @registry.task(name="interrupted", max_attempts=3)
    def interrupted() -> None:
        raise raised

    with Session(sqla_queue_engine) as session, session.begin():
        enqueue(session, "interrupted", {})
    result = DrainResult()
    with pytest.raises(raised):
        drain(sqla_queue_engine, registry, into=result)
    assert result == DrainResult(retried=1)
    assert task_statuses(sqla_queue_engine) == [("interrupted", "queued", 1)]


def test_a_test_failure_inside_a_handler_fails_its_job_instead_of_leaving_it_running(
    sqla_queue_engine: Engine,
) -> None:
    registry = Registry()

    @registry.task(name="asserts", max_attempts=1)
    def asserts() -> None:
        pytest.fail("the handler saw something wrong")

    with Session(sqla_queue_engine) as session, session.begin():
        enqueue(session, "asserts", {})
    with pytest.raises(pytest.fail.Exception, match="saw something wrong"):
        drain(sqla_queue_engine, registry)
    assert task_statuses(sqla_queue_engine) == [("asserts", "failed", 1)]


def test_inline_leaves_commits_on_the_applications_other_databases_alone(
    sqla_queue_engine: Engine, empty_database_url: str
) -> None:
    registry = Registry()
    ran: list[str] = []
    registry.task(name="ok")(lambda: ran.append("ok"))
    others = [create_engine(empty_database_url), create_engine("sqlite://")]
    try:
        with inline(registry) as runs:
            for other in others:  # no sqla-queue schema there: nothing to run, nothing to fail
                with Session(other) as session, session.begin():
                    session.execute(text("CREATE TABLE analytics (id int)"))
            with Session(sqla_queue_engine) as session, session.begin():
                enqueue(session, "ok", {})
    finally:
        for other in others:
            other.dispose()
    assert runs == DrainResult(succeeded=1)
    assert ran == ["ok"]
