"""Acting on many jobs at once, by filter: retry, cancel or delete every job a `JobFilter`
matches, in bounded batches, and search jobs by it.

Each batch is its own short transaction: up to `batch` matching ids above the last one
done are locked (by id, FOR UPDATE), acted on by the same fenced statement as
`admin.retry_jobs`, `admin.cancel_jobs` or `admin.delete_jobs`, and committed; the next
batch starts after the last id. A million-row action never holds a long transaction, and
a job that changes meanwhile is judged as it is when its batch locks it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine

from sqla_queue.admin import jobs as admin
from sqla_queue.db.database import begin_read_committed
from sqla_queue.db.queries import bulk as statements
from sqla_queue.errors import ConfigurationError, InvalidJobError
from sqla_queue.job.states import JobStatus, statuses
from sqla_queue.job.validation import (
    MAX_ATTEMPTS,
    check_about,
    check_count,
    check_job_id,
    check_signal_key,
    check_workflow_id,
    encode_json_object,
    limits,
    validate_name,
)

MAX_ERROR_TEXT = 1000
"""The longest error text a filter searches for."""
DEFAULT_BATCH = 1000
"""Jobs per batch (per transaction) of a bulk action."""
MAX_BATCH = 10_000


def _bad(detail: str) -> ConfigurationError:
    return ConfigurationError(detail=detail)


def args_at(path: str | Sequence[str], value: Any) -> dict[str, Any]:
    """The containment document that matches jobs whose args hold `value` at `path`
    (`"user.id"` or `["user", "id"]`): `args_at("user.id", 42)` is `{"user": {"id": 42}}`.
    A list value matches a list holding those elements (JSON containment)."""
    keys = path.split(".") if isinstance(path, str) else list(path)
    if not keys or any(not isinstance(k, str) or not k for k in keys):
        raise _bad(
            f"args path {path!r} must be keys joined by dots, none empty (e.g. user.id); "
            "pass a list of keys for a key that holds a dot"
        )
    document: Any = value
    for key in reversed(keys):
        document = {key: document}
    return dict(document)


def args_from_text(path: str, value: str) -> dict[str, Any]:
    """`args_at(path, value)` with `value` as typed on a command line or in a form: JSON
    when it parses (`42`, `true`, `"42"`, `[1]`), else the text itself (`bob`)."""
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    except RecursionError:
        raise _bad(
            f"args value is nested too deeply to read as JSON (no job's args are nested more "
            f"than {limits.max_args_depth} levels): change the filter"
        ) from None
    return args_at(path, parsed)


def args_problem(args: object) -> str | None:
    """Why no job's args can contain `args` (not a JSON object, or not what jsonb holds: a
    NUL, a lone surrogate, NaN, deeper than `limits.max_args_depth`), or None."""
    if not isinstance(args, Mapping):
        return (
            f"args must be a JSON object the job's args contain (e.g. {{'user': 42}}), "
            f"got {args!r:.80}; use args_at(path, value) for a value under a path"
        )
    try:
        encode_json_object(
            "args", dict(args), "(filter)", limits.max_args_bytes, "limits.max_args_bytes", "values"
        )
    except InvalidJobError as exc:
        # the detail's first clause names the problem; its fix is for an enqueue, not a filter
        return f"{exc.context['detail'].split('; ')[0]}: no job's args can, change the filter"
    except TypeError:
        return f"args {args!r:.80} is not JSON: use dicts, lists, str, int, float, bool, None"
    return None


def _when(name: str, value: object) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise _bad(f"{name} must be a datetime, got {value!r:.80}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise _bad(
            f"{name} {value.isoformat()} has no time zone: give one (datetime.now(dt.UTC), "
            "or 2026-12-03T12:00:00+00:00 on the command line)"
        )
    return value


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a bulk action or a search takes: all of the conditions given (None or
    empty: no condition). Checked when made: a bad value raises ConfigurationError."""

    queue: str | None = None
    task: str | None = None
    status: str | JobStatus | tuple[str | JobStatus, ...] | None = None
    """One status or several (any of them)."""
    tag: str | tuple[str, ...] | None = None
    """One tag or several (a job must have all of them)."""
    workflow_id: str | None = None
    about: str | None = None
    """The row the jobs are about, as `<table>:<key>` text (`sqla_queue.orm`)."""
    error: str | None = None
    """Text the job's error contains, in any case: its class and message (`KeyError:
    'order'`; `queries.bulk.error_headline`), or the reason it records ("cancelled: ..."),
    never its traceback's file paths and function names (see `traceback`)."""
    traceback: str | None = None
    """Text the whole of the job's last error contains, in any case: its traceback too
    (frames, file paths, function names; `last_error ILIKE '%text%'`)."""
    finished_before: dt.datetime | None = None
    finished_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    created_after: dt.datetime | None = None
    """Times with a time zone; before is exclusive, after inclusive."""
    args: Mapping[str, Any] | None = None
    """A JSON object the job's args contain (`args @> :args`); `args_at(path, value)`
    makes one from a path."""
    waiting_for: str | None = None
    """The key of the signal the jobs wait for (`ctx.wait_for_signal`): parked jobs only."""
    statuses: tuple[JobStatus, ...] = field(init=False, repr=False, compare=False)
    tags: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for label, value in (("queue name", self.queue), ("task name", self.task)):
            if value is not None:
                validate_name(label, value)
        raw = self.status
        chosen = () if raw is None else (raw,) if isinstance(raw, str) else tuple(raw)
        object.__setattr__(
            self, "statuses", tuple(dict.fromkeys(map(admin.checked_status, chosen)))
        )
        tags = () if self.tag is None else (self.tag,) if isinstance(self.tag, str) else self.tag
        for name in tags:
            validate_name("tag", name)
        object.__setattr__(self, "tags", tuple(tags))
        if self.workflow_id is not None:
            check_workflow_id(self.workflow_id)
        if self.about is not None:
            check_about(self.about)
        if self.waiting_for is not None:
            try:
                check_signal_key(self.waiting_for, "waiting_for")
            except ValueError as exc:
                raise _bad(str(exc)) from None
        for name in ("error", "traceback"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, str)
                or not value
                or len(value) > MAX_ERROR_TEXT
                or "\x00" in value
            ):
                raise _bad(
                    f"{name} text must be 1 to {MAX_ERROR_TEXT} characters without NUL, got "
                    f"{value!r:.80}"
                )
        for name in ("finished", "created"):
            before = _when(f"{name}_before", getattr(self, f"{name}_before"))
            after = _when(f"{name}_after", getattr(self, f"{name}_after"))
            if before is not None and after is not None and after >= before:
                raise _bad(
                    f"{name}_after ({after.isoformat()}) must be earlier than {name}_before "
                    f"({before.isoformat()}): no job could match"
                )
        if self.args is not None:
            self._check_args(self.args)

    @staticmethod
    def _check_args(args: object) -> None:
        problem = args_problem(args)
        if problem is not None:
            raise _bad(problem)

    @property
    def empty(self) -> bool:
        """No condition at all: every job matches."""
        return self == JobFilter()

    def describe(self) -> str:
        """The conditions as text, for a confirmation ("queue=mail, status=failed")."""
        parts = [f"status={'|'.join(s.value for s in self.statuses)}"] if self.statuses else []
        for name in ("queue", "task", "workflow_id", "about", "error", "traceback", "waiting_for"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)!r}")
        parts += [f"tag={t!r}" for t in self.tags]
        for name in ("finished_before", "finished_after", "created_before", "created_after"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value.isoformat()}")
        if self.args is not None:
            parts.append(f"args contain {json.dumps(self.args, sort_keys=True)}")
        return ", ".join(parts) or "every job"


