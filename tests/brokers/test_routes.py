"""Routed queues: the setting, its checks, and the table workers leaving their jobs alone.

None of these needs a broker: they are about what PostgreSQL and the CLI do with a route.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import Result
from helpers.statements import claim_rows
from helpers.support import cli
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    Job,
    Registry,
    admin,
    enqueue,
    enqueue_async,
    enqueue_many,
)
from sqla_queue.brokers.kinds import BROKER_KINDS, broker_kind, parse_route
from sqla_queue.db.database import normalize_url
from sqla_queue.enqueue import COPY_MIN_ROWS


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def one_line_error(result: Result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def tasks_claimed(engine: Engine, queue_names: list[str] | None) -> list[str]:
    """Task names a table worker's claim takes (from `queue_names`, or every queue)."""
    with engine.begin() as conn:
        rows = claim_rows(conn, 100, queue_names, worker_id="test")
    return sorted(row["task"] for row in rows)


def test_table_workers_never_claim_jobs_of_a_routed_queue(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "out")
        admin.set_route(conn, "out", "nats:jobs.out")
    with Session(engine) as session, session.begin():
        enqueue(session, "for_the_broker", queue="out")
        enqueue(session, "for_the_table")

    assert tasks_claimed(engine, ["out"]) == []
    assert tasks_claimed(engine, None) == ["for_the_table"]
    with engine.connect() as conn:
        left = conn.execute(text("SELECT task, status FROM sqla_queue.jobs WHERE queue = 'out'"))
        assert left.all() == [("for_the_broker", "queued")]


def test_clearing_the_route_gives_the_jobs_back_to_table_workers(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "out")
        admin.set_route(conn, "out", "amqp:jobs/out")
    with Session(engine) as session, session.begin():
        enqueue(session, "waiting", queue="out")
    assert tasks_claimed(engine, ["out"]) == []

    with engine.begin() as conn:
        admin.set_route(conn, "out", None)

    assert tasks_claimed(engine, ["out"]) == ["waiting"]


