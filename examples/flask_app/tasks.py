"""The Flask example's background task: it runs inside an application context.

sqla-queue worker --app examples.flask_app.tasks:registry
"""

from __future__ import annotations

from flask import Flask, current_app, has_app_context

from sqla_queue import Registry

from .app import User, create_app, db

registry = Registry()
_worker_app: list[Flask] = []


def _app() -> Flask:
    """The current app (tests, `drain` inside an app context), else one made for the worker."""
    if has_app_context():
        return current_app._get_current_object()  # type: ignore[attr-defined,no-any-return]
    if not _worker_app:
        _worker_app.append(create_app())
    return _worker_app[0]


@registry.task(name="flask_app.send_welcome", max_attempts=3)
def send_welcome(user_id: int) -> None:
    """Pretend to send the welcome mail, then record it."""
    with _app().app_context():
        user = db.session.get_one(User, user_id)
        user.welcomed = True
        db.session.commit()
