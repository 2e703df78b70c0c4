"""How a job is enqueued, in one type: `JobOptions` (as River's `InsertOpts`).

Every path that writes a job builds one: `enqueue` and `enqueue_async` from their keyword
arguments (or `options=`), `enqueue_many` from each row, `Task.enqueue` from its call, a
task's defaults from `@registry.task(...)`, and `Job(...)` from its constructor. The task's
defaults give way to the call's options (`JobOptions.over`), then the insert hooks see the
result as a `NewJob`, and the fields the hooks leave are checked once, whichever path
wrote them (`sqla_queue.job.validation.validate_job`, which every check lives beside).

Adding an option stored as it is in a jobs column of its own name (as `max_attempts` is) is
one field below, its key in `JobOptionFields`, its check in `COLUMN_OPTIONS`
(`sqla_queue.job.validation`), its
`sqla-queue enqueue` option (`sqla_queue/cli/job_options.py`), and the column with its
migration: every insert path (the ORM, INSERT, COPY, the staging table of unique rows)
builds what it writes from `COLUMN_OPTIONS`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from sqla_queue.job.about import about_text
from sqla_queue.job.validation import COLUMN_OPTIONS, ErrorFactory, check_duration

DEFAULT_MAX_ATTEMPTS = 5
"""How many times a job runs at most when neither it nor its task says (first run included)."""

if TYPE_CHECKING:
    from sqla_queue.job.unique import UniqueOption


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The options of a job, each None when not given (the task's default, then the
    queue's own default, applies).

    `queue` is the queue's name ("default" unless given); `priority` 0 (the default) runs
    first, up to 32767; `max_attempts` (None: the task's, else 5); `run_at` (an aware
    datetime) or `delay` (seconds or a timedelta, by the database clock) schedule it;
    `tags` (names to find it by) and `meta` (context that is not an argument, e.g. a trace
    id) reach the handler as `ctx.tags` and `ctx.meta`; `unique` (True, False, or a
    `sqla_queue.Unique`) says whether a duplicate is written. `depends_on` (jobs or ids,
    or `sqla_queue.Dependency`) makes the job wait until each has ended; `on_failure`
    ("cancel", the default, or "run") says what the end of one as failed or cancelled does
    to it; `workflow_id` names the workflow it belongs to (see `sqla_queue.enqueue.workflows`).
    `about` (a mapped instance, or its `'<table>:<key>'` text) names the row the job is
    about (see `sqla_queue.orm`). `partition` (a tenant's name, say) is what a fair queue
    takes turns between and a partition limit caps; jobs of one `sequence` run one at a
    time, in enqueue order (see docs/fairness.md). `expires_at` (an aware datetime) or
    `expires_in` (seconds or a timedelta from the enqueue, by the application's clock) is
    its start deadline: a job not started by then is cancelled ("expired"), never run.

        enqueue(session, "emails.send", {"to": to}, options=JobOptions(queue="emails"))
    """

    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    tags: Iterable[str] | None = None
    meta: Mapping[str, Any] | None = None
    unique: UniqueOption = None
    depends_on: Sequence[Any] | None = None
    on_failure: str | None = None
    workflow_id: str | None = None
    about: object | None = None
    partition: str | None = None
    sequence: str | None = None
    expires_at: dt.datetime | None = None
    expires_in: float | dt.timedelta | None = None

    def over(self, defaults: JobOptions) -> JobOptions:
        """These options where given, `defaults`' (a task's) elsewhere: the one merge rule."""
        if defaults is NO_OPTIONS:
            return self
        mine = self.given()
        merged = {name: mine.get(name, getattr(defaults, name)) for name in OPTION_NAMES}
        return JobOptions(**merged)

    def given(self) -> dict[str, Any]:
        """The options that were given (not None), by name."""
        values = ((name, getattr(self, name)) for name in OPTION_NAMES)
        return {name: value for name, value in values if value is not None}


class JobOptionFields(TypedDict, total=False):
    """`JobOptions`' fields as keyword arguments (`**options: Unpack[JobOptionFields]`), for
    the signatures of `enqueue`, `Task.enqueue` and `@registry.task`; the same names and
    types as `JobOptions` (a test holds them equal)."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    run_at: dt.datetime | None
    delay: float | dt.timedelta | None
    tags: Iterable[str] | None
    meta: Mapping[str, Any] | None
    unique: UniqueOption
    depends_on: Sequence[Any] | None
    on_failure: str | None
    workflow_id: str | None
    about: object | None
    partition: str | None
    sequence: str | None
    expires_at: dt.datetime | None
    expires_in: float | dt.timedelta | None


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(JobOptions))
"""The option names, in `JobOptions`' order."""
NO_OPTIONS = JobOptions()
"""No option given."""


def options_from(
    where: str, options: JobOptions | None, fields: Mapping[str, Any], error: ErrorFactory
) -> JobOptions:
    """The `JobOptions` of a call that takes `options=` or the same fields as keywords (not
    both for one field); `error(message)` for an unknown keyword. `where` names the call."""
    unknown = fields.keys() - OPTION_NAMES
    if unknown:
        raise error(
            f"{where} got unknown option(s) {', '.join(sorted(unknown))}; "
            f"the options are {', '.join(OPTION_NAMES)}"
        )
    if options is None:
        return _about_as_text(JobOptions(**fields), error) if fields else NO_OPTIONS
    if not isinstance(options, JobOptions):
        raise error(f"options must be a sqla_queue.JobOptions, got {options!r:.60}")
    given = {name: value for name, value in fields.items() if value is not None}
    twice = given.keys() & options.given().keys()
    if twice:
        raise error(
            f"{where} got {', '.join(sorted(twice))} both in options= and as a keyword; "
            "pass each once"
        )
    return _about_as_text(dataclasses.replace(options, **given) if given else options, error)


def _about_as_text(options: JobOptions, error: ErrorFactory) -> JobOptions:
    """`options` with `about` as the text the table keeps (a mapped instance's key)."""
    if options.about is None or isinstance(options.about, str):
        return options
    return dataclasses.replace(options, about=about_text(options.about, error))


def column_values(source: object) -> dict[str, Any]:
    """`COLUMN_OPTIONS`' values of `source` (a `JobOptions`, a `NewJob`, a `Job`), by name."""
    return {name: getattr(source, name) for name in COLUMN_OPTIONS}


def expiry(expires_at: object, expires_in: object, error: ErrorFactory) -> dt.datetime | None:
    """A job's start deadline: `expires_at` as given, or now plus `expires_in` (seconds or a
    timedelta, 0 to 100 years); None without either. Both given is refused."""
    if expires_in is None:
        return expires_at  # type: ignore[return-value]  # checked with COLUMN_OPTIONS
    if expires_at is not None:
        raise error("pass expires_at or expires_in, not both")
    seconds = check_duration("expires_in", expires_in, error=error)
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)


def delay_interval(run_at: object, delay: object, error: ErrorFactory) -> dt.timedelta | None:
    """`delay` (seconds or a timedelta, 0 to 100 years) as an interval, None without one;
    refuses a delay beside a `run_at`."""
    if delay is None:
        return None
    if run_at is not None:
        raise error("pass run_at or delay, not both")
    seconds = check_duration("delay", delay, error=error)
    return delay if isinstance(delay, dt.timedelta) else dt.timedelta(seconds=seconds)


__all__ = [
    "NO_OPTIONS",
    "OPTION_NAMES",
    "JobOptionFields",
    "JobOptions",
    "column_values",
    "delay_interval",
    "expiry",
    "options_from",
]