@pytest.mark.parametrize(
    ("route", "problem"),
    [
        ("jobs.out", "does not start with nats: or amqp:"),
        ("kafka:jobs", "does not start with nats: or amqp:"),
        ("nats:", "needs a destination"),
        ("nats:jobs.*", "not a NATS subject"),
        ("nats:jobs..out", "not a NATS subject"),
        ("nats:jobs out", "not a NATS subject"),
        ("amqp:jobs", "needs both an exchange and a routing key"),
        ("amqp:/out", "needs both an exchange and a routing key"),
        ("amqp:jobs/", "needs both an exchange and a routing key"),
        ("amqp:amq.direct/out", "reserved exchange"),
        ("amqp:jobs/o ut", "characters other than"),
    ],
)
def test_a_bad_route_is_refused_naming_the_problem_and_the_form(route: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_route(route)
    message = str(caught.value)
    assert problem in message
    assert "nats:SUBJECT" in message
    assert "amqp:EXCHANGE/ROUTING_KEY" in message


def test_route_names_what_the_broker_side_uses() -> None:
    nats = parse_route("nats:jobs.out")
    assert (nats.stream, nats.dead_stream, nats.dead_subject) == (
        "SQLAQ_jobs_out",
        "SQLAQ_DEAD_jobs_out",
        "sqlaq.dead.jobs.out",
    )
    amqp = parse_route("amqp:shop/emails")
    assert (amqp.exchange, amqp.routing_key, amqp.amqp_queue, amqp.amqp_dead_queue) == (
        "shop",
        "emails",
        "sqlaq.shop.emails",
        "sqlaq.shop.emails.dead",
    )
    assert str(amqp) == "amqp:shop/emails"


def test_the_database_refuses_a_route_that_bypasses_the_check(engine: Engine) -> None:
    with pytest.raises(IntegrityError, match="ck_queues_route"), engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.queues SET route = 'ftp:x' WHERE name = 'default'"))


def test_routing_an_unknown_queue_names_the_command_that_creates_it(engine: Engine) -> None:
    with pytest.raises(Exception, match="sqla-queue queues create ghost"), engine.begin() as conn:
        admin.set_route(conn, "ghost", "nats:ghost")


# -- CLI -------------------------------------------------------------------------------------


def test_queues_create_set_and_clear_a_route(database_url: str, engine: Engine) -> None:
    created = cli("queues", "create", "out", "--route", "nats:jobs.out", url=database_url)
    assert created.exit_code == 0, created.output
    assert "route nats:jobs.out" in created.stdout

    moved = cli("queues", "set", "out", "--route", "amqp:shop/out", url=database_url)
    assert moved.exit_code == 0, moved.output
    listed = cli("queues", "list", url=database_url)
    assert "out\tactive\tretention=delete\troute=amqp:shop/out" in listed.stdout

    cleared = cli("queues", "set", "out", "--no-route", url=database_url)
    assert cleared.exit_code == 0, cleared.output
    assert "route (none)" in cleared.stdout
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT route FROM sqla_queue.queues WHERE name = 'out'")) is None


def test_queues_create_with_a_bad_route_creates_nothing(database_url: str, engine: Engine) -> None:
    result = cli("queues", "create", "out", "--route", "nats:a b", url=database_url)

    assert "not a NATS subject" in one_line_error(result)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM sqla_queue.queues WHERE name = 'out'")) == 0


def test_worker_from_a_broker_needs_a_routed_queue_of_that_broker(
    database_url: str, engine: Engine
) -> None:
    base = ["worker", "--app", "helpers.apps.tasks:registry", "--from", "nats://127.0.0.1:4222"]
    assert "-q NAME" in one_line_error(cli(*base, url=database_url))
    assert "has no route" in one_line_error(cli(*base, "-q", "default", url=database_url))
    with engine.begin() as conn:
        admin.create_queue(conn, "out")
        admin.set_route(conn, "out", "amqp:shop/out")
    mismatch = one_line_error(cli(*base, "-q", "out", url=database_url))
    assert "routes to amqp:shop/out" in mismatch
    assert "amqp://" in mismatch
    wrong_scheme = [*base[:-1], "redis://x"]
    assert "neither nats:// nor amqp://" in one_line_error(
        cli(*wrong_scheme, "-q", "out", url=database_url)
    )


def test_lease_with_from_is_refused_naming_ack_wait(database_url: str) -> None:
    base = ["worker", "--app", "helpers.apps.tasks:registry", "--from", "nats://127.0.0.1:4222"]

    lease = cli(*base, "-q", "default", "--lease", "5", url=database_url)
    ack_wait = cli(*base, "-q", "default", "--ack-wait", "5", url=database_url)

    assert lease.exit_code == 2
    assert "Invalid value for '--lease'" in lease.stderr
    assert "--ack-wait" in lease.stderr
    assert "has no route" in one_line_error(ack_wait)  # taken; the queue has no route


def test_every_broker_kind_names_its_routes_urls_and_relay_option() -> None:
    relay_help = cli("relay", "--help").output

    for name, kind in BROKER_KINDS.items():
        assert parse_route(kind.route_example).kind == name
        assert broker_kind(kind.example_url) == name
        assert all(broker_kind(f"{scheme}://host") == name for scheme in kind.schemes)
        assert f"--{name} TEXT" in relay_help
        with pytest.raises(ConfigurationError) as refused:
            parse_route("x:y")
        assert kind.route_form in str(refused.value)


def test_relay_needs_exactly_one_broker(database_url: str) -> None:
    assert "exactly one of --nats" in one_line_error(cli("relay", url=database_url))
    both = cli("relay", "--nats", "nats://x:1", "--amqp", "amqp://x:1/", url=database_url)
    assert "exactly one of --nats" in one_line_error(both)


@pytest.mark.parametrize(
    ("option", "url"),
    [("--nats", "nats://127.0.0.1:9"), ("--amqp", "amqp://guest:secret@127.0.0.1:9/")],
)
def test_relay_to_a_broker_that_does_not_answer_says_which_in_one_line(
    database_url: str, engine: Engine, option: str, url: str
) -> None:
    with engine.begin() as conn:  # a routed queue, so the relay has a reason to connect
        admin.create_queue(conn, "out")
        admin.set_route(conn, "out", "nats:jobs.out" if option == "--nats" else "amqp:a/b")

    line = one_line_error(cli("relay", option, url, url=database_url))

    assert "Cannot reach the broker at" in line
    assert "127.0.0.1:9" in line
    assert "secret" not in line  # the password is not printed


# -- unique jobs and routes ----------------------------------------------------------------------


def unique_task_enqueue(session: Session, queue: str) -> object:
    registry = Registry()
    task = registry.task(name="sync_account", unique=True)(lambda account: None)
    return task.enqueue(session, {"account": 1}, queue=queue, flush=True)


UniqueWrite = Callable[[Session], object]
UNIQUE_PATHS: dict[str, UniqueWrite] = {
    "enqueue": lambda s: enqueue(s, "sync", {"account": 1}, queue="out", unique=True),
    "enqueue connection": lambda s: enqueue(
        s.connection(), "sync", {"account": 1}, queue="out", unique=True
    ),
    "Task.enqueue": lambda s: unique_task_enqueue(s, "out"),
    "session.add": lambda s: (
        s.add(Job(task="sync", args={"account": 1}, queue="out", unique=True)),
        s.flush(),
    ),
    "enqueue_many": lambda s: enqueue_many(
        s,
        [
            {"task": "sync", "args": {"n": i}, "queue": q, "unique": True}
            for i, q in [(1, "default"), (2, "out")]
        ],
    ),
    "enqueue_many staged": lambda s: enqueue_many(
        s,
        [
            {"task": "sync", "args": {"n": i}, "queue": "out", "unique": True}
            for i in range(COPY_MIN_ROWS)
        ],
    ),
}


def routed(engine: Engine, route: str = "nats:jobs.out") -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "out")
        admin.set_route(conn, "out", route)


