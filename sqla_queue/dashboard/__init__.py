"""The web dashboard: see queues, jobs, workers and doctor's findings; retry, cancel, delete
jobs and pause queues. Needs the `dashboard` extra (`pip install 'sqla-queue[dashboard]'`).

`create_app(engine)` is a Starlette (ASGI) app: serve it with `sqla-queue dashboard`, or
mount it in FastAPI/Starlette (`app.mount("/queue", create_app(engine))`). `wsgi_app(...)`
is the same app for Flask and other WSGI servers (through a2wsgi). Pages are rendered on
the server (Jinja2, escaped); htmx, vendored under static/, refreshes the counts.

The modules: `app` (the two factories), `pages` (the `Dashboard`: pages and actions),
`security` (credentials, CSRF, notice proofs, headers), `rendering` (templates, filters,
charts), `reads` and `params` (what the pages read, and their checked inputs).
"""

from __future__ import annotations

try:  # every module of the package needs the extra: say so once, before any of them loads
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the dashboard needs its extra: pip install 'sqla-queue[dashboard]'") from exc

from sqla_queue.dashboard.app import create_app, wsgi_app
from sqla_queue.dashboard.pages import Dashboard
from sqla_queue.dashboard.security import Auth, check_exposure, is_loopback

__all__ = ["Auth", "Dashboard", "check_exposure", "create_app", "is_loopback", "wsgi_app"]