ACTIONS: dict[str, tuple[str, ...]] = {
    "retry": statuses(retry_by_id=True),
    "cancel": statuses(cancel=True),
    "delete": statuses(delete=True),
}
"""The statuses each bulk action takes: retry failed and cancelled, cancel queued, waiting
and running, delete all but running (as the single-job commands)."""
PAST = {"retry": "retried", "cancel": "cancelled", "delete": "deleted"}


def action_statuses(action: str, where: JobFilter) -> tuple[JobStatus, ...]:
    """The filter's statuses that `action` takes (all it takes, if the filter names none);
    ConfigurationError if it names only statuses the action does not take."""
    if action not in ACTIONS:
        raise _bad(f"action must be one of {', '.join(ACTIONS)}, got {action!r:.40}")
    takes = tuple(JobStatus(s) for s in ACTIONS[action])
    if not where.statuses:
        return takes
    chosen = tuple(s for s in where.statuses if s in takes)
    if not chosen:
        named = ", ".join(s.value for s in where.statuses)
        raise _bad(
            f"{action} takes {', '.join(s.value for s in takes)} jobs, and the filter's status "
            f"is {named}: nothing to {action}; change the status filter"
        )
    return chosen


@dataclass
class BulkResult:
    """What a bulk action did: jobs acted on, jobs matched but left alone (`skipped`; for
    retry, `held`: their unique key was held), and the batches (transactions) it took."""

    action: str
    acted: int = 0
    skipped: int = 0
    held: int = 0
    """Of `skipped`: retries left alone because another job holds their unique key."""
    batches: int = 0
    not_revived: int = 0
    """Not matched: cancelled dependents of retried jobs that stay cancelled because another
    job holds their unique key (`admin.RetriedJobs.not_revived`)."""

    @property
    def notice(self) -> str:
        """One line: "retried 300 jobs, 2 skipped: unique key held"."""
        text = f"{PAST[self.action]} {self.acted} job{'s' if self.acted != 1 else ''}"
        if self.held:
            text += f", {self.held} skipped: unique key held"
        other = self.skipped - self.held
        if other:
            text += f", {other} skipped: changed meanwhile"
        if self.not_revived:
            text += (
                f", {self.not_revived} dependent{'s' if self.not_revived != 1 else ''} left "
                "cancelled: unique key held"
            )
        return text


