"""`sqla_queue.signal` from every place a signal is sent: a Session, a Core Connection, an
AsyncSession, the SQL function (a trigger, another language) and the CLI; bad input is
refused in one line and sends nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from helpers.signal_kit import mailbox
from helpers.support import cli, database_clock, enqueue_jobs, statuses
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

import sqla_queue
from sqla_queue import JobContext, Registry, normalize_url
from sqla_queue.testing import drain


def waiting_job(engine: Engine, key: str) -> tuple[int, Registry, list[Any]]:
    """A job parked waiting for `key`, its registry, and what its handler got."""
    registry, got = Registry(), []

    @registry.task(name="waiter", pass_context=True)
    def waiter(ctx: JobContext) -> None:
        got.append(ctx.wait_for_signal(key, timeout=3600))

    (job_id,) = enqueue_jobs(engine, "waiter", 1)
    assert drain(engine, registry).waiting == 1
    return job_id, registry, got


def test_signal_on_a_core_connection_commits_with_its_transaction(engine: Engine) -> None:
    job_id, registry, got = waiting_job(engine, "invoice:1")
    with engine.begin() as conn:
        assert sqla_queue.signal(conn, "invoice:1", {"paid": True}) == 1
    assert statuses(engine, [job_id]) == {job_id: "queued"}
    assert drain(engine, registry).succeeded == 1
    assert got == [{"paid": True}]


def test_signal_from_an_async_session(database_url: str, engine: Engine) -> None:
    _, registry, got = waiting_job(engine, "hook:async")

    async def scenario() -> tuple[int, int]:
        async_engine = create_async_engine(normalize_url(database_url))
        try:
            async with async_sessionmaker(async_engine)() as session:
                rolled_back = await sqla_queue.signal_async(session, "hook:async", "no")
                await session.rollback()
            async with async_sessionmaker(async_engine)() as session, session.begin():
                woken = await sqla_queue.signal_async(session, "hook:async", "yes")
            return rolled_back, woken
        finally:
            await async_engine.dispose()

    assert asyncio.run(scenario()) == (1, 1)  # the rolled-back wake was undone with it
    assert mailbox(engine) == [("hook:async", "yes", "one")]
    assert drain(engine, registry).succeeded == 1
    assert got == ["yes"]


def test_the_sql_function_wakes_the_job_as_the_python_call_does(engine: Engine) -> None:
    _, registry, got = waiting_job(engine, "approval:7")
    with engine.begin() as conn:  # what an application's trigger or another language runs
        woken = conn.execute(
            text("SELECT sqla_queue.signal('approval:7', '{\"by\": \"ann\"}'::jsonb)")
        ).scalar_one()
    assert woken == 1
    assert drain(engine, registry).succeeded == 1
    assert got == [{"by": "ann"}]


def test_the_sql_function_called_from_an_applications_trigger(engine: Engine) -> None:
    job_id, registry, got = waiting_job(engine, "payment:42")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE payments (order_id int, amount int)"))
        conn.execute(
            text(
                "CREATE FUNCTION payment_signal() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN PERFORM sqla_queue.signal('payment:' || NEW.order_id, "
                "jsonb_build_object('amount', NEW.amount)); RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE TRIGGER payment_signal AFTER INSERT ON payments "
                "FOR EACH ROW EXECUTE FUNCTION payment_signal()"
            )
        )
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO payments VALUES (42, 990)"))
    assert statuses(engine, [job_id]) == {job_id: "queued"}
    assert drain(engine, registry).succeeded == 1
    assert got == [{"amount": 990}]


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        ("sqla_queue.signal('')", "a key must be 1 to 200 characters"),
        ("sqla_queue.signal(NULL)", "a key must be 1 to 200 characters"),
        ("sqla_queue.signal('k', NULL, 'some')", "wake must be 'one' or 'all'"),
        ("sqla_queue.signal('k', NULL, 'one', interval '-1 day')", "expires_in must be positive"),
    ],
)
def test_the_sql_function_refuses_bad_arguments_in_one_line(
    engine: Engine, call: str, problem: str
) -> None:
    with pytest.raises(DBAPIError) as raised, engine.begin() as conn:
        conn.execute(text(f"SELECT {call}"))
    message = str(raised.value.orig).splitlines()[0]
    assert problem.replace("positive", "a positive interval") in message or problem in message
    assert mailbox(engine) == []


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"key": ""}, "a signal key is a string of 1 to 200 characters"),
        ({"key": 42}, "a signal key is a string of 1 to 200 characters (got a int)"),
        ({"payload": {1, 2}}, "the payload must be JSON"),
        ({"payload": float("nan")}, "the payload must be JSON"),
        ({"wake": "every"}, "wake must be 'one' or 'all'"),
        ({"expires_in": 0}, "expires_in must be a positive timedelta"),
        ({"expires_in": dt.timedelta(days=4000)}, "at most 10 years"),
    ],
)
def test_bad_signal_arguments_are_refused_in_one_line_and_send_nothing(
    engine: Engine, kwargs: dict[str, Any], problem: str
) -> None:
    given: dict[str, Any] = {"key": "k", "payload": None, **kwargs}
    with Session(engine) as session, session.begin(), pytest.raises(ValueError) as raised:
        sqla_queue.signal(session, given.pop("key"), given.pop("payload"), **given)
    assert problem in str(raised.value)
    assert "\n" not in str(raised.value)
    assert mailbox(engine) == []


def test_signal_refuses_an_engine_in_one_line(engine: Engine) -> None:
    with pytest.raises(TypeError, match="an Engine: open a Session or a Connection on it"):
        sqla_queue.signal(engine, "k")  # type: ignore[arg-type]


def test_a_signal_is_kept_until_it_expires_and_its_expiry_is_chosen_per_signal(
    engine: Engine,
) -> None:
    before = database_clock(engine)
    with engine.begin() as conn:
        sqla_queue.signal(conn, "short", expires_in=60)
        sqla_queue.signal(conn, "default")
    after = database_clock(engine)
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text(
                    "SELECT key, extract(epoch FROM expires_at - created_at) "
                    "FROM sqla_queue.signals"
                )
            ).all()
        )
    assert float(rows["short"]) == 60
    assert float(rows["default"]) == 7 * 86400
    assert before <= after


def test_the_keepers_upkeep_deletes_expired_signals_and_the_waits_of_gone_jobs(
    engine: Engine,
) -> None:
    from sqla_queue.db.queries import signals as signal_queries

    job_id, _, _ = waiting_job(engine, "gone")
    with engine.begin() as conn:
        sqla_queue.signal(conn, "old", expires_in=60)
        sqla_queue.signal(conn, "fresh")
        conn.execute(text("UPDATE sqla_queue.signals SET expires_at = now() WHERE key = 'old'"))
        conn.execute(text("DELETE FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id})
    with engine.begin() as conn:  # what the keeper runs about once a minute
        conn.execute(signal_queries.delete_expired_signals())
        conn.execute(signal_queries.delete_orphan_waits())
    assert [key for key, _, _ in mailbox(engine)] == ["fresh"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sqla_queue.signal_waits")).scalar() == 0


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_signal_sends_the_payload_and_says_how_many_jobs_it_woke(
    database_url: str, engine: Engine
) -> None:
    _, registry, got = waiting_job(engine, "payment:9")
    result = cli("signal", "payment:9", "--payload", '{"amount": 5}', url=database_url)
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == "signal 'payment:9' sent: woke 1 job(s)"
    assert drain(engine, registry).succeeded == 1
    assert got == [{"amount": 5}]


def test_cli_signal_wake_all_and_expiry(database_url: str, engine: Engine) -> None:
    result = cli("signal", "deploy:done", "--wake", "all", "--expires-in", "1h", url=database_url)
    assert result.exit_code == 0, result.output
    assert "woke 0 job(s)" in result.output
    assert mailbox(engine) == [("deploy:done", None, "all")]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["k", "--payload", "{not json"], "Invalid value for --payload: not valid JSON"),
        (["k", "--payload", "NaN"], "Invalid value for --payload: not valid JSON"),
        (["k" * 201], "a signal key is a string of 1 to 200 characters"),
        (["k", "--wake", "some"], "Invalid value for '--wake'"),
        (["k", "--expires-in", "0"], "Invalid value for '--expires-in'"),
    ],
)
def test_cli_signal_refuses_bad_input_in_one_clear_line(
    database_url: str, engine: Engine, args: list[str], problem: str
) -> None:
    result = cli("signal", *args, url=database_url)
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1
    assert problem in errors[0]
    assert mailbox(engine) == []


def test_cli_jobs_list_waiting_for_and_jobs_show_name_the_signal(
    database_url: str, engine: Engine
) -> None:
    job_id, _, _ = waiting_job(engine, "approval:3")
    enqueue_jobs(engine, "other", 1)
    listed = cli("jobs", "list", "--waiting-for", "approval:3", "--json", url=database_url)
    assert listed.exit_code == 0, listed.output
    assert [job["id"] for job in json.loads(listed.output)] == [job_id]
    none = cli("jobs", "list", "--waiting-for", "approval:4", "--json", url=database_url)
    assert json.loads(none.output) == []
    shown = cli("jobs", "show", str(job_id), url=database_url)
    assert shown.exit_code == 0, shown.output
    assert "waiting for signal: approval:3 until " in shown.output
    assert "approval:3 #1 waiting until " in shown.output
    as_json = json.loads(cli("jobs", "show", str(job_id), "--json", url=database_url).output)
    assert as_json["signal_key"] == "approval:3"
    assert [w["state"] for w in as_json["signal_waits"]] == ["waiting"]


def test_cancelling_by_waiting_for_filter_cancels_the_parked_jobs(
    database_url: str, engine: Engine
) -> None:
    job_id, _, _ = waiting_job(engine, "approval:5")
    result = cli("jobs", "cancel", "--waiting-for", "approval:5", "--yes", url=database_url)
    assert result.exit_code == 0, result.output
    assert statuses(engine, [job_id]) == {job_id: "cancelled"}
