"""The filter options of `sqla-queue jobs list|retry|cancel|delete` (a `JobFilter`), and
the bulk action they start: count, confirm, act in batches (`sqla_queue.admin.filters`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from sqla_queue.admin import filters as bulk
from sqla_queue.admin.filters import JobFilter
from sqla_queue.cli import base
from sqla_queue.cli.job_options import AwareDateTime
from sqla_queue.cli.types import count
from sqla_queue.db.models import JobStatus
from sqla_queue.errors import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])

FILTER_NAMES = (
    "queue",
    "task",
    "statuses",
    "tags",
    "workflow",
    "about",
    "error",
    "traceback",
    "finished_before",
    "finished_after",
    "created_before",
    "created_after",
    "args_json",
    "args_path",
    "args_value",
    "waiting_for",
)
"""The parameters `filter_options` adds (`queue` and `workflow` unless the command has its
own)."""


SAMPLE_SIZE = 5
"""Jobs a bulk action's question shows of those that matched."""


def filter_options(*, queue: bool = True, workflow: bool = True) -> Callable[[F], F]:
    """The filter options on a command; `queue=False`/`workflow=False` when it declares
    that option itself (with its own help)."""
    when = AwareDateTime()
    options = [
        click.option("--task", default=None, help="Only jobs of this task."),
        click.option(
            "--status",
            "statuses",
            multiple=True,
            type=click.Choice([s.value for s in JobStatus]),
            help="Only jobs in this status (repeat: any of them).",
        ),
        click.option("--tag", "tags", multiple=True, help="Only jobs with this tag (repeat: all)."),
        click.option(
            "--about", default=None, help="Only jobs about this row, as TABLE:KEY (orders:42)."
        ),
        click.option(
            "--waiting-for",
            default=None,
            metavar="KEY",
            help="Only jobs waiting for this signal (ctx.wait_for_signal): payment:42.",
        ),
        click.option(
            "--error",
            default=None,
            help="Only jobs whose error's class and message contain TEXT (any case): "
            "ValueError, 'order 42'.",
        ),
        click.option(
            "--traceback",
            default=None,
            help="Only jobs whose last error's whole text contains TEXT (any case): its "
            "traceback's file paths and function names too.",
        ),
        click.option("--finished-before", type=when, default=None, help="Finished before TIME."),
        click.option("--finished-after", type=when, default=None, help="Finished at/after TIME."),
        click.option("--created-before", type=when, default=None, help="Enqueued before TIME."),
        click.option("--created-after", type=when, default=None, help="Enqueued at/after TIME."),
        click.option(
            "--args",
            "args_json",
            default=None,
            help="Only jobs whose args contain this JSON object (e.g. '{\"user\": 42}').",
        ),
        click.option(
            "--args-path", default=None, help="With --args-value: a key path in args (user.id)."
        ),
        click.option(
            "--args-value",
            default=None,
            help='The value at --args-path: JSON (42, true, "42"), else taken as text.',
        ),
    ]
    if queue:
        options.insert(0, click.option("--queue", default=None, help="Only jobs of this queue."))
    if workflow:
        options.append(
            click.option("--workflow", default=None, help="Only jobs of this workflow (its id).")
        )

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def _args(given: dict[str, Any]) -> dict[str, Any] | None:
    text, path, value = given["args_json"], given["args_path"], given["args_value"]
    if (path is None) != (value is None):
        raise click.UsageError("--args-path and --args-value go together")
    if text is not None and path is not None:
        raise click.UsageError("pass --args or --args-path/--args-value, not both")
    found: dict[str, Any]
    if text is not None:
        parsed = base.json_option(text, "--args")
        if not isinstance(parsed, dict):
            raise click.BadParameter(
                "must be a JSON object, e.g. '{\"user\": 42}'", param_hint="--args"
            )
        found, option = parsed, "--args"
    elif path is None:
        return None
    else:
        option = "--args-value"
        try:
            found = bulk.args_from_text(path, value)
        except ConfigurationError as exc:
            detail = exc.context["detail"]
            hint = "--args-path" if detail.startswith("args path") else option
            raise click.BadParameter(detail, param_hint=hint) from None
    problem = bulk.args_problem(found)
    if problem is not None:  # what no job's args hold (NUL, too deep): not to the database
        raise click.BadParameter(problem, param_hint=option)
    return found


def filters_given(given: dict[str, Any]) -> bool:
    """Whether any filter option was given (an empty --tag list or None is not)."""
    return any(given.get(name) for name in FILTER_NAMES)


def filter_from_cli(given: dict[str, Any], status: tuple[str, ...] = ()) -> JobFilter | None:
    """The `JobFilter` of the filter options given (popped from `given`), with `status`
    added; None when no filter option was given."""
    values = {name: given.pop(name, None) for name in FILTER_NAMES}
    statuses = tuple(values["statuses"] or ()) + status
    if not filters_given(values) and not statuses:
        return None
    return JobFilter(
        queue=values["queue"],
        task=values["task"],
        status=statuses or None,
        tag=tuple(values["tags"] or ()) or None,
        workflow_id=values["workflow"],
        about=values["about"],
        error=values["error"],
        traceback=values["traceback"],
        finished_before=values["finished_before"],
        finished_after=values["finished_after"],
        created_before=values["created_before"],
        created_after=values["created_after"],
        args=_args(values),
        waiting_for=values["waiting_for"],
    )


def bulk_options(func: F) -> F:
    """--yes and --batch, of the bulk form of retry, cancel and delete."""
    func = click.option(
        "--batch",
        type=count(1, bulk.MAX_BATCH),
        default=bulk.DEFAULT_BATCH,
        show_default=True,
        help="With filters: jobs per batch, each batch its own transaction.",
    )(func)
    return click.option(
        "--yes", "-y", is_flag=True, help="With filters: act without asking (no count shown)."
    )(func)


def run_bulk(
    database_url: str | None,
    action: str,
    where: JobFilter,
    *,
    yes: bool,
    batch: int,
    as_json: bool,
    **extra: Any,
) -> None:
    """Count the jobs `action` would take, ask (unless `yes`), then act in batches and say
    what was done. Exit status 1 if a retry left a job alone for its unique key."""
    engine = base.engine(database_url)
    try:
        if not yes:
            with base.transaction(database_url) as conn:
                found = bulk.count_matching(conn, where, action)
                sample = bulk.sample_matching(conn, where, action, SAMPLE_SIZE) if found else []
            if not found:
                click.echo(f"no job to {action} matches: {where.describe()}")
                return
            click.echo(f"the first {len(sample)} (by id):")
            for job in sample:
                error = (job.error or "").partition("\n")[0]
                click.echo(f"  {job.id}  {job.task}  {job.status}  {error[:120]}")
            click.confirm(f"{action} {found} job(s) matching {where.describe()}?", abort=True)
        result = bulk.BULK_ACTIONS[action](engine, where, batch=batch, **extra)
    finally:
        engine.dispose()
    if as_json:
        base.echo_json(
            {
                "action": action,
                "acted": result.acted,
                "skipped": result.skipped,
                "held": result.held,
                "batches": result.batches,
                "not_revived": result.not_revived,
            }
        )
    else:
        click.echo(f"{result.notice} ({result.batches} batch(es))")
    if result.held:
        sys.exit(1)