@dataclass(frozen=True)
class MatchedJob:
    """One job a filter matched, as a confirmation shows it."""

    id: int
    task: str
    status: str
    error: str | None
    """Its error's class and message (what `JobFilter.error` searches), or its reason."""


def sample_matching(
    bind: Connection, where: JobFilter, action: str, limit: int = 5
) -> list[MatchedJob]:
    """The first `limit` jobs (by id) `action` would take of those matching `where`: a
    sample a confirmation shows beside the count, so a filter wider than meant shows."""
    check_count("limit", limit, 1, admin.MAX_LIST_LIMIT)
    chosen = action_statuses(action, where)
    statement = statements.sample(where, chosen, held=action == "cancel")
    return [MatchedJob(**row) for row in bind.execute(statement, {"limit": limit}).mappings()]


def count_matching(bind: Connection, where: JobFilter, action: str | None = None) -> int:
    """How many jobs match `where` now; with `action`, how many that action would take
    (of the statuses it takes): what a confirmation shows before `bulk_*` runs."""
    if action is None:
        chosen: tuple[JobStatus, ...] = where.statuses
        held = True
    else:
        chosen, held = action_statuses(action, where), action == "cancel"
    return int(bind.execute(statements.count(where, chosen, held=held)).scalar_one())


Act = Callable[[Connection, list[int]], tuple[int, int, int]]
"""A batch's action: (jobs acted on, of the rest those whose unique key is held, dependents
left cancelled for their unique key)."""


def _check_engine(engine: object, batch: object) -> int:
    if not isinstance(engine, Engine):
        raise _bad(
            f"a bulk action takes an Engine (each batch commits on its own), got "
            f"{type(engine).__name__}; for a few ids in your transaction use admin.*_jobs"
        )
    return check_count("batch", batch, 1, MAX_BATCH)


