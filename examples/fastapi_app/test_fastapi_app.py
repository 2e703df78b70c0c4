"""The FastAPI example's tests, written the way its users would, with sqla-queue's plugin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sqla_queue.testing import assert_enqueued, assert_not_enqueued, run_until_empty

from .app import create_app
from .models import Base, Order
from .tasks import registry, send_receipt


@pytest.fixture
def engine(sqla_queue_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A database of the test's own, with the app's table; the task reads its URL."""
    Base.metadata.create_all(sqla_queue_engine)
    url = sqla_queue_engine.url.render_as_string(hide_password=False)
    monkeypatch.setenv("SQLA_QUEUE_DATABASE_URL", url)
    return sqla_queue_engine


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine.url.render_as_string(hide_password=False))) as client:
        yield client


def test_an_order_and_its_receipt_job_commit_together(client: TestClient, engine: Engine) -> None:
    response = client.post("/orders", json={"email": "ada@example.com", "total": 12.5})
    assert response.status_code == 201
    order_id = response.json()["id"]
    assert_enqueued(engine, task=send_receipt, args={"order_id": order_id}, count=1)


def test_a_rejected_order_leaves_neither_order_nor_job(client: TestClient, engine: Engine) -> None:
    response = client.post("/orders", json={"email": "bob@example.com", "total": 0})
    assert response.status_code == 422
    assert_not_enqueued(engine, status=None)
    with Session(engine) as session:
        assert session.scalars(select(Order)).all() == []


def test_a_worker_runs_the_async_job_and_sends_the_receipt(
    client: TestClient, engine: Engine
) -> None:
    order_id = client.post("/orders", json={"email": "ada@example.com", "total": 5}).json()["id"]
    stats = run_until_empty(engine, registry)  # the real worker, in burst mode
    assert (stats.claimed, stats.succeeded, stats.failed) == (1, 1, 0)
    with Session(engine) as session:
        assert session.get_one(Order, order_id).receipt_sent is True
    assert_not_enqueued(engine, status=None)  # done, and deleted by the default retention
