"""Where ORM row arguments meet the other features (tests/system/pairs.toml, `rows`): drain,
routed queues, durable steps, sleeps and signals (the row loaded again for each run, its
policy checked again), start deadlines, the HTTP API, unique keys and enqueue_many."""

from __future__ import annotations

import datetime as dt

import pytest
from helpers.dashboard_kit import api_action
from helpers.row_models import Invoice, Order, make_shop, order_of, stored_job
from helpers.support import end_sleeps, make_due, record_run, signal_now, statuses
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    JobContext,
    Registry,
    RetryPolicy,
    Unique,
    Worker,
    WorkerConfig,
    admin,
    enqueue_many,
    wait_for,
)
from sqla_queue.orm import jobs_of
from sqla_queue.testing import drain

NO_WAIT = RetryPolicy(base=0.0, jitter=0.0)


@pytest.fixture
def shop(engine: Engine) -> Engine:
    return make_shop(engine)


def _delete_order(engine: Engine, order_id: int = 1) -> None:
    with Session(engine) as session, session.begin():
        session.delete(order_of(session, order_id))


def test_drain_of_an_engine_loads_the_row_in_the_handlers_session(shop: Engine) -> None:
    registry = Registry()

    @registry.task(pass_context=True)
    def ship(ctx: JobContext, order: Order) -> None:
        with ctx.session() as session:
            order.status = "shipped"
            session.commit()

    with Session(shop) as session, session.begin():
        ship.defer(session, order_of(session))
    assert drain(shop, registry).succeeded == 1
    with Session(shop) as session:
        assert order_of(session).status == "shipped"


def test_a_row_argument_is_refused_on_a_routed_queue_and_the_transaction_goes_on(
    shop: Engine,
) -> None:
    registry = Registry()

    @registry.task(name="relayed_row", queue="out")
    def relayed(order: Order) -> None: ...

    with shop.begin() as conn:
        admin.create_queue(conn, "out")
        admin.set_route(conn, "out", "nats:jobs.out")
    with Session(shop) as session:
        with pytest.raises(InvalidJobError) as raised:
            relayed.defer(session, order_of(session))
        with shop.connect() as conn, pytest.raises(InvalidJobError):
            relayed.defer(conn, order_of(session))
        with pytest.raises(InvalidJobError):
            enqueue_many(session, [relayed.row(order_of(session))])
        session.commit()
    assert "a row argument cannot be loaded" in str(raised.value)
    assert "pass the row's id instead of the row" in str(raised.value)
    assert statuses(shop) == {}


def test_a_retry_that_replays_its_steps_loads_the_row_again(shop: Engine) -> None:
    registry = Registry()
    seen: list[str] = []
    charged: list[int] = []

    @registry.task(pass_context=True, retry=NO_WAIT, max_attempts=3)
    def charge(ctx: JobContext, order: Order) -> None:
        seen.append(order.status)
        ctx.step("charge", charged.append, order.id)
        if ctx.attempt == 1:
            with Session(ctx.resources["engine"]) as other, other.begin():
                order_of(other).status = "charged"
            raise RuntimeError("the receipt failed")

    registry.resources["engine"] = shop
    with Session(shop) as session, session.begin():
        charge.defer(session, order_of(session))
    drain(shop, registry, include_scheduled=True)
    assert seen == ["new", "charged"]  # the second run loads the row as it is then
    assert charged == [1]


def test_a_row_deleted_during_a_sleep_cancels_the_job_when_it_wakes(shop: Engine) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task(pass_context=True)
    def remind(ctx: JobContext, order: Order) -> None:
        runs.append(order.id)
        ctx.sleep(dt.timedelta(hours=1), name="cool-off")

    with Session(shop) as session, session.begin():
        job = remind.defer(session, order_of(session))
        session.flush()
        job_id = job.id
    drain(shop, registry)  # sleeps
    _delete_order(shop)
    end_sleeps(shop)
    make_due(shop)
    drain(shop, registry, include_scheduled=True)
    assert runs == [1]
    job = stored_job(shop, job_id)
    assert (job.status, job.last_error) == ("cancelled", "row_orders 1 is gone")


def test_a_job_woken_by_a_signal_gets_its_row_again(shop: Engine) -> None:
    registry = Registry()
    seen: list[tuple[str, object]] = []

    @registry.task(pass_context=True)
    def await_payment(ctx: JobContext, order: Order) -> None:
        paid = ctx.wait_for_signal(f"paid:{order.id}", timeout=dt.timedelta(days=1))
        seen.append((order.status, paid))

    with Session(shop) as session, session.begin():
        await_payment.defer(session, order_of(session))
    assert drain(shop, registry).waiting == 1
    with Session(shop) as session, session.begin():
        order_of(session).status = "paid"
    assert signal_now(shop, "paid:1", {"amount": 5}) == 1
    assert drain(shop, registry).succeeded == 1
    assert seen == [("paid", {"amount": 5})]


