"""What the dashboard tests share: a client over the test database, its CSRF field, jobs that
really failed."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine
from starlette.testclient import TestClient

from helpers.support import enqueue_jobs, jobs_by_id
from sqla_queue import Registry, admin
from sqla_queue.dashboard import create_app
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import WorkerConfig


def client(engine: Engine, **options: Any) -> TestClient:
    return TestClient(create_app(engine, **options))


API_ADMIN = {"Authorization": "Bearer meets"}
"""The bearer header of `api_action`'s admin token."""


def api_action(engine: Engine, action: str, **body: Any) -> dict[str, Any]:
    """`POST /api/jobs/{action}` with an admin token; the answer's JSON (200 asserted)."""
    answer = client(engine, api_tokens="meets:admin").post(
        f"/api/jobs/{action}", json=body, headers=API_ADMIN
    )
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


def failing_registry(message: str = "boom") -> Registry:
    registry = Registry()

    @registry.task(name="fails", max_attempts=1)
    def fails(**_: Any) -> None:
        raise RuntimeError(message)

    return registry


def make_failed(engine: Engine, count: int = 1, message: str = "boom", **args: Any) -> list[int]:
    """Jobs that really failed in a worker (their last_error is the handler's traceback)."""
    ids = enqueue_jobs(engine, "fails", count, args=args, max_attempts=1)
    run_until_empty(engine, failing_registry(message), WorkerConfig(poll_only=True))
    assert {job.status for job in jobs_by_id(engine, ids).values()} == {"failed"}
    return ids


def new_queue(engine: Engine, name: str) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, name)
