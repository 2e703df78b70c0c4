"""ORM rows as a task's arguments (issue 37, item 3): the reference a job keeps, the load in
the handler's session, and the policies for a row gone, changed or locked."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.row_models import Customer, Order, bump, make_shop, order_of, stored_job
from sqlalchemy import Engine, select, text, update
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    Job,
    JobContext,
    Registry,
    enqueue,
    enqueue_many,
)
from sqla_queue.testing import drain, run_until_empty


@pytest.fixture
def shop(engine: Engine) -> Engine:
    return make_shop(engine)


def test_a_row_argument_is_kept_as_a_reference_and_the_job_is_about_it(shop: Engine) -> None:
    registry = Registry()

    @registry.task
    def ship(order: Order) -> None: ...

    with Session(shop) as session, session.begin():
        typed = ship.defer(session, order_of(session))
        by_name = enqueue(session, ship.name, {"order": order_of(session, 2)}, registry=registry)
        session.flush()
        assert typed.args == {"order": {"$row": "row_orders", "key": [1], "version": 1}}
        assert typed.about == "row_orders:1"
        assert by_name.args["order"]["key"] == [2]
        assert by_name.about == "row_orders:2"


def test_the_handler_gets_the_row_in_its_session_and_commits_it_with_the_job(
    shop: Engine,
) -> None:
    registry = Registry()
    seen: list[str] = []

    @registry.task(pass_context=True)
    def ship(ctx: JobContext, order: Order) -> None:
        seen.append(order.status)
        with ctx.session() as session:
            assert order in session  # loaded in the session ctx.session() returns
            order.status = "shipped"
            session.commit()

    with Session(shop) as session, session.begin():
        ship.defer(session, order_of(session))
    assert run_until_empty(shop, registry).succeeded == 1
    assert seen == ["new"]
    with Session(shop) as session:
        assert order_of(session).status == "shipped"
        assert order_of(session).version == 2


def test_a_row_gone_cancels_the_job_naming_it_without_running_it(shop: Engine) -> None:
    registry = Registry()
    calls: list[object] = []

    @registry.task
    def ship(order: Order) -> None:
        calls.append(order)

    with Session(shop) as session, session.begin():
        job = ship.defer(session, order_of(session))
        session.flush()
        job_id = job.id
    with Session(shop) as session, session.begin():
        session.delete(order_of(session))
    run_until_empty(shop, registry)
    job = stored_job(shop, job_id)
    assert calls == []
    assert job.status == "cancelled"
    assert job.last_error == "row_orders 1 is gone"


def test_missing_none_runs_the_handler_with_none(shop: Engine) -> None:
    registry = Registry()
    calls: list[object] = []

    @registry.task(missing="none")
    def ship(order: Order | None) -> None:
        calls.append(order)

    with Session(shop) as session, session.begin():
        ship.defer(session, order_of(session))
    with Session(shop) as session, session.begin():
        session.delete(order_of(session))
    assert run_until_empty(shop, registry).succeeded == 1
    assert calls == [None]


def test_changed_skip_cancels_a_job_whose_row_changed_since_enqueue(shop: Engine) -> None:
    registry = Registry()
    calls: list[object] = []

    @registry.task(changed="skip")
    def ship(order: Order) -> None:
        calls.append(order)

    with Session(shop) as session, session.begin():
        job = ship.defer(session, order_of(session))
        session.flush()
        job_id = job.id
    bump(shop)
    run_until_empty(shop, registry)
    job = stored_job(shop, job_id)
    assert calls == []
    assert job.status == "cancelled"
    assert job.last_error == "row_orders 1 changed since enqueue (version 1, now 2)"


def test_changed_run_runs_with_the_row_as_it_is_now(shop: Engine) -> None:
    registry = Registry()
    versions: list[int] = []

    @registry.task  # changed="run" is the default
    def ship(order: Order) -> None:
        versions.append(order.version)

    with Session(shop) as session, session.begin():
        ship.defer(session, order_of(session))
    bump(shop)
    assert run_until_empty(shop, registry).succeeded == 1
    assert versions == [2]


def test_changed_latest_runs_only_the_job_enqueued_after_the_last_change(shop: Engine) -> None:
    registry = Registry()
    versions: list[int] = []

    @registry.task(changed="latest")
    def reindex(order: Order) -> None:
        versions.append(order.version)

    with Session(shop) as session, session.begin():
        first = reindex.defer(session, order_of(session))
        session.flush()
        first_id = first.id
    bump(shop)
    with Session(shop) as session, session.begin():
        second = reindex.defer(session, order_of(session))
        session.flush()
        second_id = second.id
    run_until_empty(shop, registry)
    assert versions == [2]
    earlier = stored_job(shop, first_id)
    assert earlier.status == "cancelled"
    assert earlier.last_error == (
        f"row_orders 1 changed since enqueue (version 1, now 2); job {second_id}, enqueued "
        "later, runs with it"
    )


def test_for_update_snoozes_without_an_attempt_while_another_transaction_holds_the_row(
    shop: Engine,
) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.task(for_update=True)
    def ship(order: Order) -> None:
        calls.append(order.id)

    with Session(shop) as session, session.begin():
        job = ship.defer(session, order_of(session))
        session.flush()
        job_id = job.id
    with shop.connect() as holder:
        holder.execute(text("SELECT 1 FROM row_orders WHERE id = 1 FOR UPDATE"))
        stats = run_until_empty(shop, registry)
        holder.rollback()
    held = stored_job(shop, job_id)
    assert calls == []
    assert stats.snoozed >= 1
    assert held.status == "queued"
    assert held.attempts == 1
    assert held.max_attempts == 6  # the attempt refunded: the budget grew by one
    assert held.last_error == "snoozed for 1 s: row_orders 1 is locked by another transaction"
    with shop.begin() as connection:
        connection.execute(update(Job).where(Job.id == job_id).values(run_at=text("now()")))
    assert run_until_empty(shop, registry).succeeded == 1
    assert calls == [1]


def test_a_reference_to_another_table_is_refused_at_enqueue_and_before_the_run(
    shop: Engine,
) -> None:
    registry = Registry()
    calls: list[object] = []

    @registry.task
    def ship(order: Order) -> None:
        calls.append(order)

    forged = {"$row": "row_customers", "key": [1]}
    with Session(shop) as session, session.begin():
        with pytest.raises(InvalidJobError, match="a reference to a row of 'row_customers'"):
            enqueue(session, ship.name, {"order": forged}, registry=registry)
        job = ship.defer(session, order_of(session))
        session.flush()
        job_id = job.id
    with shop.begin() as connection:  # forged in the table itself
        connection.execute(update(Job).where(Job.id == job_id).values(args={"order": forged}))
    run_until_empty(shop, registry)
    job = stored_job(shop, job_id)
    assert calls == []
    assert job.status == "failed"
    assert "a reference to a row of 'row_customers'" in (job.last_error or "")


@pytest.mark.parametrize("how", ["args changed", "another about", "no about"])
def test_a_reference_to_another_row_of_the_same_table_fails_for_good_without_a_load(
    shop: Engine, how: str
) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.task
    def ship(order: Order) -> None:
        calls.append(order.id)

    other = {"$row": "row_orders", "key": [2], "version": 1}
    with Session(shop) as session, session.begin():
        if how == "another about":  # enqueued about order 1 but naming order 2
            job = enqueue(
                session, ship.name, {"order": other}, about="row_orders:1", registry=registry
            )
        elif how == "no about":  # by name, no registry in force: nothing records the row
            job = enqueue(session, ship.name, {"order": other})
        else:
            job = ship.defer(session, order_of(session))
        session.flush()
        job_id = job.id
    if how == "args changed":  # forged in the table itself, after enqueue
        with shop.begin() as connection:
            connection.execute(update(Job).where(Job.id == job_id).values(args={"order": other}))
    stats = run_until_empty(shop, registry)
    job = stored_job(shop, job_id)
    assert calls == []
    assert stats.failed == 1
    assert job.status == "failed"
    assert job.attempts == 1  # never retried
    assert "row argument 'order' names 'row_orders:2' but the job is about" in (
        job.last_error or ""
    )
    assert "a job loads only the row it was enqueued about" in (job.last_error or "")


def test_a_reference_to_the_row_the_job_is_about_still_loads(shop: Engine) -> None:
    registry = Registry()
    calls: list[int] = []

    @registry.task
    def ship(order: Order) -> None:
        calls.append(order.id)

    with Session(shop) as session, session.begin():
        enqueue(
            session,
            ship.name,
            {"order": {"$row": "row_orders", "key": [2]}},
            about="row_orders:2",
            registry=registry,
        )
    assert run_until_empty(shop, registry).succeeded == 1
    assert calls == [2]


def test_a_row_for_enqueue_many_is_about_its_row_without_a_registry_in_force(
    shop: Engine,
) -> None:
    registry = Registry()
    shipped: list[int] = []

    @registry.task
    def ship(order: Order) -> None:
        shipped.append(order.id)

    with Session(shop) as session, session.begin():
        row = ship.row(order_of(session, 2))
        assert row["about"] == "row_orders:2"
        enqueue_many(session, [row])  # no registry: the row itself says what it is about
    assert run_until_empty(shop, registry).succeeded == 1
    assert shipped == [2]


def test_drain_of_a_session_refuses_a_row_argument_in_one_line(shop: Engine) -> None:
    registry = Registry()

    @registry.task
    def ship(order: Order) -> None: ...

    with Session(shop) as session:
        ship.defer(session, order_of(session))
        result = drain(session, registry)
        assert result.failed == 1
        ((_, reason),) = result.errors
        assert "a row argument is loaded in the handler's ctx.session()" in reason
        assert "\n" not in reason
        session.rollback()
    with Session(shop) as session:
        assert session.scalar(select(Order.status).where(Order.id == 1)) == "new"


def test_enqueue_many_rows_and_the_stored_json_form_take_a_row_too(shop: Engine) -> None:
    registry = Registry()
    shipped: list[int] = []

    @registry.task
    def ship(order: Order) -> None:
        shipped.append(order.id)

    stored = {"$row": "row_orders", "key": [2]}  # as `sqla-queue enqueue --app` passes it
    with Session(shop) as session, session.begin():
        enqueue_many(session, [ship.row(order_of(session))], registry=registry)
        enqueue(session, ship.name, {"order": stored}, registry=registry)
        session.flush()
        abouts = sorted(session.scalars(select(Job.about)))
    assert abouts == ["row_orders:1", "row_orders:2"]
    assert run_until_empty(shop, registry).succeeded == 2
    assert sorted(shipped) == [1, 2]


@pytest.mark.parametrize(
    ("source", "target", "shown"),
    [
        (Order, Customer, "source: Order, target: Customer"),
        (Order, Order | None, "source: Order, target: Order"),
        (Order | None, Customer | None, "source: Order, target: Customer"),
    ],
)
def test_a_task_taking_two_rows_is_refused_when_registered(
    source: object, target: object, shown: str
) -> None:
    registry = Registry()

    def transfer(source, target) -> None:  # type: ignore[no-untyped-def]
        raise AssertionError("never called")

    transfer.__annotations__ = {"source": source, "target": target, "return": None}
    with pytest.raises(ConfigurationError) as refused:
        registry.task(name="transfer")(transfer)
    why = str(refused.value)
    assert f"it takes 2 ORM rows ({shown})" in why
    assert "a job is about one row" in why
    assert "take the others by their key (target_id: int)" in why
    assert "transfer" not in registry


@pytest.mark.parametrize(
    ("annotation", "shown"),
    [
        (list[Order], "list[Order]"),
        (Order | Customer, "Order | Customer"),
        (dict[str, Order], "dict[str, Order]"),
        (tuple[Order, ...], "tuple[Order, ...]"),
    ],
)
def test_a_row_inside_another_type_is_refused_when_registered(
    annotation: object, shown: str
) -> None:
    # list[Order] or Order | Customer would be stored as it is, which no JSON holds, and the
    # job would be about none of its rows
    registry = Registry()

    def ship(orders) -> None:  # type: ignore[no-untyped-def]
        raise AssertionError("never called")

    ship.__annotations__ = {"orders": annotation, "return": None}
    with pytest.raises(ConfigurationError) as refused:
        registry.task(name="ship")(ship)
    why = str(refused.value)
    assert f"its parameter 'orders' takes {shown}: " in why
    assert "a row parameter is one row, `Order` or `Order | None`" in why
    assert "take the others by their key (orders_ids: list[int])" in why
    assert "ship" not in registry


def test_two_rows_known_only_at_first_use_are_refused_then_and_never_loaded(
    shop: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Registry()
    calls: list[object] = []

    def transfer(source, target) -> None:  # type: ignore[no-untyped-def]
        calls.append((source, target))

    # forward references to classes defined after the task: checked at first use instead
    transfer.__annotations__ = {"source": "LaterOrder", "target": "LaterCustomer"}
    task = registry.task(name="transfer")(transfer)
    monkeypatch.setitem(globals(), "LaterOrder", Order)
    monkeypatch.setitem(globals(), "LaterCustomer", Customer)
    forged = {
        "source": {"$row": "row_orders", "key": [1]},
        "target": {"$row": "row_customers", "key": [1]},
    }
    with Session(shop) as session, session.begin():
        with pytest.raises(ConfigurationError, match="it takes 2 ORM rows"):
            task.defer(session, order_of(session), session.get_one(Customer, 1))
        job = enqueue(session, "transfer", forged, about="row_orders:1")  # no registry
        session.flush()
        job_id = job.id
    stats = run_until_empty(shop, registry)
    job = stored_job(shop, job_id)
    assert calls == []
    assert stats.failed == 1
    assert (job.status, job.attempts) == ("failed", 1)  # never retried
    assert "cannot be a task's: it takes 2 ORM rows" in (job.last_error or "")


def test_a_reference_in_a_parameter_that_takes_no_row_is_passed_as_it_is(
    shop: Engine,
) -> None:
    registry = Registry()
    seen: list[object] = []

    @registry.task
    def ship(order: Order, note: dict[str, Any]) -> None:
        seen.append((order.id, note))

    forged = {"$row": "row_orders", "key": [2]}
    with Session(shop) as session, session.begin():
        ship.defer(session, order_of(session), forged)
    assert run_until_empty(shop, registry).succeeded == 1
    assert seen == [(1, forged)]  # only the row parameter loads; the dict stays a dict
