"""What every `sqla-queue` command shares: the database option and the friendly errors,
applied once by `Command` and `Group`, and the helpers commands use to reach the database
and print."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from sqla_queue.db.database import URL_ENV_VAR, create_queue_engine, resolve_url
from sqla_queue.errors import SqlaQueueError

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C")

log = logging.getLogger("sqla_queue.cli")

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"], case_sensitive=False)


def _group_database_url(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A URL given on the command wins; else one given to `sqla-queue` itself; else the env."""
    source = ctx.get_parameter_source(param.name or "")
    given_to_group = (ctx.find_root().obj or {}).get("database_url")
    if given_to_group and source is not click.core.ParameterSource.COMMANDLINE:
        return given_to_group
    return value


def database_url_option() -> click.Option:
    """The `--database-url` every command that uses the database takes."""
    return click.Option(
        ["--database-url"],
        envvar=URL_ENV_VAR,
        show_envvar=True,
        callback=_group_database_url,
        help="PostgreSQL URL (also accepted before the command: sqla-queue --database-url URL "
        "stats). Without one, an embedded server is started (sqla-queue[embedded]).",
    )


def one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Turn our errors and connection failures into one line on stderr and exit status 1."""
    try:
        yield
    except SqlaQueueError as exc:
        raise click.ClickException(str(exc)) from None
    except OperationalError as exc:
        raise click.ClickException(f"cannot use the database: {one_line(exc)}") from None
    except DBAPIError as exc:
        raise click.ClickException(f"database error: {one_line(exc)}") from None
    except Exception as exc:
        if not _is_alembic_error(exc):
            raise
        raise click.ClickException(f"migration failed: {one_line(exc)}") from None


def _is_alembic_error(exc: Exception) -> bool:
    """Whether `exc` is Alembic's `CommandError`, or its `RevisionError` (an unknown
    revision, asked of its script directory): only a command that imported Alembic can
    raise one, so a command that did not (and `--help`) never imports it to ask."""
    alembic_util = sys.modules.get("alembic.util")
    if alembic_util is not None and isinstance(exc, alembic_util.CommandError):
        return True
    revisions = sys.modules.get("alembic.script.revision")
    return revisions is not None and isinstance(exc, revisions.RevisionError)


class Command(click.Command):
    """A `sqla-queue` command: takes `--database-url` first (unless `database=False`) and
    reports our errors and database failures as one line (see `friendly_errors`)."""

    def __init__(self, *args: Any, database: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if database:
            self.params.insert(0, database_url_option())

    def invoke(self, ctx: click.Context) -> Any:
        with friendly_errors():
            return super().invoke(ctx)


class Group(click.Group):
    """A command group whose commands are `Command`s and whose subgroups are `Group`s."""

    command_class = Command
    group_class = type


class LazyGroup(Group):
    """The `sqla-queue` group: a command's module is imported when the command is used,
    not before (so `sqla-queue --help` imports no worker, broker or dashboard module).

    `lazy`: each command's name -> `(module:attribute, summary)`; the summary is the first
    sentence of its help, which `--help` lists for a command not yet imported (a test holds
    each to its command's own help). `commands[name]` imports the command."""

    def __init__(self, *args: Any, lazy: Mapping[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy
        self.lazy_commands = LazyCommands(lazy, self.commands)
        self.commands = self.lazy_commands
        self._summaries = False

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if self._summaries and cmd_name in self.lazy and not self.lazy_commands.loaded(cmd_name):
            # listed by --help: a stand-in whose help is the summary, its module not imported
            return click.Command(cmd_name, help=self.lazy[cmd_name][1])
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._summaries = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._summaries = False


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands by name, the lazy ones' included; looking one up imports its
    module (`name in commands` does not)."""

    def __init__(
        self, lazy: Mapping[str, tuple[str, str]], loaded: Mapping[str, click.Command]
    ) -> None:
        self._lazy = dict(lazy)
        self._loaded = dict(loaded)

    def loaded(self, name: str) -> bool:
        """Whether the command `name` is imported."""
        return name in self._loaded

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            module, _, attribute = self._lazy[name][0].partition(":")  # KeyError: no such
            self._loaded[name] = getattr(importlib.import_module(module), attribute)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if self._lazy.pop(name, None) is None and name not in self._loaded:
            raise KeyError(name)
        self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self._lazy), **dict.fromkeys(self._loaded)})

    def __len__(self) -> int:
        return len(self._lazy.keys() | self._loaded.keys())


def config_default(config: type, name: str) -> Any:
    """The default of a config dataclass' field: a command's defaults are its API's own."""
    (found,) = [f for f in dataclasses.fields(config) if f.name == name]
    return found.default


def config_from(config: Callable[..., C], **given: Any) -> C:
    """`config(...)` of the running command's parameters named as its fields (a command's
    options are its API's own), `given` added or in their place."""
    fields = {f.name for f in dataclasses.fields(config) if f.init}  # type: ignore[arg-type]
    params = click.get_current_context().params
    return config(**{name: params[name] for name in fields & params.keys()} | given)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (PostgreSQL's jsonb cannot store it)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf, which jsonb cannot store either
        raise ValueError(f"{text} is too large for a JSON number PostgreSQL's jsonb stores")
    return value


def json_option(text: str, option: str) -> Any:
    """`text` as JSON, or a usage error naming `option` (NaN, Infinity and 1e999 refused)."""
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise click.BadParameter(f"not valid JSON ({exc})", param_hint=option) from None


def engine(database_url: str | None, application_name: str | None = None, **kwargs: Any) -> Engine:
    url = resolved_url(database_url)
    # Names the sessions in pg_stat_activity; an application_name in the URL wins.
    if application_name and "application_name" not in make_url(url).query:
        kwargs["connect_args"] = {
            **kwargs.get("connect_args", {}),
            "application_name": application_name,
        }
    return create_queue_engine(url, **kwargs)


def resolved_url(database_url: str | None) -> str:
    url, source = resolve_url(database_url)
    if source == "embedded":
        from sqla_queue.db.database import embedded_url

        click.echo(
            f"using the embedded PostgreSQL at {embedded_url()} "
            f"(pass --database-url or set {URL_ENV_VAR} to use your own)",
            err=True,
        )
    return url


@contextmanager
def transaction(database_url: str | None, check: bool = True) -> Iterator[Connection]:
    queue_engine = engine(database_url)
    try:
        with queue_engine.begin() as conn:
            if check:
                from sqla_queue.db.migrate import check_schema

                check_schema(conn)
            yield conn
    finally:
        queue_engine.dispose()


def configure_logging(level: str, log_format: str = "text") -> None:
    from sqla_queue.contrib.logs import configure_logging as configure

    configure(level, log_format)


def log_level_option(func: F) -> F:
    return click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True)(func)


def log_format_option(func: F) -> F:
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default=None,
        envvar="SQLA_QUEUE_LOG_FORMAT",
        show_envvar=True,
        help="Log records as human-readable text (default) or one JSON object per line.",
    )(func)


def app_registry(app_path: str) -> Any:
    """The registry `--app pkg.module:name` names, found from the current folder as well."""
    import sys

    from sqla_queue.errors import AppLoadError
    from sqla_queue.registry import load_registry

    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, "")
    try:
        return load_registry(app_path)
    except AppLoadError as exc:
        if exc.raised is not None:  # the application's own bug: where, always
            click.echo(import_traceback(app_path, exc.raised), err=True, nl=False)
        elif exc.__cause__ is not None:  # --log-level debug: the whole traceback
            log.debug("loading %s failed", app_path, exc_info=exc.__cause__)
        raise


def import_traceback(app_path: str, raised: BaseException) -> str:
    """The traceback of `raised`, raised while importing `--app app_path`, from the
    application's module on (the import machinery's frames before it left out)."""
    import importlib
    import os
    import traceback

    import sqla_queue

    machinery = tuple(
        os.path.dirname(module.__file__ or "") + os.sep for module in (importlib, sqla_queue)
    )
    found = traceback.TracebackException.from_exception(raised)
    frames = list(found.stack)
    while frames and frames[0].filename.startswith(("<frozen ", *machinery)):
        del frames[0]  # the import's way in, before the application's module
    found.stack = traceback.StackSummary.from_list(frames)
    return f"Importing --app {app_path} raised:\n" + "".join(found.format())


def print_table(table: Any) -> None:
    """A rich table on stdout: fitted to a terminal; piped, never cut short (a task name
    of any length stays on its line, for `| grep`)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=PIPED_WIDTH)
    console.print(table)


PIPED_WIDTH = 100_000
"""Columns of a table printed to a pipe: wider than any row, so none is wrapped or cut."""


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))
