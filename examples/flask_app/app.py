"""A Flask app with Flask-SQLAlchemy: the signup and its welcome job commit together.

SQLA_QUEUE_DATABASE_URL=postgresql://... flask --app examples.flask_app.app run
sqla-queue worker --app examples.flask_app.tasks:registry
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_queue import enqueue
from sqla_queue.db.database import normalize_url


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class User(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "flask_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(Text, unique=True)
    welcomed: Mapped[bool] = mapped_column(default=False)


def create_app(database_url: str | None = None) -> Flask:
    """The app on `database_url` (default: SQLA_QUEUE_DATABASE_URL)."""
    app = Flask(__name__)
    url = database_url or os.environ["SQLA_QUEUE_DATABASE_URL"]
    app.config["SQLALCHEMY_DATABASE_URI"] = normalize_url(url)
    db.init_app(app)

    @app.post("/signup")
    def signup() -> tuple[dict[str, Any], int]:
        email = (request.get_json(silent=True) or {}).get("email")
        if not email or "@" not in email:
            abort(400, "an email address is required")
        user = User(email=email)
        db.session.add(user)
        db.session.flush()
        enqueue(db.session, "flask_app.send_welcome", {"user_id": user.id})
        db.session.commit()  # the user and the welcome job, or neither
        return {"id": user.id}, 201

    return app