def job_rows(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT task, queue FROM sqla_queue.jobs ORDER BY id"))
        return [(task, queue) for task, queue in rows]


@pytest.mark.parametrize("path", sorted(UNIQUE_PATHS))
def test_a_unique_job_is_refused_on_a_routed_queue_and_the_transaction_goes_on(
    engine: Engine, path: str
) -> None:
    routed(engine)
    with Session(engine) as session:
        enqueue(session, "before", queue="out")
        with pytest.raises(InvalidJobError) as raised:
            UNIQUE_PATHS[path](session)
        enqueue(session, "after", queue="out")  # refused before anything was written
        session.commit()
    message = str(raised.value)
    assert "queue 'out' is routed to a broker (nats:jobs.out)" in message
    assert "a unique key cannot be held" in message
    assert "unique=False" in message
    assert job_rows(engine) == [("before", "out"), ("after", "out")]


@pytest.mark.parametrize("feature", ["unique", "sequence", "partition"])
def test_async_enqueue_of_a_unique_sequence_or_partition_job_is_refused_on_a_routed_queue(
    database_url: str, engine: Engine, feature: str
) -> None:
    routed(engine, "amqp:shop/out")
    async_engine = create_async_engine(normalize_url(database_url))
    option: dict[str, Any] = {feature: True if feature == "unique" else "a"}

    async def attempt() -> None:
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                await enqueue_async(session, "sync", {"account": 1}, queue="out", **option)
        finally:
            await async_engine.dispose()

    with pytest.raises(InvalidJobError, match=r"routed to a broker \(amqp:shop/out\)"):
        asyncio.run(attempt())
    assert job_rows(engine) == []


def test_routing_a_queue_that_holds_unique_jobs_is_refused_until_they_finish(
    database_url: str, engine: Engine
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "out")
        admin.set_retention(conn, "out", "keep")
    with Session(engine) as session, session.begin():
        held = enqueue(session, "sync", {"account": 1}, queue="out", unique=True).id
        enqueue(session, "plain", queue="out")
    with engine.begin() as conn, pytest.raises(ConfigurationError) as raised:
        admin.set_route(conn, "out", "nats:jobs.out")
    assert "it has 1 unique job(s) queued or running" in str(raised.value)
    refused = cli("queues", "set", "out", "--route", "nats:jobs.out", url=database_url)
    assert "a unique key cannot be held" in one_line_error(refused)

    with engine.begin() as conn:
        admin.cancel_jobs(conn, [held])  # ended: its key no longer blocks, nor the route
        admin.set_route(conn, "out", "nats:jobs.out")
        admin.set_route(conn, "out", None)  # clearing a route is never refused
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT route FROM sqla_queue.queues WHERE name = 'out'")) is None


# -- sequences, partitions and routes ------------------------------------------------------------


def keyed_task_enqueue(session: Session, feature: str) -> object:
    registry = Registry()
    task = registry.task(name="ordered", **{feature: "account-1"})(lambda n: None)
    return task.enqueue(session, {"n": 1}, queue="out", flush=True)


KeyedWrite = Callable[[Session, str], object]
KEYED_PATHS: dict[str, KeyedWrite] = {
    "enqueue": lambda s, f: enqueue(s, "ordered", {"n": 1}, queue="out", **{f: "a"}),
    "enqueue connection": lambda s, f: enqueue(
        s.connection(), "ordered", {"n": 1}, queue="out", **{f: "a"}
    ),
    "Task.enqueue default": keyed_task_enqueue,
    "session.add": lambda s, f: (
        s.add(Job(task="ordered", args={"n": 1}, queue="out", **{f: "a"})),
        s.flush(),
    ),
    "unique enqueue": lambda s, f: enqueue(
        s.connection(), "ordered", {"n": 1}, queue="out", unique=True, **{f: "a"}
    ),
    "enqueue_many": lambda s, f: enqueue_many(
        s,
        [
            {"task": "ordered", "args": {"n": i}, "queue": q, f: "a"}
            for i, q in [(1, "default"), (2, "out")]
        ],
    ),
    "enqueue_many copy": lambda s, f: enqueue_many(
        s,
        [
            {"task": "ordered", "args": {"n": i}, "queue": "out", f: "a"}
            for i in range(COPY_MIN_ROWS)
        ],
    ),
}


@pytest.mark.parametrize("feature", ["sequence", "partition"])
@pytest.mark.parametrize("path", sorted(KEYED_PATHS))
def test_a_job_with_a_sequence_or_partition_is_refused_on_a_routed_queue(
    engine: Engine, path: str, feature: str
) -> None:
    routed(engine)
    with Session(engine) as session:
        enqueue(session, "before", queue="out")
        with pytest.raises(InvalidJobError) as raised:
            KEYED_PATHS[path](session, feature)
        enqueue(session, "after", queue="out")  # refused before anything was written
        enqueue(session, "elsewhere", queue="default", **{feature: "a"})  # not routed: taken
        session.commit()
    message = str(raised.value)
    assert "\n" not in message
    assert "queue 'out' is routed to a broker (nats:jobs.out)" in message
    kept = "a sequence cannot be kept" if feature == "sequence" else "partitions are not honoured"
    assert kept in message
    assert f"enqueue it without {feature}" in message
    assert job_rows(engine) == [("before", "out"), ("after", "out"), ("elsewhere", "default")]


def test_cli_enqueue_with_a_sequence_on_a_routed_queue_is_one_line(
    database_url: str, engine: Engine
) -> None:
    routed(engine)
    refused = cli("enqueue", "ordered", "--queue", "out", "--sequence", "a", url=database_url)
    assert "a sequence cannot be kept" in one_line_error(refused)
    assert job_rows(engine) == []


@pytest.mark.parametrize("feature", ["sequence", "partition"])
def test_routing_a_queue_that_holds_sequence_or_partition_jobs_is_refused_until_they_finish(
    database_url: str, engine: Engine, feature: str
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "out")
    with Session(engine) as session, session.begin():
        held = enqueue(session, "ordered", queue="out", flush=True, **{feature: "a"}).id
        enqueue(session, "plain", queue="out")
    with engine.begin() as conn, pytest.raises(ConfigurationError) as raised:
        admin.set_route(conn, "out", "nats:jobs.out")
    assert f"it has 1 job(s) with a {feature} queued or running" in str(raised.value)
    refused = cli("queues", "set", "out", "--route", "nats:jobs.out", url=database_url)
    assert "is routed to a broker" in one_line_error(refused)

    with engine.begin() as conn:
        admin.cancel_jobs(conn, [held])
        admin.set_route(conn, "out", "nats:jobs.out")
