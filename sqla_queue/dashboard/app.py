"""The dashboard as an application: `create_app` (ASGI, Starlette) and `wsgi_app` (WSGI,
through a2wsgi), over an engine or a database URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from starlette.applications import Starlette

from sqla_queue.dashboard.pages import Dashboard, DashboardOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack


def create_app(engine: Engine | str, **options: Unpack[DashboardOptions]) -> Starlette:
    """The dashboard as an ASGI app over `engine` (or a database URL); `options` are those of
    `Dashboard` (`read_only`, `auth`, `poll_seconds`)."""
    if isinstance(engine, str):
        from sqla_queue.db.database import create_queue_engine

        engine = create_queue_engine(engine, pool_size=4, max_overflow=4)
    return Dashboard(engine, **options).app


def wsgi_app(engine: Engine | str, **options: Unpack[DashboardOptions]) -> Any:
    """The dashboard as a WSGI app (Flask: `DispatcherMiddleware(app.wsgi_app, {"/queue":
    wsgi_app(engine)})`); `options` as for `create_app`."""
    from a2wsgi import ASGIMiddleware

    asgi = create_app(engine, **options)
    return ASGIMiddleware(asgi)  # type: ignore[arg-type]
