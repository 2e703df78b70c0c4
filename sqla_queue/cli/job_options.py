"""`JobOptions` as click options: one row per field, for `sqla-queue enqueue`.

`JOB_OPTIONS` maps each of `JobOptions`' fields to its option (spelling, type, help) and to
how the option's value becomes the field's; `job_options` puts them on a command and
`options_from_cli` builds the `JobOptions` the command passes to `enqueue(options=...)`.
Adding a job option is one row here beside its field (a test holds the two equal).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, TypeVar

import click

from sqla_queue.cli import base
from sqla_queue.cli.types import DURATION, JOB_ID, count
from sqla_queue.db.models import PRIORITY_MAX
from sqla_queue.job.options import JobOptions
from sqla_queue.job.validation import MAX_ATTEMPTS

__all__ = ["JOB_OPTIONS", "AwareDateTime", "CliJobOption", "job_options", "options_from_cli"]

F = TypeVar("F", bound=Callable[..., Any])


class AwareDateTime(click.ParamType):  # type: ignore[type-arg]  # generic only in recent click
    """An ISO 8601 time with its zone (`2026-01-02T09:00:00+00:00`, `...Z`), as `run_at`
    takes it: a time without a zone is refused (the database would guess it)."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dt.datetime):
            moment = value
        else:
            try:
                moment = dt.datetime.fromisoformat(str(value))
            except ValueError:
                self.fail(
                    f"{value!r} is not an ISO 8601 time; write e.g. 2026-01-02T09:00:00+00:00",
                    param,
                    ctx,
                )
        if moment.tzinfo is None or moment.utcoffset() is None:
            self.fail(
                f"{value!r} has no time zone; add one, e.g. {moment.isoformat()}+00:00",
                param,
                ctx,
            )
        return moment


def _same(value: Any) -> Any:
    return value


def _meta(value: str | None) -> Any:
    return None if value is None else base.json_option(value, "--meta")


@dataclass(frozen=True)
class CliJobOption:
    """One `JobOptions` field (`name`) as a click option: `decls` as `click.option` takes them,
    `settings` its other keywords, `to_field` the option's value as the field's (None:
    not given, so the task's or the queue's default applies)."""

    name: str
    decls: tuple[str, ...]
    help: str
    settings: Mapping[str, Any] = dataclass_field(default_factory=dict)
    to_field: Callable[[Any], Any] = _same

    @property
    def dest(self) -> str:
        """The command's parameter name for it (click's rule: a bare name, else the long
        option with dashes as underscores)."""
        bare = [d for d in self.decls if not d.startswith("-")]
        return bare[0] if bare else self.decls[0].lstrip("-").replace("-", "_")


JOB_OPTIONS: tuple[CliJobOption, ...] = (
    CliJobOption(
        "queue",
        ("--queue",),
        "The job's queue (default: the task's with --app, else `default`).",
    ),
    CliJobOption(
        "priority",
        ("--priority",),
        "0 runs first (default: the task's with --app, else 0).",
        {"type": count(0, PRIORITY_MAX)},
    ),
    CliJobOption(
        "max_attempts",
        ("--max-attempts",),
        "Attempts before the job fails (default: the task's, else 5, as the worker decides).",
        {"type": count(1, MAX_ATTEMPTS)},
    ),
    CliJobOption(
        "run_at",
        ("--run-at",),
        "When the job is due: an ISO 8601 time with its zone (not with --delay).",
        {"type": AwareDateTime()},
    ),
    CliJobOption(
        "delay",
        ("--delay",),
        "Time until the job is due (60, 5m).",
        {"type": DURATION},
    ),
    CliJobOption(
        "tags",
        ("--tag", "tags"),
        "A tag to find the job by (repeatable).",
        {"multiple": True},
        lambda tags: list(tags) or None,
    ),
    CliJobOption(
        "meta",
        ("--meta", "meta_json"),
        "The job's meta as a JSON object.",
        to_field=_meta,
    ),
    CliJobOption(
        "unique",
        ("--unique",),
        "Write no duplicate: an unfinished job of the task with the same args is kept.",
        {"is_flag": True, "default": False},
        lambda unique: True if unique else None,
    ),
    CliJobOption(
        "depends_on",
        ("--after", "depends_on"),
        "The id of a job this one waits for (repeatable): it runs once each has succeeded.",
        {"multiple": True, "type": JOB_ID},
        lambda ids: list(ids) or None,
    ),
    CliJobOption(
        "on_failure",
        ("--on-failure",),
        "What a job it waits for ending failed or cancelled does to it: cancel it (the "
        "default) or run it anyway.",
        {"type": click.Choice(["cancel", "run"])},
    ),
    CliJobOption(
        "workflow_id",
        ("--workflow-id",),
        "The workflow it belongs to (default: that of the first job it waits for).",
    ),
    CliJobOption(
        "about",
        ("--about",),
        "The row it is about, as TABLE:KEY (e.g. orders:42; a composite key as a JSON "
        "array: order_lines:[42, 1]).",
    ),
    CliJobOption(
        "partition",
        ("--partition",),
        "The partition (a tenant) it is for: a fair queue takes turns between partitions.",
    ),
    CliJobOption(
        "sequence",
        ("--sequence",),
        "Jobs of one sequence run one at a time, in enqueue order, across all workers.",
    ),
    CliJobOption(
        "expires_at",
        ("--expires-at",),
        "Its start deadline, an ISO 8601 time with its zone: not started by then, it is "
        "cancelled (expired), never run (not with --expires-in).",
        {"type": AwareDateTime()},
    ),
    CliJobOption(
        "expires_in",
        ("--expires-in",),
        "Its start deadline as a time from now (60, 1h): not started by then, it is "
        "cancelled (expired), never run.",
        {"type": DURATION},
    ),
)
"""Each `JobOptions` field's option, in the fields' order."""


def job_options(command: F) -> F:
    """Put `JOB_OPTIONS` on a click command (read them back with `options_from_cli`)."""
    for option in reversed(JOB_OPTIONS):
        command = click.option(*option.decls, help=option.help, **option.settings)(command)
    return command


def options_from_cli(values: Mapping[str, Any]) -> JobOptions:
    """The `JobOptions` of a command's parameters (`values`, by parameter name)."""
    return JobOptions(**{o.name: o.to_field(values[o.dest]) for o in JOB_OPTIONS})
