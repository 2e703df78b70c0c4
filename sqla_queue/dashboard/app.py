"""The dashboard as an application: `create_app` (ASGI, Starlette) and `wsgi_app` (WSGI,
through a2wsgi), over an engine or a database URL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from starlette.applications import Starlette

from .pages import Dashboard
from .security import Auth


def create_app(
    engine: Engine | str,
    *,
    read_only: bool = False,
    auth: Auth | str | None = None,
    poll_seconds: float = 2.0,
) -> Starlette:
    """The dashboard as an ASGI app over `engine` (or a database URL)."""
    if isinstance(engine, str):
        from sqla_queue.database import create_queue_engine

        engine = create_queue_engine(engine, pool_size=4, max_overflow=4)
    return Dashboard(engine, read_only=read_only, auth=auth, poll_seconds=poll_seconds).app


def wsgi_app(
    engine: Engine | str,
    *,
    read_only: bool = False,
    auth: Auth | str | None = None,
    poll_seconds: float = 2.0,
) -> Any:
    """The dashboard as a WSGI app (Flask: `DispatcherMiddleware(app.wsgi_app, {"/queue":
    wsgi_app(engine)})`)."""
    from a2wsgi import ASGIMiddleware

    asgi = create_app(engine, read_only=read_only, auth=auth, poll_seconds=poll_seconds)
    return ASGIMiddleware(asgi)  # type: ignore[arg-type]
