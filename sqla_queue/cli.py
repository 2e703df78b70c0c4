"""`sqla-queue`: migrate, run workers, enqueue, manage queues, look at the queue."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, TypeVar

import click
from alembic.util import CommandError as AlembicCommandError
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from . import admin
from .bounds import (
    JOB_ID,
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_PROCESSES,
    MAX_WORKER_CONCURRENCY,
    PORT,
    count,
)
from .database import URL_ENV_VAR, create_queue_engine, resolve_url
from .durations import DURATION, RATE
from .errors import SqlaQueueError
from .models import PRIORITY_MAX, JobStatus, Retention

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("sqla_queue.cli")

WORKER_APPLICATION_NAME = "sqla-queue worker"


def _database_option(func: F) -> F:
    return click.option(
        "--database-url",
        envvar=URL_ENV_VAR,
        show_envvar=True,
        callback=_group_database_url,
        help="PostgreSQL URL (also accepted before the command: sqla-queue --database-url URL "
        "stats). Without one, an embedded server is started (sqla-queue[embedded]).",
    )(func)


def _group_database_url(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A URL given on the command wins; else one given to `sqla-queue` itself; else the env."""
    source = ctx.get_parameter_source(param.name or "")
    given_to_group = (ctx.find_root().obj or {}).get("database_url")
    if given_to_group and source is not click.core.ParameterSource.COMMANDLINE:
        return given_to_group
    return value


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _friendly_errors(func: F) -> F:
    """Turn our errors and connection failures into one line on stderr and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SqlaQueueError as exc:
            raise click.ClickException(str(exc)) from None
        except OperationalError as exc:
            raise click.ClickException(f"cannot use the database: {_one_line(exc)}") from None
        except DBAPIError as exc:
            raise click.ClickException(f"database error: {_one_line(exc)}") from None
        except AlembicCommandError as exc:
            raise click.ClickException(f"migration failed: {_one_line(exc)}") from None

    return wrapper  # type: ignore[return-value]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (PostgreSQL's jsonb cannot store it)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf, which jsonb cannot store either
        raise ValueError(f"{text} is too large for a JSON number PostgreSQL's jsonb stores")
    return value


def _json_option(text: str, option: str) -> Any:
    """`text` as JSON, or a usage error naming `option` (NaN, Infinity and 1e999 refused)."""
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise click.BadParameter(f"not valid JSON ({exc})", param_hint=option) from None


def _engine(database_url: str | None, application_name: str | None = None, **kwargs: Any) -> Engine:
    url = _resolved_url(database_url)
    # Names the sessions in pg_stat_activity; an application_name in the URL wins.
    if application_name and "application_name" not in make_url(url).query:
        kwargs["connect_args"] = {"application_name": application_name}
    return create_queue_engine(url, **kwargs)


def _resolved_url(database_url: str | None) -> str:
    url, source = resolve_url(database_url)
    if source == "embedded":
        from .database import embedded_url

        click.echo(
            f"using the embedded PostgreSQL at {embedded_url()} "
            f"(pass --database-url or set {URL_ENV_VAR} to use your own)",
            err=True,
        )
    return url


@contextmanager
def _transaction(database_url: str | None, check: bool = True) -> Iterator[Connection]:
    engine = _engine(database_url)
    try:
        with engine.begin() as conn:
            if check:
                from .migrate import check_schema

                check_schema(conn)
            yield conn
    finally:
        engine.dispose()


def _configure_logging(level: str, log_format: str = "text") -> None:
    from .logs import configure_logging

    configure_logging(level, log_format)


def _log_format_option(func: F) -> F:
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default=None,
        envvar="SQLA_QUEUE_LOG_FORMAT",
        show_envvar=True,
        help="Log records as human-readable text (default) or one JSON object per line.",
    )(func)


@click.group()
@click.version_option(package_name="sqla-queue")
@click.option(
    "--database-url",
    default=None,
    help=f"PostgreSQL URL for the command that follows (or its own --database-url, or "
    f"{URL_ENV_VAR}).",
)
@_log_format_option
@click.pass_context
def main(ctx: click.Context, database_url: str | None, log_format: str | None) -> None:
    """sqla-queue: a PostgreSQL job queue for SQLAlchemy applications."""
    ctx.obj = {"database_url": database_url, "log_format": log_format}
    if log_format == "json":  # every command's log records, as JSON lines on stderr
        _configure_logging("warning", log_format)


@main.command()
@_database_option
@click.option("--revision", default="sqla_queue@head", show_default=True)
@click.option(
    "--drop-queue-fk",
    is_flag=True,
    help="Also drop the jobs -> queues foreign key (opt-in revision): no MultiXact per "
    "enqueue when many sessions enqueue into one queue.",
)
@click.option(
    "--restore-queue-fk",
    is_flag=True,
    help="Restore the jobs -> queues foreign key (refused while jobs name missing queues).",
)
@click.option(
    "--stamp",
    is_flag=True,
    help="Record the revision the existing sqla_queue schema is at, without running anything "
    "(after its version table was lost).",
)
@_friendly_errors
def migrate(
    database_url: str | None,
    revision: str,
    drop_queue_fk: bool,
    restore_queue_fk: bool,
    stamp: bool,
) -> None:
    """Create or upgrade the sqla_queue schema (the package's own Alembic revisions)."""
    from . import migrate as migrations

    if drop_queue_fk and restore_queue_fk:
        raise click.UsageError("pass --drop-queue-fk or --restore-queue-fk, not both")
    engine = _engine(database_url)
    try:
        if stamp:
            click.echo(f"recorded revision {migrations.stamp(engine)} as applied")
            return
        migrations.upgrade(engine, revision)
        if drop_queue_fk:
            migrations.drop_queue_fk(engine)
        if restore_queue_fk:
            migrations.restore_queue_fk(engine)
        with engine.connect() as conn:
            click.echo(f"sqla_queue schema at revision {migrations.schema_revision(conn)}")
        if drop_queue_fk or restore_queue_fk:
            click.echo(f"queue foreign key {'dropped' if drop_queue_fk else 'in place'}")
    finally:
        engine.dispose()


def _worker_default(name: str) -> Any:
    """The default of a `WorkerConfig` field: the CLI's defaults are the worker's own."""
    from .worker import WorkerConfig

    (found,) = [f for f in dataclasses.fields(WorkerConfig) if f.name == name]
    return found.default


def _supervised_child_exits(func: F) -> F:
    """A worker started by `--processes` exits with a status of its own for a configuration
    error, so that its parent does not restart it again and again."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("supervised_slot") is None:
            return func(*args, **kwargs)
        from .supervisor import CONFIGURATION_ERRORS, exit_for_configuration_error

        try:
            return func(*args, **kwargs)
        except CONFIGURATION_ERRORS as exc:
            exit_for_configuration_error(exc)

    return wrapper  # type: ignore[return-value]


@main.command()
@_database_option
@click.option("--app", "app_path", required=True, help="The task registry, as pkg.module:name.")
@click.option("-q", "--queues", default=None, help="Comma-separated queues (default: all).")
@click.option(
    "-c",
    "--concurrency",
    type=count(1, MAX_WORKER_CONCURRENCY),
    default=_worker_default("concurrency"),
    show_default=True,
)
@click.option(
    "--batch",
    type=count(1, MAX_BATCH),
    default=_worker_default("batch"),
    show_default=True,
    help="Jobs per claim at most.",
)
@click.option(
    "--lease",
    type=DURATION,
    default=_worker_default("lease"),
    show_default=True,
    help="A job may go this long without a heartbeat before it is reaped (at least 1 s).",
)
@click.option(
    "--poll-interval",
    type=DURATION,
    default=_worker_default("poll_interval"),
    show_default=True,
    help="The longest wait between polls when no NOTIFY arrives.",
)
@click.option("--burst", is_flag=True, help="Exit when no job is due.")
@click.option("--poll-only", is_flag=True, help="No LISTEN (PgBouncer transaction pooling).")
@click.option(
    "--shutdown-timeout",
    type=DURATION,
    default=_worker_default("shutdown_timeout"),
    show_default=True,
    help="How long running handlers may finish after SIGTERM.",
)
@click.option(
    "--give-up-after",
    type=DURATION,
    default=None,
    help="How long to wait for an unreachable database before exiting with an error "
    "(default: forever; 30 s with --burst).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@_log_format_option
@click.option(
    "--metrics-port",
    type=PORT,
    default=None,
    help="Serve Prometheus metrics on this port (needs sqla-queue[metrics]).",
)
@click.option(
    "--from",
    "broker_url",
    default=None,
    help="Run the routed queue -q from its broker: nats://HOST:4222 or amqp://USER:PW@HOST/.",
)
@click.option(
    "--dedup/--no-dedup",
    default=None,
    help="With --from: skip job ids already run (default: on for amqp, off for nats).",
)
@click.option(
    "--processes",
    type=count(1, MAX_PROCESSES, what="a number of processes"),
    default=1,
    show_default=True,
    help="Worker processes under one supervising parent that restarts crashed ones "
    "(1: this process is the worker).",
)
@click.option(
    "--synchronous-commit/--no-synchronous-commit",
    default=_worker_default("synchronous_commit"),
    help="Whether the worker's own claims and finishes wait for the disk (default: no; "
    "a server crash then runs their jobs again, none is lost: docs/durability.md).",
)
@click.option("--supervised-slot", type=count(1, MAX_PROCESSES), default=None, hidden=True)
@click.pass_context
@_friendly_errors
@_supervised_child_exits
def worker(
    ctx: click.Context,
    database_url: str | None,
    app_path: str,
    queues: str | None,
    concurrency: int,
    batch: int,
    lease: float,
    poll_interval: float,
    burst: bool,
    poll_only: bool,
    shutdown_timeout: float,
    give_up_after: float | None,
    log_level: str,
    log_format: str | None,
    metrics_port: int | None,
    broker_url: str | None,
    dedup: bool | None,
    processes: int,
    supervised_slot: int | None,
    synchronous_commit: bool,
) -> None:
    """Run jobs until SIGTERM/SIGINT (a second signal exits at once), or, with --burst,
    until nothing is due. With --processes N, run N such workers under one parent."""
    from .registry import load_registry
    from .worker import Worker, WorkerConfig

    log_format = log_format or (ctx.find_root().obj or {}).get("log_format") or "text"
    _configure_logging(log_level, log_format)
    config = WorkerConfig(
        queues=[q.strip() for q in queues.split(",")] if queues is not None else None,
        concurrency=concurrency,
        batch=batch,
        lease=lease,
        poll_interval=poll_interval,
        burst=burst,
        poll_only=poll_only,
        shutdown_timeout=shutdown_timeout,
        give_up_after=give_up_after,
        synchronous_commit=synchronous_commit,
    )
    if metrics_port is not None and metrics_port + processes - 1 > 65535:
        raise click.BadParameter(
            f"with --processes {processes} the workers serve metrics on ports {metrics_port} "
            f"to {metrics_port + processes - 1}; the last must be at most 65535",
            param_hint="'--metrics-port'",
        )
    if processes > 1:
        sys.exit(_supervise_workers(ctx, processes, log_format))
    if supervised_slot is not None:
        from .supervisor import child_name, watch_parent

        watch_parent()
        config.worker_id = f"{config.worker_id}:{child_name(supervised_slot)}"
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, "")
    registry = load_registry(app_path)
    if log_format == "json":
        from .logs import log_jobs

        log_jobs(registry)
    if metrics_port is not None:
        from . import metrics

        metrics.instrument(registry)
        metrics.serve(metrics_port)
    if broker_url is not None:
        from .brokers.cli import run_broker_worker

        settings = (concurrency, lease, poll_interval, burst, shutdown_timeout, dedup)
        run_broker_worker(_engine(database_url), registry, broker_url, queues, *settings)
        _exit_past_stuck_handlers()
        return
    engine = _engine(
        database_url, application_name=WORKER_APPLICATION_NAME, pool_size=3, max_overflow=4
    )
    try:
        stats = Worker(engine, registry, config).run()
    finally:
        engine.dispose()
    if burst:
        done = f"done: {stats.succeeded} succeeded, {stats.retried} retried, {stats.failed} failed"
        if log_format == "json":  # stderr stays one JSON object per line
            log.warning(done, extra=dataclasses.asdict(stats))
        else:
            click.echo(done, err=True)
    _exit_past_stuck_handlers()


_PER_PARENT_OPTIONS = {"database_url", "processes", "supervised_slot", "log_format", "metrics_port"}
"""Options the parent of `--processes` does not pass on as given (see `_supervise_workers`)."""


def _supervise_workers(ctx: click.Context, processes: int, log_format: str) -> int:
    """Run `processes` workers as children, each a fresh `python -m sqla_queue worker` with
    this command's options; returns the parent's exit status. The URL travels in the
    environment (not on a command line, where `ps` shows passwords); child N serves its
    metrics on --metrics-port + N - 1."""
    from .supervisor import Supervisor

    env = dict(os.environ, **{URL_ENV_VAR: _resolved_url(ctx.params["database_url"])})
    given: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if not isinstance(param, click.Option) or name in _PER_PARENT_OPTIONS:
            continue
        if ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT:
            continue  # the child computes the same default
        given.extend(_option_arguments(param, ctx.params[name]))
    base = [sys.executable, "-m", "sqla_queue", "worker", *given, "--log-format", log_format]
    metrics_port = ctx.params["metrics_port"]
    commands = []
    for slot in range(1, processes + 1):
        slot_args = ["--supervised-slot", str(slot)]
        if metrics_port is not None:
            slot_args += ["--metrics-port", str(metrics_port + slot - 1)]
        commands.append([*base, *slot_args])
    return Supervisor(commands, burst=ctx.params["burst"], env=env).run()


def _option_arguments(option: click.Option, value: Any) -> list[str]:
    """The command-line arguments that give `option` the parsed `value` again."""
    if option.is_flag:
        if option.secondary_opts:
            return [option.opts[0] if value else option.secondary_opts[0]]
        return [option.opts[0]] if value else []
    if value is None:
        return []
    if isinstance(value, float):  # positional notation: DURATION refuses 1e-05
        return [option.opts[0], format(Decimal(repr(value)), "f")]
    return [option.opts[0], str(value)]


def _exit_past_stuck_handlers(grace: float = 0.5) -> None:
    """Exit now if handlers abandoned at the shutdown timeout (or after their own timeout)
    still hold pool threads: their jobs are already requeued or recorded, and the interpreter
    would otherwise wait at exit for every one of them to return."""
    deadline = time.monotonic() + grace
    stuck = [t for t in threading.enumerate() if t.name.startswith("sqla-queue-job")]
    for thread in stuck:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = sum(thread.is_alive() for thread in stuck)
    if left:
        log.warning("exiting with %d abandoned handler(s) still running", left)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@main.command()
@_database_option
@click.option("--nats", "nats_url", default=None, help="NATS server, e.g. nats://127.0.0.1:4222.")
@click.option("--amqp", "amqp_url", default=None, help="RabbitMQ, e.g. amqp://guest:guest@host/.")
@click.option(
    "--batch",
    type=count(1, MAX_BATCH),
    default=500,
    show_default=True,
    help="Jobs per transaction.",
)
@click.option("--poll-interval", type=DURATION, default=1.0, show_default=True)
@click.option("--publish-timeout", type=DURATION, default=10.0, show_default=True)
@click.option(
    "--duplicate-window",
    type=DURATION,
    default=120.0,
    show_default=True,
    help="NATS: seconds a stream the relay creates remembers message ids.",
)
@click.option("--burst", is_flag=True, help="Exit when nothing is due.")
@click.option("--poll-only", is_flag=True, help="No LISTEN (PgBouncer transaction pooling).")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@_friendly_errors
def relay(
    database_url: str | None,
    nats_url: str | None,
    amqp_url: str | None,
    batch: int,
    poll_interval: float,
    publish_timeout: float,
    duplicate_window: float,
    burst: bool,
    poll_only: bool,
    log_level: str,
) -> None:
    """Move committed jobs of routed queues to NATS JetStream (--nats) or RabbitMQ (--amqp)."""
    from .brokers.cli import run_relay

    if (nats_url is None) == (amqp_url is None):
        raise click.ClickException("pass exactly one of --nats URL or --amqp URL")
    _configure_logging(log_level)
    engine = _engine(database_url, application_name="sqla-queue relay")
    settings = (batch, poll_interval, publish_timeout, duplicate_window, burst, poll_only)
    stats = run_relay(engine, str(nats_url or amqp_url), *settings)
    if burst:
        click.echo(f"done: {stats.published} published, {stats.duplicates} duplicates", err=True)


@main.command()
@_database_option
@click.argument("task")
@click.option("--args", "args_json", default="{}", help="The handler's keyword arguments as JSON.")
@click.option("--queue", default=None)
@click.option(
    "--priority", type=count(0, PRIORITY_MAX), default=0, show_default=True, help="0 runs first."
)
@click.option("--delay", type=DURATION, default=None, help="Time until the job is due (60, 5m).")
@click.option("--max-attempts", type=count(1, MAX_ATTEMPTS), default=None)
@click.option("--tag", "tags", multiple=True, help="A tag to find the job by (repeatable).")
@click.option("--meta", "meta_json", default=None, help="The job's meta as a JSON object.")
@_friendly_errors
def enqueue(
    database_url: str | None,
    task: str,
    args_json: str,
    queue: str | None,
    priority: int,
    delay: float | None,
    max_attempts: int | None,
    tags: tuple[str, ...],
    meta_json: str | None,
) -> None:
    """Enqueue one job of TASK and print its id."""
    from sqlalchemy.orm import Session

    from .enqueue import enqueue as enqueue_job

    args = _json_option(args_json, "--args")
    meta = None if meta_json is None else _json_option(meta_json, "--meta")
    with _transaction(database_url) as conn:
        session = Session(bind=conn)
        job = enqueue_job(
            session,
            task,
            args,
            queue=queue,
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            tags=list(tags),
            meta=meta,
        )
        session.flush()
        click.echo(job.id)


@main.group()
def queues() -> None:
    """Create, list, pause, resume and delete queues."""


_ROUTE_HELP = "Send its jobs to a broker: nats:SUBJECT or amqp:EXCHANGE/ROUTING_KEY (see relay)."


_CONCURRENCY_HELP = "At most N of its jobs run at once, across all workers."
_RATE_HELP = (
    "At most COUNT of its jobs start per window, across all workers: 100/s, 10/min, 20/30s."
)
_RESULT_TTL_HELP = "How long kept results stay readable when the queue deletes jobs (default 1d)."


def _apply_limits(
    conn: Connection,
    name: str,
    concurrency: int | None,
    rate: tuple[int, float] | None,
    result_ttl: float | None,
) -> None:
    if concurrency is not None:
        admin.set_concurrency(conn, name, concurrency or None)
    if rate is not None:
        admin.set_rate(conn, name, rate)
    if result_ttl is not None:
        admin.set_result_ttl(conn, name, result_ttl)


def _describe(info: admin.QueueInfo) -> str:
    """A queue's settings, as `queues create`, `set` and `list` print them."""
    parts = [f"retention {info.retention}"]
    if info.route:
        parts.append(f"route {info.route}")
    if info.concurrency is not None:
        parts.append(f"concurrency {info.concurrency}")
    if info.rate is not None:
        parts.append(f"rate {info.rate_text}")
    return ", ".join(parts)


@queues.command("create")
@_database_option
@click.argument("name")
@click.option(
    "--retention",
    type=click.Choice([r.value for r in Retention]),
    default=None,
    help="What happens to succeeded jobs: delete (the default for a new queue), keep, archive.",
)
@click.option("--route", default=None, help=_ROUTE_HELP)
@click.option("--concurrency", type=count(), default=None, help=_CONCURRENCY_HELP)
@click.option("--rate", type=RATE, default=None, help=_RATE_HELP)
@click.option("--result-ttl", type=DURATION, default=None, help=_RESULT_TTL_HELP)
@_friendly_errors
def queues_create(
    database_url: str | None,
    name: str,
    retention: str | None,
    route: str | None,
    concurrency: int | None,
    rate: tuple[int, float] | None,
    result_ttl: float | None,
) -> None:
    """Create queue NAME; if it exists, change only the settings given."""
    with _transaction(database_url) as conn:
        created = admin.create_queue(conn, name, retention or Retention.delete.value)
        if not created and retention is not None:
            admin.set_retention(conn, name, retention)
        if route is not None:
            admin.set_route(conn, name, route)
        _apply_limits(conn, name, concurrency, rate, result_ttl)
        (info,) = [q for q in admin.list_queues(conn) if q.name == name]
    state = "created" if created else "exists"
    click.echo(f"queue {name!r} {state} ({_describe(info)})")


@queues.command("set")
@_database_option
@click.argument("name")
@click.option("--retention", type=click.Choice([r.value for r in Retention]), default=None)
@click.option("--route", default=None, help=_ROUTE_HELP)
@click.option("--no-route", is_flag=True, help="Back to table workers (clears the route).")
@click.option("--concurrency", type=count(), default=None, help=_CONCURRENCY_HELP)
@click.option("--no-concurrency", is_flag=True, help="Lift the concurrency limit.")
@click.option("--rate", type=RATE, default=None, help=_RATE_HELP)
@click.option("--no-rate", is_flag=True, help="Lift the rate limit.")
@click.option("--result-ttl", type=DURATION, default=None, help=_RESULT_TTL_HELP)
@_friendly_errors
def queues_set(
    database_url: str | None,
    name: str,
    retention: str | None,
    route: str | None,
    no_route: bool,
    concurrency: int | None,
    no_concurrency: bool,
    rate: tuple[int, float] | None,
    no_rate: bool,
    result_ttl: float | None,
) -> None:
    """Change the settings of queue NAME."""
    for given, lifted, option in (
        (route, no_route, "route"),
        (concurrency, no_concurrency, "concurrency"),
        (rate, no_rate, "rate"),
    ):
        if given is not None and lifted:
            raise click.UsageError(f"pass --{option} or --no-{option}, not both")
    with _transaction(database_url) as conn:
        if retention is not None:
            admin.set_retention(conn, name, retention)
        if route is not None or no_route:
            admin.set_route(conn, name, route)
        if no_concurrency:
            admin.set_concurrency(conn, name, None)
        if no_rate:
            admin.set_rate(conn, name, None)
        _apply_limits(conn, name, concurrency, rate, result_ttl)
        (info,) = [q for q in admin.list_queues(conn) if q.name == name]
    click.echo(f"queue {name!r}: {_describe(info)}, route {info.route or '(none)'}")


@queues.command("list")
@_database_option
@_friendly_errors
def queues_list(database_url: str | None) -> None:
    """List queues with their settings."""
    with _transaction(database_url) as conn:
        for info in admin.list_queues(conn):
            state = "paused" if info.paused else "active"
            routed = f"\troute={info.route}" if info.route else ""
            limited = f"\tconcurrency={info.concurrency}" if info.concurrency else ""
            limited += f"\trate={info.rate_text}" if info.rate else ""
            click.echo(f"{info.name}\t{state}\tretention={info.retention}{routed}{limited}")


@queues.command("pause")
@_database_option
@click.argument("name")
@_friendly_errors
def queues_pause(database_url: str | None, name: str) -> None:
    """Stop workers claiming from NAME (running jobs finish)."""
    with _transaction(database_url) as conn:
        admin.set_paused(conn, name, True)
    click.echo(f"queue {name!r} paused")


@queues.command("resume")
@_database_option
@click.argument("name")
@_friendly_errors
def queues_resume(database_url: str | None, name: str) -> None:
    """Let workers claim from NAME again."""
    with _transaction(database_url) as conn:
        admin.set_paused(conn, name, False)
    click.echo(f"queue {name!r} resumed")


@queues.command("delete")
@_database_option
@click.argument("name")
@click.option("--force", is_flag=True, help="Also delete the queue's jobs.")
@_friendly_errors
def queues_delete(database_url: str | None, name: str, force: bool) -> None:
    """Delete queue NAME (refused while it has unfinished jobs, unless --force)."""
    with _transaction(database_url) as conn:
        deleted = admin.delete_queue(conn, name, force)
    click.echo(f"queue {name!r} deleted ({deleted} job(s) deleted with it)")


@main.command()
@_database_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_friendly_errors
def stats(database_url: str | None, as_json: bool) -> None:
    """Jobs per queue and status, and the oldest due job's age."""
    with _transaction(database_url) as conn:
        rows = admin.stats(conn)
    if as_json:
        click.echo(json.dumps([row.as_dict() for row in rows], indent=2))
        return
    from rich.table import Table

    table = Table("queue", *(s.value for s in JobStatus), "oldest due (s)")
    for row in rows:
        label = row.queue + (" (paused)" if row.paused else "")
        age = "" if row.oldest_due_age is None else f"{row.oldest_due_age:.1f}"
        table.add_row(label, *(str(row.counts.get(s.value, 0)) for s in JobStatus), age)
    _print_table(table)


@main.command()
@_database_option
@click.option(
    "--older-than",
    type=DURATION,
    required=True,
    help="Age of finished jobs to delete: 3600, 90s, 12h, 7d.",
)
@click.option(
    "--status",
    "statuses",
    default="done",
    show_default=True,
    help="Comma-separated finished statuses to prune (done, failed, cancelled).",
)
@click.option("--archive", is_flag=True, help="Also prune the archive table.")
@_friendly_errors
def prune(database_url: str | None, older_than: float, statuses: str, archive: bool) -> None:
    """Delete finished jobs older than --older-than."""
    with _transaction(database_url) as conn:
        count = admin.prune(conn, older_than, [s.strip() for s in statuses.split(",")], archive)
    click.echo(f"pruned {count} job(s)")


@main.group()
def jobs() -> None:
    """Act on single jobs."""


@jobs.command("cancel")
@_database_option
@click.argument("job_ids", nargs=-1, type=JOB_ID, required=True)
@_friendly_errors
def jobs_cancel(database_url: str | None, job_ids: tuple[int, ...]) -> None:
    """Cancel queued or running jobs by id; a running handler sees ctx.cancelled.

    Exit status 1 if any id names no job or a job that had already finished (done or
    failed); a job that was already cancelled is reported as such and is not an error."""
    with _transaction(database_url) as conn:
        cancelled = admin.cancel_jobs(conn, job_ids)
        others = admin.job_statuses(conn, [i for i in job_ids if i not in cancelled])
    refused = False
    for job_id in job_ids:
        if job_id in cancelled:
            click.echo(f"job {job_id}: cancelled (was {cancelled[job_id]})")
        elif others.get(job_id) == JobStatus.cancelled.value:
            click.echo(f"job {job_id}: already cancelled")
        elif job_id in others:
            refused = True
            click.echo(f"job {job_id}: not cancelled, it already finished ({others[job_id]})")
        else:
            refused = True
            click.echo(
                f"job {job_id}: not cancelled, no such job (never enqueued, or deleted once "
                "finished by its queue's retention or by prune)"
            )
    if refused:
        sys.exit(1)


def _print_table(table: Any) -> None:
    """A rich table on stdout: fitted to a terminal; piped, never cut short (a task name
    of any length stays on its line, for `| grep`)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=_PIPED_WIDTH)
    console.print(table)


_PIPED_WIDTH = 100_000
"""Columns of a table printed to a pipe: wider than any row, so none is wrapped or cut."""


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


@jobs.command("list")
@_database_option
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("--task", default=None, help="Only jobs of this task (its registered name).")
@click.option(
    "--status", type=click.Choice([s.value for s in JobStatus]), default=None, help="Only these."
)
@click.option(
    "--limit",
    type=count(1, admin.MAX_LIST_LIMIT),
    default=50,
    show_default=True,
    help="Most jobs shown.",
)
@click.option("--tag", "tags", multiple=True, help="Only jobs with this tag (repeat: all of them).")
@click.option("--before", type=JOB_ID, default=None, help="Ids below this only.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
@_friendly_errors
def jobs_list(
    database_url: str | None,
    queue: str | None,
    task: str | None,
    status: str | None,
    tags: tuple[str, ...],
    limit: int,
    before: int | None,
    as_json: bool,
) -> None:
    """List jobs newest first; page on with --before <the last id shown>."""
    with _transaction(database_url) as conn:
        found = admin.list_jobs(
            conn,
            queue=queue,
            task=task,
            status=status,
            tag=tags or None,
            limit=limit,
            before=before,
        )
    if as_json:
        _echo_json([job.as_dict() for job in found])
        return
    from rich.table import Table

    table = Table("id", "task", "queue", "status", "attempts", "run_at", "tags")
    for job in found:
        attempts = f"{job.attempts}/{job.max_attempts or '-'}"
        table.add_row(
            str(job.id),
            job.task,
            job.queue,
            job.status,
            attempts,
            str(job.run_at),
            ",".join(job.tags),
        )
    _print_table(table)


@jobs.command("show")
@_database_option
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_friendly_errors
def jobs_show(database_url: str | None, job_id: int, as_json: bool) -> None:
    """Show one job: args, attempts, the last error with its traceback, timings."""
    with _transaction(database_url) as conn:
        job = admin.get_job(conn, job_id)
    if job is None:
        raise click.ClickException(
            f"no job {job_id} (never enqueued, or deleted once finished by its queue's "
            "retention or by prune)"
        )
    if as_json:
        _echo_json(job.as_dict())
        return
    for key, value in job.as_dict().items():
        if key in ("args", "meta", "last_error"):
            continue
        click.echo(f"{key}: {'' if value is None else value}")
    click.echo(f"args: {json.dumps(job.args)}")
    click.echo(f"meta: {json.dumps(job.meta)}")
    if job.last_error:
        click.echo("last_error:")
        click.echo(job.last_error)


@jobs.command("retry")
@_database_option
@click.argument("job_ids", nargs=-1, type=JOB_ID)
@click.option("--failed", "all_failed", is_flag=True, help="Retry every failed job.")
@click.option("--queue", default=None, help="With --failed: only this queue's.")
@click.option(
    "--attempts",
    type=count(1, MAX_ATTEMPTS),
    default=None,
    help="Attempts each job gets again (default: its own max_attempts).",
)
@click.option("--json", "as_json", is_flag=True, help="Print {id: previous status} as JSON.")
@_friendly_errors
def jobs_retry(
    database_url: str | None,
    job_ids: tuple[int, ...],
    all_failed: bool,
    queue: str | None,
    attempts: int | None,
    as_json: bool,
) -> None:
    """Put failed or cancelled jobs (by id, or all failed with --failed) back to queued.

    A unique job whose key another job holds stays where it is, and is named with that job.
    Exit status 1 if an id names no job or one that is not failed or cancelled, or if a job
    was left alone for its unique key."""
    if bool(job_ids) == all_failed:
        raise click.UsageError("pass job ids or --failed, not both (and not neither)")
    if queue is not None and not all_failed:
        raise click.UsageError("--queue goes with --failed; ids name their jobs already")
    with _transaction(database_url) as conn:
        retried = admin.retry_jobs(
            conn,
            list(job_ids) if job_ids else None,
            all_failed=all_failed,
            queue=queue,
            attempts=attempts,
        )
        skipped = retried.skipped
        others = admin.job_statuses(
            conn, [i for i in job_ids if i not in retried and i not in skipped]
        )
    if as_json:
        _echo_json({str(job_id): status for job_id, status in retried.items()})
    elif all_failed:
        click.echo(f"retried {len(retried)} failed job(s)")
    for job_id, held in sorted(skipped.items()):
        click.echo(f"job {job_id}: not retried, {held.reason} ({held.status})", err=as_json)
    named = tuple(i for i in job_ids if i not in skipped)
    refused = _report_each(
        named,
        retried,
        others,
        "retried",
        "it is not failed or cancelled, or its handler still runs",
        err=as_json,
    )
    if refused or skipped:
        sys.exit(1)


def _report_each(
    job_ids: tuple[int, ...],
    done: dict[int, str],
    others: dict[int, str],
    verb: str,
    why: str,
    err: bool,
) -> bool:
    """One line per id (on stderr when stdout carries JSON); True if any id was refused."""
    refused = False
    for job_id in job_ids:
        if job_id in done:
            click.echo(f"job {job_id}: {verb} (was {done[job_id]})", err=err)
        elif job_id in others:
            refused = True
            click.echo(f"job {job_id}: not {verb}, {why} ({others[job_id]})", err=err)
        else:
            refused = True
            click.echo(f"job {job_id}: not {verb}, no such job", err=err)
    return refused


@jobs.command("delete")
@_database_option
@click.argument("job_ids", nargs=-1, type=JOB_ID, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print {id: status it had} as JSON.")
@_friendly_errors
def jobs_delete(database_url: str | None, job_ids: tuple[int, ...], as_json: bool) -> None:
    """Delete jobs by id (also archived ones); a running job is refused: cancel it first.

    Exit status 1 if an id names no job or a running one."""
    with _transaction(database_url) as conn:
        deleted = admin.delete_jobs(conn, job_ids)
        others = admin.job_statuses(conn, [i for i in job_ids if i not in deleted])
    if as_json:
        _echo_json({str(job_id): status for job_id, status in deleted.items()})
    why = "it is running (cancel it first), or cancelled while its handler still runs"
    if _report_each(job_ids, deleted, others, "deleted", why, err=as_json):
        sys.exit(1)


@main.group()
def periodic() -> None:
    """Periodic jobs: their schedules, next and last runs."""


@periodic.command("list")
@_database_option
@click.option("--app", "app_path", required=True, help="The task registry, as pkg.module:name.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
@_friendly_errors
def periodic_list(database_url: str | None, app_path: str, as_json: bool) -> None:
    """Each periodic task of the registry: its schedule, next run, and last run (by anyone)."""
    from .periodic import schedule_states
    from .registry import load_registry

    if "." not in sys.path and "" not in sys.path:  # as `worker --app` finds the app
        sys.path.insert(0, "")
    registry = load_registry(app_path)
    with _transaction(database_url) as conn:
        states = schedule_states(conn, registry)
    if as_json:
        _echo_json([{k: _iso(v) for k, v in dataclasses.asdict(s).items()} for s in states])
        return
    if not states:
        click.echo(
            f"{app_path} has no periodic tasks (register one with @registry.periodic; in "
            "another module? name it in Registry(include=[...]))"
        )
        return
    from rich.table import Table

    table = Table("task", "schedule", "next run", "last run", "last job")
    for state in states:
        table.add_row(
            state.task,
            state.schedule,
            str(state.next_run),
            "never" if state.last_run is None else str(state.last_run),
            "" if state.last_job_id is None else str(state.last_job_id),
        )
    _print_table(table)


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


@main.command()
@_database_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option(
    "--lease",
    type=DURATION,
    default="60",
    show_default=True,
    help="Grace for stuck jobs (past their lease, or held by a dead worker): overdue by twice "
    "this is critical (60, 90s, 5m).",
)
@click.option(
    "--backlog-threshold",
    type=DURATION,
    default="300",
    show_default=True,
    help="Queued jobs more than this past their run_at are backlog (300, 5m, 1h).",
)
@click.option(
    "--long-transaction",
    type=DURATION,
    default="60",
    show_default=True,
    help="A transaction open longer than this warns (ten times as long: critical).",
)
@click.option(
    "--sample",
    type=DURATION,
    default=1.0,
    show_default=True,
    help="Seconds to watch the MultiXact counter (0 skips it).",
)
@click.option(
    "--show-queries",
    is_flag=True,
    help="Include other sessions' SQL text in --json details (it may hold their secrets).",
)
@_friendly_errors
def doctor(
    database_url: str | None,
    as_json: bool,
    lease: float,
    backlog_threshold: float,
    long_transaction: float,
    sample: float,
    show_queries: bool,
) -> None:
    """Check the database for the ways a Postgres queue breaks: MultiXacts, vacuum pinned
    by long transactions, bloat, stuck and overdue jobs. Exit status 1 if any is critical."""
    from .doctor import DoctorOptions, Severity, diagnose, worst

    options = DoctorOptions(
        lease=lease,
        backlog_threshold=backlog_threshold,
        long_transaction=long_transaction,
        sample=sample,
        show_queries=show_queries,
    )
    engine = _engine(database_url)
    try:
        findings = diagnose(engine, options)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps([finding.as_dict() for finding in findings], indent=2))
    else:
        from rich.table import Table

        colours = {Severity.ok: "green", Severity.warn: "yellow", Severity.critical: "bold red"}
        table = Table("check", "severity", "value", "fix", show_lines=True)
        for finding in findings:
            severity = f"[{colours[finding.severity]}]{finding.severity.value}[/]"
            shown_fix = "" if finding.severity is Severity.ok else finding.fix
            table.add_row(finding.name, severity, finding.value, shown_fix)
        _print_table(table)
    if worst(findings) is Severity.critical:
        sys.exit(1)


@main.command()
@_database_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=PORT, default=8080, show_default=True)
@click.option(
    "--auth",
    envvar="SQLA_QUEUE_DASHBOARD_AUTH",
    show_envvar=True,
    default=None,
    help="user:password (HTTP Basic) or a token (Bearer, or the Basic password). Required "
    "on a host other than loopback.",
)
@click.option("--read-only", is_flag=True, help="Hide and refuse retry, cancel, delete, pause.")
@_friendly_errors
def dashboard(
    database_url: str | None, host: str, port: int, auth: str | None, read_only: bool
) -> None:
    """Serve the web dashboard: queues, jobs, workers, doctor; retry, cancel, delete, pause."""
    try:
        import uvicorn

        from .dashboard import Auth, check_exposure, create_app
    except ImportError:
        raise click.ClickException(
            "the dashboard needs its extra: pip install 'sqla-queue[dashboard]'"
        ) from None
    credentials = Auth.parse(auth) if auth is not None else None
    check_exposure(host, credentials)
    engine = _engine(database_url, application_name="sqla-queue dashboard")
    from .migrate import check_schema

    check_schema(engine)
    app = create_app(engine, read_only=read_only, auth=credentials)
    click.echo(f"sqla-queue dashboard on http://{host}:{port}/", err=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.dispose()


@main.group("alembic")
def alembic_group() -> None:
    """sqla-queue's schema in your application's own Alembic environment."""


_ALEMBIC_CONFIG = click.option(
    "-c",
    "--config",
    "config_file",
    default="alembic.ini",
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Your application's Alembic configuration file.",
)


@alembic_group.command("revision")
@_ALEMBIC_CONFIG
@click.option("-m", "--message", default=None, help="The revision's message.")
@click.option(
    "--revision",
    "target",
    default=None,
    help="The sqla-queue schema revision to apply (default: the newest this package ships).",
)
@_friendly_errors
def alembic_revision(config_file: str, message: str | None, target: str | None) -> None:
    """Write a revision into your history that applies (or upgrades) sqla-queue's schema.

    Your history stays linear: run it again after upgrading sqla-queue."""
    from .alembic_ext import write_revision

    try:
        written = write_revision(config_file, message, target)
    except AlembicCommandError as exc:
        raise click.ClickException(f"cannot write the revision: {_one_line(exc)}") from None
    if written is None:
        click.echo("your history already applies the newest sqla-queue schema; nothing written")
        return
    click.echo(f"wrote {written}; apply it with `alembic upgrade head`")


@alembic_group.command("version-locations")
@_ALEMBIC_CONFIG
def alembic_version_locations(config_file: str) -> None:
    """Print the version_locations line that adds sqla-queue's revisions as a branch of yours
    (the other way: `sqla-queue alembic revision` keeps one linear history)."""
    from .alembic_ext import version_locations_line

    click.echo(version_locations_line(config_file))


@main.group()
def embedded() -> None:
    """The embedded PostgreSQL used when no database URL is given."""


_EMBEDDED_DIR = click.option(
    "--data-dir",
    envvar="SQLA_QUEUE_EMBEDDED_DIR",
    default=None,
    help="Its data folder (default .sqla_queue/pgdata).",
)


@embedded.command("url")
@_EMBEDDED_DIR
@_friendly_errors
def embedded_url_command(data_dir: str | None) -> None:
    """Start the embedded server unless it runs, and print its URL (it keeps running)."""
    from .database import embedded_url

    click.echo(embedded_url(data_dir))


@embedded.command("stop")
@_EMBEDDED_DIR
@_friendly_errors
def embedded_stop(data_dir: str | None) -> None:
    """Stop the embedded server (it keeps running between commands)."""
    from .database import stop_embedded

    click.echo("stopped" if stop_embedded(data_dir) else "no embedded server runs there")
