"""examples/README.md's "Run one against your own database", step by step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from sqla_queue.db.database import URL_ENV_VAR
from sqla_queue.testing import assert_enqueued

from .fastapi_app.app import create_app as create_fastapi_app
from .flask_app.app import create_app as create_flask_app
from .flask_app.app import db

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_apps_answer_once_their_tables_are_created_as_the_readme_says(
    sqla_queue_engine: Engine,
) -> None:
    url = sqla_queue_engine.url.render_as_string(hide_password=False)
    subprocess.run(
        [sys.executable, "-m", "examples.create_tables"],
        cwd=REPO_ROOT,
        env={**os.environ, URL_ENV_VAR: url},
        check=True,
        timeout=120,
    )
    flask_app = create_flask_app(url)
    with flask_app.app_context():
        response = flask_app.test_client().post("/signup", json={"email": "ada@example.com"})
        assert response.status_code == 201
        db.session.remove()
        db.engine.dispose()
    with TestClient(create_fastapi_app(url)) as client:
        response = client.post("/orders", json={"email": "ada@example.com", "total": 12.5})
        assert response.status_code == 201
    assert_enqueued(sqla_queue_engine, task="flask_app.send_welcome", count=1)
    assert_enqueued(sqla_queue_engine, task="fastapi_app.send_receipt", count=1)