def test_an_expired_job_taking_a_row_is_cancelled_as_expired_without_a_load(
    shop: Engine,
) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task
    def ship(order: Order) -> None:
        runs.append(order.id)

    with Session(shop) as session, session.begin():
        job = ship.using(expires_in=60).defer(session, order_of(session))
        session.flush()
        job_id = job.id
    with shop.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET expires_at = now() - interval '1 s'"))
    drain(shop, registry)
    assert runs == []
    job = stored_job(shop, job_id)
    assert (job.status, job.last_error) == ("cancelled", "expired")


def test_the_api_retries_a_job_cancelled_for_a_gone_row_once_the_row_is_back(
    shop: Engine,
) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task
    def ship(order: Order) -> None:
        runs.append(order.id)

    with Session(shop) as session, session.begin():
        job = ship.defer(session, order_of(session))
        session.flush()
        job_id = job.id
    _delete_order(shop)
    drain(shop, registry)
    assert stored_job(shop, job_id).status == "cancelled"
    with Session(shop) as session, session.begin():
        session.add(Order(id=1))
    assert api_action(shop, "retry", ids=[job_id])
    assert drain(shop, registry).succeeded == 1
    assert runs == [1]


def test_a_unique_job_about_a_row_takes_the_row_and_is_one_per_row(shop: Engine) -> None:
    registry = Registry()

    @registry.task(unique=True)
    def ship(order: Order) -> None: ...

    with Session(shop) as session, session.begin():
        first = ship.defer(session, order_of(session))
        again = ship.defer(session, order_of(session))
        other = ship.defer(session, order_of(session, 2))
        assert again.duplicate
        assert again.id == first.id
        assert not other.duplicate
        assert first.about == "row_orders:1"


def test_debounce_replaces_the_row_and_the_job_is_about_the_new_one(shop: Engine) -> None:
    registry = Registry()
    shipped: list[int] = []

    @registry.task(unique=Unique(args=[], on_conflict="replace_args"))
    def ship(order: Order) -> None:
        shipped.append(order.id)

    with Session(shop) as session, session.begin():
        first = ship.defer(session, order_of(session))
        ship.defer(session, order_of(session, 2))
        job_id = first.id
    assert stored_job(shop, job_id).about == "row_orders:2"
    assert drain(shop, registry).succeeded == 1
    assert shipped == [2]


def test_a_chain_passes_rows_and_a_kept_result_comes_back(shop: Engine) -> None:
    registry = Registry()

    @registry.task(keep_result=True)
    def total(order: Order) -> str:
        return f"{order.id}:{order.status}"

    from sqla_queue.enqueue.workflows import chain

    with Session(shop) as session, session.begin():
        handle = chain(total.s(order=order_of(session)), total.s(order=order_of(session, 2)))
        ids = handle.enqueue(session, registry=registry).job_ids
    assert drain(shop, registry).succeeded == 2
    assert [wait_for(shop, job_id, timeout=10) for job_id in ids] == ["1:new", "2:new"]
    assert [stored_job(shop, job_id).about for job_id in ids] == ["row_orders:1", "row_orders:2"]


def test_a_timed_task_gets_its_row_and_its_timeout_covers_the_handler(shop: Engine) -> None:
    registry = Registry()
    seen: list[int] = []

    @registry.task(timeout=30)
    def ship(order: Order) -> None:
        seen.append(order.id)

    with Session(shop) as session, session.begin():
        ship.defer(session, order_of(session))
    assert drain(shop, registry).succeeded == 1
    assert seen == [1]


def test_deleting_a_has_jobs_row_cancels_the_queued_jobs_that_take_it(shop: Engine) -> None:
    registry = Registry()

    @registry.task
    def send(invoice: Invoice) -> None: ...

    with Session(shop) as session, session.begin():
        job = send.defer(session, session.get_one(Invoice, 1))
        session.flush()
        job_id = job.id
        assert jobs_of(session, session.get_one(Invoice, 1)) == [job]
    with Session(shop) as session, session.begin():
        session.delete(session.get_one(Invoice, 1))
    job = stored_job(shop, job_id)
    assert job.status == "cancelled"
    assert job.last_error == "cancelled: row_invoices:1, the row it was about, was deleted"


def test_a_periodic_task_takes_a_row_fixed_at_registration(shop: Engine) -> None:
    registry = Registry()
    seen: list[str] = []

    @registry.periodic(every=dt.timedelta(hours=1), name="row_hourly", args={"order": Order(id=2)})
    def row_hourly(order: Order) -> None:
        seen.append(f"{order.id}:{order.status}")

    last = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    record_run(shop, "row_hourly", last - dt.timedelta(hours=2))
    stats = Worker(shop, registry, WorkerConfig(burst=True, poll_only=True)).run()
    assert stats.succeeded == 1
    assert seen == ["2:new"]


def test_a_queue_holding_jobs_that_take_rows_cannot_be_routed(shop: Engine) -> None:
    registry = Registry()

    @registry.task(name="to_route", queue="later_out")
    def ship(order: Order) -> None: ...

    with shop.begin() as conn:
        admin.create_queue(conn, "later_out")
    with Session(shop) as session, session.begin():
        ship.defer(session, order_of(session))
    with shop.begin() as conn, pytest.raises(ConfigurationError) as refused:
        admin.set_route(conn, "later_out", "nats:jobs.out")
    assert "it has 1 job(s) with a row argument queued or running" in str(refused.value)
