"""`sqla-queue worker`: run jobs from the table, or from a broker with --from."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sqla_queue.brokers.kinds import BROKER_KINDS
from sqla_queue.cli import base
from sqla_queue.cli.base import Command
from sqla_queue.cli.types import DURATION, PORT, count
from sqla_queue.db.database import URL_ENV_VAR
from sqla_queue.db.models import DEFAULT_QUEUE
from sqla_queue.job.validation import MAX_BATCH, MAX_PROCESSES, MAX_WORKER_CONCURRENCY
from sqla_queue.worker.supervisor import exit_past_stuck_handlers

if TYPE_CHECKING:
    from sqla_queue.worker import WorkerStats

log = logging.getLogger("sqla_queue.cli")

WORKER_APPLICATION_NAME = "sqla-queue worker"

F = TypeVar("F", bound=Callable[..., Any])


def _worker_default(name: str) -> Any:
    from sqla_queue.worker import WorkerConfig

    return base.config_default(WorkerConfig, name)


def _config_option(
    *decls: str,
    type: click.ParamType,  # type: ignore[type-arg]  # generic only in recent click
    help: str | None = None,
    broker: bool = False,
) -> Callable[[F], F]:
    """An option whose default is the config field named by its last spelling (--batch:
    WorkerConfig.batch; with `broker`, BrokerWorkerConfig's), shown in --help."""
    name = decls[-1].lstrip("-").replace("-", "_")
    default = _broker_default(name) if broker else _worker_default(name)
    return click.option(*decls, type=type, default=default, show_default=True, help=help)


def _broker_default(name: str) -> Any:
    from sqla_queue.brokers.worker import BrokerWorkerConfig

    return base.config_default(BrokerWorkerConfig, name)


def _supervised_child_exits(func: F) -> F:
    """A worker started by `--processes` exits with a status of its own for a configuration
    error, so that its parent does not restart it again and again."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("supervised_slot") is None:
            return func(*args, **kwargs)
        from sqla_queue.worker.supervisor import CONFIGURATION_ERRORS, exit_for_configuration_error

        try:
            return func(*args, **kwargs)
        except CONFIGURATION_ERRORS as exc:
            exit_for_configuration_error(exc)

    return wrapper  # type: ignore[return-value]


@click.command(cls=Command)
@click.option("--app", "app_path", required=True, help="The task registry, as pkg.module:name.")
@click.option(
    "-q",
    "--queues",
    multiple=True,
    help="A queue to serve; repeat it or separate names with commas (default: the queues "
    "its registry's tasks name; '*': every queue in the database).",
)
@_config_option("-c", "--concurrency", type=count(1, MAX_WORKER_CONCURRENCY))
@_config_option(
    "--batch",
    type=count(1, MAX_BATCH),
    help="Jobs a claim asks for (claims grow to --max-batch while jobs are quick).",
)
@click.option(
    "--max-batch",
    type=count(1, MAX_BATCH),
    default=None,
    help="The most jobs one claim asks for while the jobs are quick and the backlog deep "
    "(default: the larger of --batch and 500; --max-batch 1 keeps every claim at --batch).",
)
@_config_option(
    "--lease",
    type=DURATION,
    help="A job may go this long without a heartbeat before it is reaped (at least 1 s).",
)
@_config_option(
    "--poll-interval",
    type=DURATION,
    help="The longest wait between polls when no NOTIFY arrives.",
)
@click.option("--burst", is_flag=True, help="Exit when no job is due.")
@_config_option(
    "--burst-wait",
    type=DURATION,
    help="With --burst: wait instead of exiting while a queued job of its queues (a retry, "
    "a snooze, a delayed job) falls due within this long (30s, 5m).",
)
@click.option(
    "--until-empty",
    "burst_until_empty",
    is_flag=True,
    help="With --burst: wait for every job of its queues due later (a retry, a snooze, a "
    "delayed job), however far off; exit once none is left.",
)
@click.option(
    "--fail-if-left",
    is_flag=True,
    help="With --burst: exit with status 3 when it leaves jobs of its queues not yet due "
    "(a retry, a snooze, a delayed job), for CI and cron.",
)
@click.option("--poll-only", is_flag=True, help="No LISTEN (PgBouncer transaction pooling).")
@click.option(
    "--no-prepare",
    is_flag=True,
    help="Prepare no statement on the server (PgBouncer before 1.21 in transaction pooling: "
    "it fails with 'prepared statement \"_pg3_0\" already exists').",
)
@_config_option(
    "--shutdown-timeout",
    type=DURATION,
    help="How long running handlers may finish after SIGTERM.",
)
@click.option(
    "--give-up-after",
    type=DURATION,
    default=None,
    help="How long to wait for an unreachable database before exiting with an error "
    "(default: forever; 30 s with --burst).",
)
@base.log_level_option
@base.log_format_option
@click.option(
    "--metrics-port",
    type=PORT,
    default=None,
    help="Serve Prometheus metrics on this port (needs sqla-queue[metrics]).",
)
@click.option(
    "--health-port",
    type=PORT,
    default=None,
    help="Serve /livez, /readyz and /health over HTTP on this port (with --processes, "
    "the parent serves it for all its workers).",
)
@_config_option(
    "--health-host",
    type=click.STRING,
    help="The address the health port listens on (0.0.0.0: every interface, as "
    "Kubernetes probes need; 127.0.0.1: this machine only).",
)
@_config_option(
    "--health-stuck-after",
    type=DURATION,
    help="How long one round of a worker loop (a statement, a connection attempt) may take "
    "before /livez calls it stuck.",
)
@click.option(
    "--from",
    "broker_url",
    default=None,
    help="Run the routed queue -q from its broker: "
    + " or ".join(kind.example_url for kind in BROKER_KINDS.values())
    + ".",
)
@_config_option(
    "--ack-wait",
    type=DURATION,
    broker=True,
    help="With --from: how long the broker waits for a job's ack before it delivers the job "
    "again (NATS; the worker signals progress meanwhile).",
)
@click.option(
    "--dedup/--no-dedup",
    default=None,
    help="With --from: skip job ids already run (default: "
    + ", ".join(f"{'on' if k.dedup else 'off'} for {k.name}" for k in BROKER_KINDS.values())
    + ").",
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
@click.option(
    "--job-logs/--no-job-logs",
    default=_worker_default("job_logs"),
    help="Whether each job's log lines (what its handler logs while it runs) are kept with "
    "its attempt and shown by jobs show and the dashboard (default: yes).",
)
@click.option("--supervised-slot", type=count(1, MAX_PROCESSES), default=None, hidden=True)
@click.pass_context
@_supervised_child_exits
def worker(
    ctx: click.Context,
    database_url: str | None,
    app_path: str,
    queues: tuple[str, ...],
    concurrency: int,
    batch: int,
    max_batch: int | None,
    lease: float,
    poll_interval: float,
    burst: bool,
    burst_wait: float,
    burst_until_empty: bool,
    fail_if_left: bool,
    poll_only: bool,
    no_prepare: bool,
    shutdown_timeout: float,
    give_up_after: float | None,
    log_level: str,
    log_format: str | None,
    metrics_port: int | None,
    health_port: int | None,
    health_host: str,
    health_stuck_after: float,
    broker_url: str | None,
    ack_wait: float,
    dedup: bool | None,
    processes: int,
    synchronous_commit: bool,
    job_logs: bool,
    supervised_slot: int | None,
) -> None:
    """Run jobs until SIGTERM/SIGINT (a second signal exits at once), or, with --burst,
    until nothing is due. With --processes N, run N such workers under one parent."""
    from sqla_queue.worker import Worker, WorkerConfig

    log_format = log_format or (ctx.find_root().obj or {}).get("log_format") or "text"
    base.configure_logging(log_level, log_format)
    queue_list = [q.strip() for given in queues for q in given.split(",")] if queues else None
    every_queue = queue_list == ["*"]
    config = base.config_from(WorkerConfig, queues=None if every_queue else queue_list)
    if metrics_port is not None and metrics_port + processes - 1 > 65535:
        raise click.BadParameter(
            f"with --processes {processes} the workers serve metrics on ports {metrics_port} "
            f"to {metrics_port + processes - 1}; the last must be at most 65535",
            param_hint="'--metrics-port'",
        )
    if fail_if_left and not burst:
        raise click.ClickException(
            "--fail-if-left only means something to a worker that exits: add --burst"
        )
    lease_given = ctx.get_parameter_source("lease") is not DEFAULT_SOURCE
    if broker_url is not None and lease_given:
        raise click.BadParameter(
            "is a table worker's job lease; with --from, the broker's wait before it delivers "
            "a job again is --ack-wait",
            param_hint="'--lease'",
        )
    if health_port is not None and broker_url is not None:
        raise click.BadParameter(
            "health checks are not served by a worker with --from yet", param_hint="'--health-port'"
        )
    if health_port is not None and processes > 1 and health_port + processes > 65535:
        raise click.BadParameter(
            f"with --processes {processes} the workers answer the parent's health checks on "
            f"127.0.0.1 ports {health_port + 1} to {health_port + processes}; the last must "
            "be at most 65535",
            param_hint="'--health-port'",
        )
    if processes > 1:
        from sqla_queue.worker.supervisor import supervise_worker_command

        env = {URL_ENV_VAR: base.resolved_url(database_url)}
        sys.exit(supervise_worker_command(ctx, processes, log_format, env))
    if supervised_slot is not None:
        from sqla_queue.worker.supervisor import child_name, watch_parent

        watch_parent()
        config.worker_id = f"{config.worker_id}:{child_name(supervised_slot)}"
    registry = base.app_registry(app_path)
    if queue_list is None and broker_url is None:  # its tasks' queues, not another app's
        config.queues = registry.queue_names() or [DEFAULT_QUEUE]
    if log_format == "json":
        from sqla_queue.contrib.logs import log_jobs

        log_jobs(registry)
    if metrics_port is not None:
        from sqla_queue.contrib import metrics

        metrics.instrument(registry)
        metrics.serve(metrics_port)
    if broker_url is not None:
        from sqla_queue.cli.broker_runs import broker_worker_config, run_broker_worker

        broker_config = broker_worker_config(broker_url, config, ack_wait=ack_wait, dedup=dedup)
        connect_args = {"prepare_threshold": None} if no_prepare else {}
        broker_engine = base.engine(database_url, connect_args=connect_args)
        run_broker_worker(broker_engine, registry, broker_config)
        exit_past_stuck_handlers()
        return
    engine = base.engine(
        database_url,
        application_name=WORKER_APPLICATION_NAME,
        pool_size=3,
        max_overflow=4,
        connect_args={"prepare_threshold": None} if no_prepare else {},
    )
    if burst:  # said once the worker runs (not before a refusal of the schema)
        bound = _burst_bound(burst_wait, burst_until_empty)
        registry.on_worker_started(lambda _: _say(bound, log_format))
    try:
        stats = Worker(engine, registry, config).run()
    finally:
        engine.dispose()
    if burst:
        done = f"done: {stats.succeeded} succeeded, {stats.retried} retried, {stats.failed} failed"
        done += _left_behind(stats, burst_wait)
        fields = dataclasses.asdict(stats)
        if stats.next_due_at is not None:
            fields["next_due_at"] = stats.next_due_at.isoformat()
        _say(done, log_format, fields)
    exit_past_stuck_handlers()
    if burst and fail_if_left and stats.not_yet_due:
        sys.exit(LEFT_WORK_EXIT_STATUS)


DEFAULT_SOURCE = click.core.ParameterSource.DEFAULT


def _say(line: str, log_format: str, fields: dict[str, Any] | None = None) -> None:
    """A burst worker's line on stderr: a record of the JSON log (stderr stays one JSON
    object per line), else the line itself."""
    if log_format == "json":
        log.warning(line, extra=fields or {})
    else:
        click.echo(line, err=True)


def _burst_bound(burst_wait: float, until_empty: bool) -> str:
    """What a burst worker waits for before it exits, said when it starts."""
    if until_empty:
        return (
            "burst: runs its queues' jobs, waits for those due later (retries, snoozes, "
            "delayed jobs) however far off, and exits once none is left (--until-empty)"
        )
    return (
        f"burst: runs its queues' jobs due now, waits for those due within {burst_wait:g}s "
        "(--burst-wait), then exits; --until-empty waits until none is left"
    )


LEFT_WORK_EXIT_STATUS = 3
"""`worker --burst --fail-if-left`'s exit status when it left jobs not yet due."""


def _left_behind(stats: WorkerStats, burst_wait: float) -> str:
    """What a burst worker left: its queues' jobs due later (a retry, a snooze), and how
    to wait for them; "" when it left none."""
    if not stats.not_yet_due or stats.next_due_at is None:
        return ""
    jobs = "job" if stats.not_yet_due == 1 else "jobs"
    earliest = stats.next_due_at.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
    beyond = f" (beyond --burst-wait {burst_wait:g}s)" if burst_wait else ""
    return (
        f"; left {stats.not_yet_due} {jobs} not yet due, the earliest due at {earliest}"
        f"{beyond}: run again then, or --burst-wait DURATION waits for jobs due within it "
        "(--until-empty for all of them)"
    )