def _run(
    engine: Engine,
    action: str,
    where: JobFilter,
    batch: int,
    act: Act,
    progress: Callable[[BulkResult], None] | None,
) -> BulkResult:
    batch = _check_engine(engine, batch)
    chosen = action_statuses(action, where)
    statement = statements.batch_ids(where, chosen, held=action == "cancel")
    result = BulkResult(action)
    after = 0
    while True:
        with begin_read_committed(engine) as conn:
            ids = list(conn.execute(statement, {"after_id": after, "batch": batch}).scalars().all())
            if not ids:
                return result
            acted, held, not_revived = act(conn, ids)
        result.batches += 1
        result.acted += acted
        result.held += held
        result.not_revived += not_revived
        result.skipped += len(ids) - acted
        after = ids[-1]
        if progress is not None:
            progress(result)


def bulk_retry(
    engine: Engine,
    where: JobFilter,
    *,
    batch: int = DEFAULT_BATCH,
    attempts: int | None = None,
    progress: Callable[[BulkResult], None] | None = None,
) -> BulkResult:
    """Put every failed or cancelled job matching `where` back to queued, `batch` at a
    time, each batch its own transaction (`admin.retry_jobs`: fresh budget of `attempts`,
    fenced). A unique job whose key is held (by a queued or running job, one retried in an
    earlier batch, or a lower id of the same batch) stays, counted in `skipped` and `held`;
    a retried job's cancelled dependent whose key is held stays cancelled, counted in
    `not_revived`. `progress` is called with the running totals after each batch."""
    if attempts is not None:
        check_count("attempts", attempts, 1, MAX_ATTEMPTS)

    def act(conn: Connection, ids: list[int]) -> tuple[int, int, int]:
        retried = admin.retry_jobs(conn, ids, attempts=attempts)
        return len(retried), len(retried.skipped), len(retried.not_revived)

    return _run(engine, "retry", where, batch, act, progress)


def bulk_cancel(
    engine: Engine,
    where: JobFilter,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Callable[[BulkResult], None] | None = None,
) -> BulkResult:
    """Cancel every queued, waiting or running job matching `where`, `batch` at a time
    (`admin.cancel_jobs`: the workers of running ones are told as each batch commits)."""

    def act(conn: Connection, ids: list[int]) -> tuple[int, int, int]:
        return len(admin.cancel_jobs(conn, ids)), 0, 0

    return _run(engine, "cancel", where, batch, act, progress)


def bulk_delete(
    engine: Engine,
    where: JobFilter,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Callable[[BulkResult], None] | None = None,
) -> BulkResult:
    """Delete every job matching `where` that is not running (nor cancelled with its
    handler still running), `batch` at a time (`admin.delete_jobs`), in the jobs table and
    the history (a succeeded job of a `keep` or `archive` queue)."""

    def act(conn: Connection, ids: list[int]) -> tuple[int, int, int]:
        return len(admin.delete_jobs(conn, ids)), 0, 0

    return _run(engine, "delete", where, batch, act, progress)


BULK_ACTIONS: dict[str, Callable[..., BulkResult]] = {
    "retry": bulk_retry,
    "cancel": bulk_cancel,
    "delete": bulk_delete,
}


def search_jobs(
    bind: Connection,
    where: JobFilter,
    *,
    limit: int = 50,
    before: int | None = None,
) -> list[admin.JobSummary]:
    """Jobs matching `where`, newest first, at most `limit` (1 to 1000); page on with
    `before=` the last id shown (keyset pagination)."""
    check_count("limit", limit, 1, admin.MAX_LIST_LIMIT)
    if before is not None:
        check_job_id("before", before)
    statement = statements.search(where, before=before is not None)
    rows = bind.execute(statement, {"limit": limit, "before": before}).mappings()
    return [admin.JobSummary(**row) for row in rows]
