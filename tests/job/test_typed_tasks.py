"""Typed tasks: `Task.defer` with the handler's own parameters, `Task.using(...)` for the
job's options, and arguments that are Python values (datetime, UUID, Decimal, enums,
dataclasses, TypedDicts, Pydantic models), converted at enqueue and rebuilt before the call."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import pydantic
import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_queue import InvalidJobError, Job, Registry, enqueue, enqueue_many
from sqla_queue.job import arguments
from sqla_queue.testing import DrainResult, drain

WHEN = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone.utc)
KEY = uuid.UUID("12345678-1234-5678-1234-567812345678")


class Colour(enum.Enum):
    red = "red"
    blue = "blue"


@dataclasses.dataclass
class Address:
    street: str
    since: dt.date


class Line(TypedDict):
    sku: str
    price: decimal.Decimal


class Customer(pydantic.BaseModel):
    name: str
    joined: dt.datetime


@pytest.fixture(params=["pydantic", "builtin"])
def converters(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test runs with Pydantic's TypeAdapter and with the built-in converters."""
    saved = arguments.use_pydantic
    arguments.use_pydantic = request.param == "pydantic"
    yield str(request.param)
    arguments.use_pydantic = saved


def make_registry(seen: list[dict[str, Any]]) -> Registry:
    registry = Registry()

    @registry.task(name="ship", queue="default", max_attempts=2)
    def ship(
        when: dt.datetime,
        key: uuid.UUID,
        amount: decimal.Decimal,
        colour: Colour,
        address: Address,
        line: Line,
        note: str = "",
        on: dt.date | None = None,
    ) -> None:
        seen.append(
            {
                "when": when,
                "key": key,
                "amount": amount,
                "colour": colour,
                "address": address,
                "line": line,
                "note": note,
                "on": on,
            }
        )

    return registry


