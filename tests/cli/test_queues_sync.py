"""`sqla-queue queues sync --app`: the queues a registry's tasks name, diffed against the
database's, created only with --yes."""

from __future__ import annotations

from helpers.support import cli
from sqlalchemy import Engine

from sqla_queue import admin

APP = "helpers.apps.typed_app:registry"


def names(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(info.name for info in admin.list_queues(conn))


def test_sync_shows_the_diff_then_creates_with_yes(engine: Engine, database_url: str) -> None:
    assert "emails" not in names(engine)
    diff = cli("queues", "sync", "--app", APP, url=database_url)
    assert diff.exit_code == 0, diff.output
    assert diff.stdout.splitlines() == [
        "+ emails",
        "1 queue(s) to create: run again with --yes to create them",
    ]
    assert "emails" not in names(engine)
    done = cli("queues", "sync", "--app", APP, "--yes", url=database_url)
    assert done.exit_code == 0, done.output
    assert "created 1 queue(s)" in done.stdout
    assert "emails" in names(engine)
    again = cli("queues", "sync", "--app", APP, url=database_url)
    assert again.stdout.strip() == "every queue its tasks name exists (emails)"
