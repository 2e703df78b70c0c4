"""`sqla-queue enqueue` and `sqla-queue jobs`: one job in, single jobs looked at and acted on."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import click

from sqla_queue import admin
from sqla_queue.admin import filters as bulk
from sqla_queue.admin.signals import SignalWaitInfo, signal_waits
from sqla_queue.cli import base
from sqla_queue.cli.base import Command, Group
from sqla_queue.cli.job_filters import (
    bulk_options,
    filter_from_cli,
    filter_options,
    filters_given,
    run_bulk,
)
from sqla_queue.cli.job_options import job_options, options_from_cli
from sqla_queue.cli.types import JOB_ID, count
from sqla_queue.db.models import JobStatus
from sqla_queue.errors import InvalidJobError
from sqla_queue.job.history import MAX_ENTRIES
from sqla_queue.job.validation import MAX_ATTEMPTS, encode_json_object, limits


@click.command(cls=Command)
@click.argument("task")
@click.option("--args", "args_json", default="{}", help="The handler's keyword arguments as JSON.")
@click.option(
    "--app",
    "app_path",
    default=None,
    help="The task registry (pkg.module:name): TASK must be one of its tasks (a close name "
    "is suggested), the args must fit its handler, and the task's queue and defaults apply.",
)
@job_options
def enqueue(
    database_url: str | None, task: str, args_json: str, app_path: str | None, **options: Any
) -> None:
    """Enqueue one job of TASK and print its id (with --unique, a duplicate's: the job
    already there). With --app, checked against the registry first."""
    from sqlalchemy.orm import Session

    from sqla_queue.enqueue import enqueue as enqueue_job

    args = base.json_option(args_json, "--args")
    try:  # enqueue's own check, as a usage error naming the option
        encode_json_object(
            "args", args, task, limits.max_args_bytes, "limits.max_args_bytes", "keyword arguments"
        )
    except InvalidJobError as exc:
        raise click.BadParameter(exc.context["detail"], param_hint="--args") from None
    except TypeError as exc:
        raise click.BadParameter(str(exc), param_hint="--args") from None
    job_options = options_from_cli(options)
    registry = None if app_path is None else base.app_registry(app_path)
    with base.transaction(database_url) as conn:
        session = Session(bind=conn)
        job = enqueue_job(session, task, args, options=job_options, registry=registry)
        session.flush()
        click.echo(job.id)


@click.group(cls=Group)
def jobs() -> None:
    """Act on single jobs."""


@jobs.command("cancel")
@click.argument("job_ids", nargs=-1, type=JOB_ID)
@click.option(
    "--workflow",
    default=None,
    help="Cancel every unfinished job (queued, waiting, running) of this workflow.",
)
@filter_options(workflow=False)
@bulk_options
@click.option("--json", "as_json", is_flag=True, help="With filters: print the counts as JSON.")
def jobs_cancel(
    database_url: str | None,
    job_ids: tuple[int, ...],
    workflow: str | None,
    yes: bool,
    batch: int,
    as_json: bool,
    **filters: Any,
) -> None:
    """Cancel queued, waiting or running jobs by id, those of a workflow (--workflow), or
    every one matching the filter options (counted and confirmed first, unless --yes; in
    batches); a running handler sees ctx.cancelled, and the jobs that depend on a
    cancelled one are cancelled too (unless they run on failure).

    Exit status 1 if any id names no job or a job that had already finished (done or
    failed), or if --workflow names a workflow without any job; a job that was already
    cancelled is reported as such and is not an error."""
    where = filter_from_cli({**filters, "workflow": workflow if filters_given(filters) else None})
    if where is not None:
        if job_ids:
            raise click.UsageError("pass job ids or filter options, not both")
        run_bulk(database_url, "cancel", where, yes=yes, batch=batch, as_json=as_json)
        return
    if bool(job_ids) == (workflow is not None):
        raise click.UsageError(
            "pass job ids, --workflow or filter options, not both (and not neither)"
        )
    if workflow is not None:
        _cancel_workflow(database_url, workflow)
        return
    with base.transaction(database_url) as conn:
        cancelled = admin.cancel_jobs(conn, job_ids)
        others = admin.job_statuses(conn, [i for i in job_ids if i not in cancelled])
    why = "it already finished"
    if _report_each(job_ids, cancelled, others, "cancelled", why, already=JobStatus.cancelled):
        sys.exit(1)


def _cancel_workflow(database_url: str | None, workflow: str) -> None:
    with base.transaction(database_url) as conn:
        cancelled = admin.cancel_workflow(conn, workflow)
        known = bool(cancelled) or bool(admin.workflow_jobs(conn, workflow, limit=1))
    if not known:
        raise click.ClickException(f"no job of workflow {workflow!r} ({GONE})")
    by_status = Counter(cancelled.values())
    counts = ", ".join(f"{by_status[s.value]} {s.value}" for s in JobStatus if s in by_status)
    click.echo(
        f"workflow {workflow}: cancelled {len(cancelled)} job(s)"
        + (f" ({counts})" if counts else "; none was unfinished")
    )


@jobs.command("list")
@filter_options()
@click.option(
    "--limit",
    type=count(1, admin.MAX_LIST_LIMIT),
    default=50,
    show_default=True,
    help="Most jobs shown.",
)
@click.option("--before", type=JOB_ID, default=None, help="Ids below this only.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
def jobs_list(
    database_url: str | None,
    limit: int,
    before: int | None,
    as_json: bool,
    **filters: Any,
) -> None:
    """List jobs newest first, filtered (each filter option narrows); page on with
    --before <the last id shown>."""
    where = filter_from_cli(filters) or bulk.JobFilter()
    with base.transaction(database_url) as conn:
        found = bulk.search_jobs(conn, where, limit=limit, before=before)
    if as_json:
        base.echo_json([job.as_dict() for job in found])
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
    base.print_table(table)


@jobs.command("show")
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--traceback",
    "tracebacks",
    is_flag=True,
    help="Print each failed attempt's traceback under it (else one line per attempt).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def jobs_show(database_url: str | None, job_id: int, tracebacks: bool, as_json: bool) -> None:
    """Show one job: args, attempts ("1 of 5"), its kept result, "sleeping until" for a job
    in a durable sleep, its durable steps (name, attempt, result or error, duration), each
    failed attempt's error
    (when, which worker, its class and message), the last error with its traceback, timings,
    and in a workflow the jobs it depends on (parents) and the jobs that depend on it
    (children)."""
    with base.transaction(database_url) as conn:
        job = admin.get_job(conn, job_id)
        if job is None:
            raise click.ClickException(f"no job {job_id} ({GONE})")
        links = admin.job_links(conn, job_id)
        steps = admin.job_steps(conn, job_id)
        waits = signal_waits(conn, job_id)
        journal = admin.job_journal(conn, job_id)
    sleeping = job.sleeping_until
    if as_json:
        with base.transaction(database_url) as conn:
            base.echo_json(admin.job_in_full(conn, job_id))
        return
    for key, value in job.as_dict().items():
        if key in ("args", "meta", "last_error", "errors", "result", "max_attempts", "signal_key"):
            continue
        shown = job.attempts_text if key == "attempts" else value
        click.echo(f"{key}: {'' if shown is None else shown}")
    click.echo(f"args: {json.dumps(job.args)}")
    click.echo(f"meta: {json.dumps(job.meta)}")
    if job.result is not None:
        click.echo(f"result: {json.dumps(job.result, ensure_ascii=False)}")
    if journal.progress is not None:
        click.echo(f"progress: {journal.progress.text}")
    if sleeping is not None:
        click.echo(f"sleeping until {sleeping.isoformat()}")
    _echo_steps(steps)
    _echo_links(links)
    _echo_waits(job, waits)
    _echo_errors(job.errors or [], tracebacks)
    _echo_logs(journal.logs)
    if job.last_error:
        click.echo("last_error:")
        click.echo(job.last_error)


def _echo_logs(logs: list[admin.AttemptLog]) -> None:
    """Each attempt's kept log lines, one line each (a line's own breaks as `\\n`)."""
    for attempt in logs:
        dropped = f", {attempt.dropped} more not kept" if attempt.dropped else ""
        click.echo(f"logs of attempt {attempt.attempt} ({len(attempt.lines)} lines{dropped}):")
        for line in attempt.lines:
            message = str(line["message"]).replace("\n", "\\n")
            click.echo(f"  {line['at']} {line['level']} {line['logger']}: {message}")


def _echo_errors(errors: list[dict[str, Any]], tracebacks: bool) -> None:
    """Each failed attempt kept: attempt, when it ended, its worker, class: message (its
    first line); with `tracebacks`, its traceback indented under it."""
    if not errors:
        return
    note = (
        f", at most {MAX_ENTRIES}: the first and the latest" if len(errors) >= MAX_ENTRIES else ""
    )
    click.echo(f"errors ({len(errors)} kept{note}):")
    for entry in errors:
        message = str(entry.get("message") or "")
        first, _, more = message.partition("\n")
        click.echo(
            f"  attempt {entry.get('attempt')}  {entry.get('finished_at')}  "
            f"{entry.get('worker') or '-'}  {entry.get('class')}: {first}{' ...' if more else ''}"
        )
        traceback = entry.get("traceback")
        if tracebacks and traceback:
            for line in str(traceback).rstrip().splitlines():
                click.echo(f"    {line}")


def _echo_steps(steps: list[admin.JobStepInfo]) -> None:
    """Each durable step and sleep: name, the attempt that recorded it, its result or error
    (the first line), and how long it took."""
    if not steps:
        return
    click.echo(f"steps ({len(steps)}):")
    for step in steps:
        kind = " (sleep)" if step.kind == "sleep" else ""
        click.echo(
            f"  {step.name}{kind}  attempt {step.attempt}  {step.seconds:.3f} s  "
            f"tries {step.tries}  {step.summary}"
        )


def _echo_waits(job: admin.JobDetail, waits: list[SignalWaitInfo]) -> None:
    """The signal a parked job waits for and until when, then each of its waits."""
    if job.status == "waiting" and job.signal_key is not None:
        click.echo(f"waiting for signal: {job.signal_key} until {job.run_at}")
    if waits:
        click.echo("signal waits:")
        for wait in waits:
            click.echo(f"  {wait.describe()}")


def _echo_links(links: admin.JobLinks) -> None:
    """The parents (how each ended if gone, and what a failure of it does) and children."""
    if links.parents:
        click.echo("parents:")
        for p in links.parents:
            click.echo(f"  {p.id} {p.task or '-'} {p.state} on_failure={p.on_failure}")
    if links.children:
        click.echo("children:")
        for c in links.children:
            click.echo(f"  {c.id} {c.task or '-'} {c.state}")
        if links.more_children:
            click.echo(f"  ... (the first {len(links.children)} shown)")


@jobs.command("retry")
@click.argument("job_ids", nargs=-1, type=JOB_ID)
@click.option("--failed", "all_failed", is_flag=True, help="Retry every failed job.")
@click.option(
    "--queue", default=None, help="Only jobs of this queue (with --failed, or as a filter)."
)
@click.option(
    "--attempts",
    type=count(1, MAX_ATTEMPTS),
    default=None,
    help="Attempts each job gets again (default: its own max_attempts).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print {id: previous status} as JSON (with filters: the counts).",
)
@filter_options(queue=False)
@bulk_options
def jobs_retry(
    database_url: str | None,
    job_ids: tuple[int, ...],
    all_failed: bool,
    queue: str | None,
    attempts: int | None,
    as_json: bool,
    yes: bool,
    batch: int,
    **filters: Any,
) -> None:
    """Put failed or cancelled jobs (by id, all failed with --failed, or every one matching
    the filter options: counted and confirmed first unless --yes, then in batches) back to
    queued.

    A unique job whose key another job holds stays where it is, and is named with that job
    (with filters: counted). Exit status 1 if an id names no job or one that is not failed
    or cancelled, or if a job was left alone for its unique key."""
    if filters_given(filters) or (queue is not None and not all_failed):
        if job_ids:
            raise click.UsageError(
                "--queue goes with --failed or the other filter options; ids name their jobs"
            )
        where = filter_from_cli({**filters, "queue": queue}, ("failed",) if all_failed else ())
        assert where is not None
        run_bulk(
            database_url,
            "retry",
            where,
            yes=yes,
            batch=batch,
            as_json=as_json,
            attempts=attempts,
        )
        return
    if bool(job_ids) == all_failed:
        raise click.UsageError("pass job ids or --failed, not both (and not neither)")
    if queue is not None and not all_failed:
        raise click.UsageError("--queue goes with --failed; ids name their jobs already")
    with base.transaction(database_url) as conn:
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
        base.echo_json({str(job_id): status for job_id, status in retried.items()})
    elif all_failed:
        click.echo(f"retried {len(retried)} failed job(s)")
    for job_id, held in sorted(skipped.items()):
        click.echo(f"job {job_id}: not retried, {held.reason} ({held.status})", err=as_json)
    for job_id, held in sorted(retried.not_revived.items()):
        click.echo(
            f"job {job_id}: a dependent not revived, {held.reason} ({held.status})", err=as_json
        )
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
    err: bool = False,
    already: JobStatus | None = None,
) -> bool:
    """One line per id (on stderr when stdout carries JSON); True if any id was refused.
    A job `already` in the state asked for is reported as such, and is not refused."""
    refused = False
    for job_id in job_ids:
        if job_id in done:
            click.echo(f"job {job_id}: {verb} (was {done[job_id]})", err=err)
        elif already is not None and others.get(job_id) == already.value:
            click.echo(f"job {job_id}: already {verb}", err=err)
        elif job_id in others:
            refused = True
            click.echo(f"job {job_id}: not {verb}, {why} ({others[job_id]})", err=err)
        else:
            refused = True
            click.echo(f"job {job_id}: not {verb}, no such job ({GONE})", err=err)
    return refused


GONE = "never enqueued, or deleted once finished by its queue's retention or by prune"
"""Why an id names no job."""


@jobs.command("delete")
@click.argument("job_ids", nargs=-1, type=JOB_ID)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print {id: status it had} as JSON (with filters: the counts).",
)
@filter_options()
@bulk_options
def jobs_delete(
    database_url: str | None,
    job_ids: tuple[int, ...],
    as_json: bool,
    yes: bool,
    batch: int,
    **filters: Any,
) -> None:
    """Delete jobs by id (also those kept in the history), or every job matching the filter
    options (counted and confirmed first unless --yes, then in batches; the history too); a
    running job is refused: cancel it first.

    Exit status 1 if an id names no job or a running one."""
    where = filter_from_cli(filters)
    if (where is None) == (not job_ids):
        raise click.UsageError("pass job ids or filter options, not both (and not neither)")
    if where is not None:
        run_bulk(database_url, "delete", where, yes=yes, batch=batch, as_json=as_json)
        return
    with base.transaction(database_url) as conn:
        deleted = admin.delete_jobs(conn, job_ids)
        others = admin.job_statuses(conn, [i for i in job_ids if i not in deleted])
    if as_json:
        base.echo_json({str(job_id): status for job_id, status in deleted.items()})
    why = "it is running (cancel it first), or cancelled while its handler still runs"
    if _report_each(job_ids, deleted, others, "deleted", why, err=as_json):
        sys.exit(1)