def test_typed_call_stores_json_and_the_handler_gets_the_python_values(
    engine: Engine, converters: str
) -> None:
    seen: list[dict[str, Any]] = []
    registry = make_registry(seen)
    ship = registry["ship"]
    address = Address("Main St 1", dt.date(2020, 5, 17))
    line = Line(sku="A-1", price=decimal.Decimal("9.90"))
    with Session(engine) as session, session.begin():
        job = ship.defer(
            session,
            when=WHEN,
            key=KEY,
            amount=decimal.Decimal("12.50"),
            colour=Colour.blue,
            address=address,
            line=line,
            on=dt.date(2026, 1, 2),
        )
        session.flush()
        job_id = job.id
    with engine.connect() as connection:
        stored = connection.execute(
            text("SELECT args FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    assert dt.datetime.fromisoformat(stored["when"].replace("Z", "+00:00")) == WHEN
    assert stored["key"] == str(KEY)
    assert decimal.Decimal(stored["amount"]) == decimal.Decimal("12.50")
    assert stored["colour"] == "blue"
    assert stored["address"] == {"street": "Main St 1", "since": "2020-05-17"}
    assert stored["on"] == "2026-01-02"
    assert drain(engine, registry) == DrainResult(succeeded=1)
    (got,) = seen
    assert got["when"] == WHEN
    assert got["key"] == KEY
    assert got["amount"] == decimal.Decimal("12.50")
    assert got["colour"] is Colour.blue
    assert got["address"] == address
    assert got["on"] == dt.date(2026, 1, 2)
    assert got["line"] == {"sku": "A-1", "price": decimal.Decimal("9.90")}


def test_positional_arguments_are_stored_by_parameter_name(engine: Engine) -> None:
    registry = Registry()
    got: list[tuple[int, str]] = []

    @registry.task(name="pair")
    def pair(order_id: int, email: str) -> None:
        got.append((order_id, email))

    with Session(engine) as session, session.begin():
        job = pair.defer(session, 7, email="a@example.com")
        assert job.args == {"order_id": 7, "email": "a@example.com"}
    assert drain(engine, registry) == DrainResult(succeeded=1)
    assert got == [(7, "a@example.com")]


def test_a_value_that_does_not_fit_is_refused_at_enqueue_naming_the_parameter(
    engine: Engine, converters: str
) -> None:
    registry = make_registry([])
    ship = registry["ship"]
    good: dict[str, Any] = {
        "when": WHEN,
        "key": KEY,
        "amount": decimal.Decimal(1),
        "colour": Colour.red,
        "address": Address("x", dt.date(2020, 1, 1)),
        "line": Line(sku="s", price=decimal.Decimal(1)),
    }
    bad = [("key", "not-a-uuid"), ("colour", "green"), ("amount", "ten"), ("when", "tomorrow")]
    with Session(engine) as session, session.begin():
        for name, value in bad:
            with pytest.raises(InvalidJobError) as caught:
                ship.defer(session, **{**good, name: value})
            message = str(caught.value)
            assert f"argument {name!r}" in message
            assert "\n" not in message
        session.flush()
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM sqla_queue.jobs")).scalar() == 0


def test_the_dict_form_and_by_name_enqueue_convert_the_same_way(engine: Engine) -> None:
    seen: list[dict[str, Any]] = []
    registry = make_registry(seen)
    args: dict[str, Any] = {
        "when": WHEN,
        "key": KEY,
        "amount": decimal.Decimal("3.10"),
        "colour": Colour.red,
        "address": Address("y", dt.date(2021, 2, 3)),
        "line": Line(sku="s", price=decimal.Decimal("1.5")),
    }
    as_json = {
        **args,
        "when": WHEN.isoformat(),
        "key": str(KEY),
        "amount": "3.10",
        "colour": "red",
        "address": {"street": "y", "since": "2021-02-03"},
        "line": {"sku": "s", "price": "1.5"},
    }
    with Session(engine) as session, session.begin():
        registry["ship"].enqueue(session, args)
        enqueue(session, "ship", as_json, registry=registry)  # by name: JSON, checked
    assert drain(engine, registry) == DrainResult(succeeded=2)
    assert seen[0] == seen[1]
    assert seen[0]["amount"] == decimal.Decimal("3.10")


def test_pydantic_model_arguments_round_trip(engine: Engine) -> None:
    registry = Registry()
    got: list[Customer] = []

    @registry.task(name="welcome")
    def welcome(customer: Customer) -> None:
        got.append(customer)

    customer = Customer(name="Ada", joined=WHEN)
    with Session(engine) as session, session.begin():
        welcome.defer(session, customer=customer)
        with pytest.raises(InvalidJobError, match="argument 'customer'"):
            welcome.defer(session, customer={"name": "Bob"})  # type: ignore[arg-type]
    assert drain(engine, registry) == DrainResult(succeeded=1)
    assert got == [customer]


def test_stored_args_that_no_longer_fit_fail_at_once_without_retries(engine: Engine) -> None:
    """A deploy changed a parameter's type: the job fails on its first attempt with the
    reason, instead of spending its five."""
    registry = Registry()

    @registry.task(name="remind", max_attempts=5)
    def remind(when: dt.datetime) -> None:
        raise AssertionError("never called")

    with Session(engine) as session, session.begin():
        enqueue(session, "remind", {"when": "last tuesday"})  # no registry in force: as given
    assert drain(engine, registry) == DrainResult(failed=1)
    with engine.connect() as connection:
        status, attempts, error = connection.execute(
            text("SELECT status, attempts, last_error FROM sqla_queue.jobs")
        ).one()
    assert (status, attempts) == ("failed", 1)
    assert "argument 'when'" in error
    assert "no longer fit" in error


def test_using_sets_options_apart_over_the_task_defaults(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="mail", queue="default", priority=5, unique=True)
    def mail(order_id: int) -> None: ...

    with Session(engine) as session, session.begin():
        first = mail.defer(session, order_id=1)
        again = mail.defer(session, order_id=1)
        other = mail.using(unique=False, priority=1, delay=60).defer(session, order_id=1)
        session.flush()
        assert again.duplicate
        assert again.id == first.id
        assert not other.duplicate
        assert other.id != first.id
        assert (other.priority, first.priority) == (1, 5)
        later = session.execute(
            select(Job.run_at > Job.created_at + dt.timedelta(seconds=59)).where(Job.id == other.id)
        ).scalar_one()
        assert later


def test_defer_on_a_core_connection_returns_the_id(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="core")
    def core(when: dt.datetime) -> None: ...

    with engine.begin() as connection:
        job_id = core.defer(connection, when=WHEN)
        stored = connection.execute(
            text("SELECT args->>'when' FROM sqla_queue.jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    assert isinstance(job_id, int)
    assert dt.datetime.fromisoformat(stored.replace("Z", "+00:00")) == WHEN


def test_typed_rows_for_enqueue_many_carry_the_task_defaults(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="bulk", priority=3)
    def bulk(when: dt.datetime, n: int) -> None: ...

    with Session(engine) as session, session.begin():
        ids = enqueue_many(
            session,
            [bulk.row(when=WHEN, n=1), bulk.using(priority=9).row(when=WHEN, n=2)],
        )
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT priority, args->>'n' FROM sqla_queue.jobs ORDER BY id")
        ).all()
    assert len(ids) == 2
    assert [tuple(r) for r in rows] == [(3, "1"), (9, "2")]
    with pytest.raises(InvalidJobError, match="argument 'when'"):
        bulk.row(when="soon", n=1)


def test_defer_async_uses_the_task_queue_and_unique_default(database_url: str) -> None:
    registry = Registry()

    @registry.task(name="async_mail", unique=True)
    def async_mail(when: dt.datetime) -> None: ...

    async def run() -> tuple[int | None, bool]:
        url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
        engine = create_async_engine(url)
        try:
            async with AsyncSession(engine) as session, session.begin():
                first = await async_mail.defer_async(session, when=WHEN)
                again = await async_mail.using(unique=True).defer_async(session, when=WHEN)
                return (first.id, again.duplicate and again.id == first.id)
        finally:
            await engine.dispose()

    job_id, duplicate = asyncio.run(run())
    assert job_id is not None
    assert duplicate


def test_defer_without_a_session_or_with_an_engine_is_one_clear_line(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="clear")
    def clear(order_id: int) -> None: ...

    with pytest.raises(TypeError) as caught:
        clear.defer(engine, order_id=1)  # type: ignore[call-overload]
    assert "an Engine" in str(caught.value)
    assert "defer()" in str(caught.value)
    with pytest.raises(TypeError) as caught:
        clear.enqueue({"order_id": 1})  # type: ignore[arg-type]
    message = str(caught.value)
    assert "the args go second" in message
    assert "\n" not in message
