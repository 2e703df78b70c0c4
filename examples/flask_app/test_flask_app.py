"""The Flask example's tests, with sqla-queue's plugin: a database per test, drain, inline."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from sqla_queue.testing import DrainResult, assert_enqueued, assert_not_enqueued, drain, inline

from .app import User, create_app, db
from .tasks import registry


@pytest.fixture
def app(sqla_queue_database_url: str) -> Iterator[Flask]:
    app = create_app(sqla_queue_database_url)
    with app.app_context():
        db.create_all()
        yield app
        db.session.remove()
        db.engine.dispose()  # so the test's database can be dropped


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def test_signup_enqueues_the_welcome_mail_with_the_user(client: FlaskClient) -> None:
    response = client.post("/signup", json={"email": "ada@example.com"})
    assert response.status_code == 201
    assert_enqueued(db.engine, task="flask_app.send_welcome", args={"user_id": response.json["id"]})


def test_a_refused_signup_enqueues_nothing(client: FlaskClient) -> None:
    assert client.post("/signup", json={"email": "nobody"}).status_code == 400
    assert_not_enqueued(db.engine, status=None)


def test_drain_sends_the_welcome_mail(client: FlaskClient) -> None:
    user_id = client.post("/signup", json={"email": "ada@example.com"}).json["id"]
    assert drain(db.engine, registry) == DrainResult(succeeded=1)
    assert db.session.get_one(User, user_id).welcomed is True


def test_inline_mode_welcomes_during_the_request(client: FlaskClient) -> None:
    with inline(registry) as runs:
        client.post("/signup", json={"email": "grace@example.com"})
        client.post("/signup", json={"email": "alan@example.com"})
    assert runs == DrainResult(succeeded=2)
    welcomed = db.session.scalars(select(User.email).where(User.welcomed)).all()
    assert sorted(welcomed) == ["alan@example.com", "grace@example.com"]
