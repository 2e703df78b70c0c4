"""The HTTP API's request bodies and query strings as Pydantic models: one declaration that
checks what a request carries and gives the OpenAPI document its schemas."""

from __future__ import annotations

from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from sqla_queue.admin import MAX_LIST_LIMIT, JobSummary, QueueInfo, QueueScaling
from sqla_queue.admin import filters as bulk
from sqla_queue.admin.filters import JobFilter, MatchedJob
from sqla_queue.admin.jobs import WorkflowJob
from sqla_queue.admin.workers import LiveWorker, RunningJob, StoppedWorker
from sqla_queue.db.models import JobStatus
from sqla_queue.errors import ConfigurationError


class Filters(BaseModel):
    """The filters of `sqla-queue jobs list|retry|cancel|delete`, each optional: a job
    matches all of those given."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(None, description="Only jobs of this queue.")
    task: str | None = Field(None, description="Only jobs of this task.")
    status: list[JobStatus] | None = Field(None, description="Only jobs in one of these statuses.")
    tag: list[str] | None = Field(None, description="Only jobs with all of these tags.")
    workflow: str | None = Field(None, description="Only jobs of this workflow (its id).")
    about: str | None = Field(None, description="Only jobs about this row, as TABLE:KEY.")
    error: str | None = Field(
        None, description="Only jobs whose error's class and message contain this (any case)."
    )
    traceback: str | None = Field(
        None, description="Only jobs whose last error's whole text (traceback too) contains this."
    )
    waiting_for: str | None = Field(
        None, description="Only jobs parked by ctx.wait_for_signal for this signal key."
    )
    finished_before: AwareDatetime | None = Field(None, description="Finished before.")
    finished_after: AwareDatetime | None = Field(None, description="Finished at or after.")
    created_before: AwareDatetime | None = Field(None, description="Enqueued before.")
    created_after: AwareDatetime | None = Field(None, description="Enqueued at or after.")
    args: dict[str, Any] | None = Field(
        None, description='Only jobs whose args contain this JSON object ({"user": 42}).'
    )
    args_path: str | None = Field(
        None, description="With args_value: a key path in args (user.id)."
    )
    args_value: Any = Field(None, description="The value at args_path.")

    def job_filter(self, value_as_text: bool = False) -> JobFilter:
        """The `JobFilter` (ConfigurationError on a bad value); `value_as_text`: args_value
        came as text (a query string) and is read as the CLI reads it."""
        args = self.args
        if (self.args_path is None) != (self.args_value is None):
            raise ConfigurationError(detail="args_path and args_value go together")
        if self.args_path is not None:
            if args is not None:
                raise ConfigurationError(detail="pass args or args_path/args_value, not both")
            if value_as_text and isinstance(self.args_value, str):
                args = bulk.args_from_text(self.args_path, self.args_value)
            else:
                args = bulk.args_at(self.args_path, self.args_value)
        return JobFilter(
            queue=self.queue,
            task=self.task,
            status=tuple(s.value for s in self.status) if self.status else None,
            tag=tuple(self.tag) if self.tag else None,
            workflow_id=self.workflow,
            about=self.about,
            error=self.error,
            traceback=self.traceback,
            waiting_for=self.waiting_for,
            finished_before=self.finished_before,
            finished_after=self.finished_after,
            created_before=self.created_before,
            created_after=self.created_after,
            args=args,
        )


class JobSearch(Filters):
    """`GET /api/jobs`: the filters, and a page (newest first; page on with `before`)."""

    limit: int = Field(50, ge=1, le=MAX_LIST_LIMIT, description="Jobs per page.")
    before: int | None = Field(None, ge=1, description="Only jobs older than this id.")


class JobAction(Filters):
    """`POST /api/jobs/{retry,cancel,delete}`: the jobs `ids`, or every job the filters
    match (at least one filter), acted on in batches of `batch`, each its own transaction."""

    ids: list[int] | None = Field(
        None, max_length=MAX_LIST_LIMIT, description="These jobs (no filter with them)."
    )
    batch: int = Field(
        bulk.DEFAULT_BATCH, ge=1, le=bulk.MAX_BATCH, description="Jobs per batch (filters)."
    )
    attempts: int | None = Field(
        None, ge=1, description="Retry only: a fresh budget of this many attempts."
    )
    dry_run: bool = Field(
        False, description="Filters only: count the jobs the action would take, act on none."
    )


class ApiError(BaseModel):
    """Every refusal: one line naming the problem and the fix."""

    error: str


# -- answers: what each route's 200 carries (the OpenAPI document's response schemas) --------


class Answer(BaseModel):
    """An answer's model: its fields are what the JSON carries (a test validates real
    answers against the schemas)."""

    model_config = ConfigDict(extra="forbid")


class QueueEntry(Answer):
    """One queue: its settings, counts by status, and autoscaling signal."""

    name: str
    paused: bool | None = Field(description="None: jobs use the name, the queues table has no row.")
    settings: QueueInfo | None
    counts: dict[str, int] = Field(
        description="Jobs per status; `running`: handlers at work, `claimed`: held by a "
        "worker for a free handler (not started)."
    )
    estimated: list[str] = Field(description="Statuses whose count is an estimate.")
    capped: list[str] = Field(description="Statuses whose count stopped at the cap.")
    counted_seconds_ago: float
    scaling: QueueScaling | None


class QueueList(Answer):
    queues: list[QueueEntry]


class PausedQueue(Answer):
    queue: str
    paused: bool


class JobPage(Answer):
    jobs: list[JobSummary]
    next_before: int | None = Field(description="Pass as `before` for the next page.")


class JobInFull(Answer):
    """One job as `sqla-queue jobs show --json` gives it: its row, workflow links, steps,
    signal waits, progress and log lines."""

    model_config = ConfigDict(extra="allow")

    id: int
    task: str
    queue: str
    status: str
    priority: int
    attempts: int
    max_attempts: int | None
    args: dict[str, Any]
    last_error: str | None
    steps: list[dict[str, Any]]
    parents: list[dict[str, Any]]
    children: list[dict[str, Any]]
    signal_waits: list[dict[str, Any]]


class ActedOnIds(Answer):
    """An action on `ids`."""

    action: str
    acted: int
    jobs: dict[str, str] = Field(description="Each job acted on: the status it had.")
    held: dict[str, str] = Field(description="Retries left alone: why.")
    not_revived: dict[str, str]
    left_alone: list[int]


class DryRun(Answer):
    """What an action by filters would take (`dry_run`), with a sample of those jobs."""

    action: str
    dry_run: bool
    matched: int
    sample: list[MatchedJob]
    filter: str


class ActedByFilter(Answer):
    """An action by filters, in batches."""

    action: str
    acted: int
    skipped: int
    held: int
    batches: int
    not_revived: int
    notice: str
    filter: str


class Workers(Answer):
    live: list[LiveWorker]
    running: dict[str, list[RunningJob]] = Field(description="Each live worker's running jobs.")
    stopped: list[StoppedWorker]


class Workflow(Answer):
    workflow_id: str
    jobs: list[WorkflowJob]
    truncated: bool


class CancelledWorkflow(Answer):
    workflow_id: str
    cancelled: int
    jobs: dict[str, str]


class SpanTotals(Answer):
    succeeded: int
    failed: int
    retried: int
    run_seconds: float


class Stats(Answer):
    queues: dict[str, dict[str, SpanTotals]] = Field(
        description="Per queue, per span (`hour`, `day`): jobs ended, from the rollup."
    )


class DoctorFinding(Answer):
    name: str
    severity: str
    value: str
    fix: str
    details: dict[str, Any]


class DoctorFindings(Answer):
    findings: list[DoctorFinding]


class OpenApiDocument(Answer):
    """This document (OpenAPI 3.1)."""

    model_config = ConfigDict(extra="allow")

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
