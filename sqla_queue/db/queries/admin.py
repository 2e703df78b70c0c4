"""Day-to-day job administration: list, show, retry, delete, and a cheap queue depth."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Integer,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)

from sqla_queue.db.models import DEFAULT_MAX_ATTEMPTS, NO_TAGS
from sqla_queue.db.queries.common import (
    cancelled_held,
    history,
    job_ids_param,
    jobs,
    of_workflow,
    status_is,
)
from sqla_queue.job.states import JobStatus, statuses, unique_predicate
from sqla_queue.job.validation import INT4_MAX

LISTED_COLUMNS = (
    jobs.c.id,
    jobs.c.task,
    jobs.c.queue,
    jobs.c.status,
    jobs.c.priority,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.run_at,
    jobs.c.created_at,
    jobs.c.finished_at,
    jobs.c.tags,
    jobs.c.workflow_id,
    jobs.c.about,
)
"""What `jobs list` shows of each job: never its args, which may be large."""


HISTORY_STATUSES = (JobStatus.done, JobStatus.failed)
"""The statuses a job in the history may have (done; failed when its result could not be
stored after its commit): a list by another status reads the jobs table only."""


def list_jobs(
    *,
    queue: bool = False,
    task: bool = False,
    status: JobStatus | None = None,
    tags: bool = False,
    before: bool = False,
    workflow: bool = False,
) -> Select[Any]:
    """Jobs newest first, up to `:limit`, from the jobs table and the history; each flag
    adds its filter (`:queue`, `:task`, `:tags`: jobs having all of them, by the GIN
    index; `:before`: ids below it, the keyset cursor; `:workflow_id`: the jobs of that
    workflow, by its partial index). The status is a literal, as the partial indexes
    need. Each table is read newest first up to `:limit` (the history by its partitions'
    primary keys, merged), then the two are merged."""

    def listed(table: Any) -> Select[Any]:
        statement = select(*(table.c[c.name] for c in LISTED_COLUMNS))
        if queue:
            statement = statement.where(table.c.queue == bindparam("queue", type_=Text))
        if task:
            statement = statement.where(table.c.task == bindparam("task", type_=Text))
        if status is not None:
            statement = statement.where(status_is(status, table))
        if tags:
            statement = statement.where(
                table.c.tags.contains(bindparam("tags", type_=ARRAY(Text))),
                table.c.tags != NO_TAGS,  # the GIN index's predicate: it holds tagged jobs only
            )
        if workflow:
            statement = statement.where(*of_workflow(table))
        if before:
            statement = statement.where(table.c.id < bindparam("before", type_=BigInteger))
        return statement.order_by(table.c.id.desc()).limit(bindparam("limit", type_=Integer))

    if status is not None and status not in HISTORY_STATUSES:
        return listed(jobs)
    both = union_all(listed(jobs).subquery().select(), listed(history).subquery().select())
    merged = both.subquery("listed")
    return select(merged).order_by(merged.c.id.desc()).limit(bindparam("limit", type_=Integer))


def job_detail() -> Select[Any]:
    """The job `:job_id` from the jobs table, else from the history; `archived` says which."""
    live = select(*jobs.c, literal(False).label("archived")).where(
        jobs.c.id == bindparam("job_id", type_=BigInteger)
    )
    kept: dict[str, Any] = {c.name: history.c[c.name] for c in history.c}
    archived = select(
        *(kept[c.name] if c.name in kept else literal(None, c.type).label(c.name) for c in jobs.c),
        literal(True).label("archived"),
    ).where(history.c.id == bindparam("job_id", type_=BigInteger))
    return select(union_all(live, archived).subquery()).limit(1)


UNIQUE_KEY_INDEX = "ux_jobs_unique_key"
"""The unique index over jobs' keys (models.Job): the constraint a unique violation names."""


def retry_jobs(*, by_ids: bool, queue: bool = False) -> Select[Any]:
    """Put failed or cancelled jobs back to `queued`, due now, with a fresh attempt budget.

    By `:job_ids` (`by_ids`), else every failed job (of `:retry_queue` when `queue`; a
    parameter named like a column would set that column). One fenced statement: the rows
    are locked and the status condition is re-checked on each, so a job that another
    transaction has meanwhile requeued or deleted is left alone. The attempt number keeps
    counting (it is the fencing token a late worker is held to); the budget grows instead:
    `max_attempts` becomes attempts plus `:budget`, else plus the job's own max_attempts
    (at most INT4_MAX).

    A unique job goes back only if its key is free: no other job holds it now (see
    `unique_predicate`), and of the jobs of this retry that share it only the lowest id
    goes. Returns (id, status it had, held_by): held_by is NULL for a job retried, and for
    a job left alone the id of the job that holds its key (the holder of now, else the job
    of this retry that took it). A unique violation is still possible if another
    transaction takes a key after this statement's snapshot: run it again.
    """
    retryable = [
        JobStatus(s) for s in (statuses(retry_by_id=True) if by_ids else statuses(retry=True))
    ]
    asked = select(jobs.c.id, jobs.c.status, jobs.c.unique_key).where(
        or_(*(status_is(s) for s in retryable)), ~cancelled_held()
    )
    if by_ids:
        asked = asked.where(jobs.c.id == any_(job_ids_param()))
    if queue:
        asked = asked.where(jobs.c.queue == bindparam("retry_queue", type_=Text))
    candidates = asked.with_for_update().cte("candidates")
    other = jobs.alias("other")
    holds = and_(
        other.c.unique_key == candidates.c.unique_key,
        other.c.id != candidates.c.id,
        text(unique_predicate("other")),
    )
    ranked = (
        select(
            candidates.c.id,
            candidates.c.status,
            candidates.c.unique_key,
            func.row_number()
            .over(partition_by=candidates.c.unique_key, order_by=candidates.c.id)
            .label("nth"),
        )
        .where(or_(candidates.c.unique_key.is_(None), ~select(other.c.id).where(holds).exists()))
        .subquery("free")
    )
    # Jobs without a key all go (their NULL keys share one partition); of a key, the first.
    chosen = (
        select(ranked.c.id, ranked.c.status, ranked.c.unique_key)
        .where(or_(ranked.c.unique_key.is_(None), ranked.c.nth == 1))
        .cte("chosen")
    )
    budget = func.coalesce(
        bindparam("budget", None, type_=BigInteger), jobs.c.max_attempts, DEFAULT_MAX_ATTEMPTS
    )
    retried = (
        update(jobs)
        .where(jobs.c.id == chosen.c.id, or_(*(status_is(s) for s in retryable)))
        .values(
            status=JobStatus.queued.value,
            run_at=func.now(),
            # In bigint, capped at int4's top: a huge budget (or own max) ends at the top.
            max_attempts=func.least(jobs.c.attempts.cast(BigInteger) + budget, INT4_MAX),
            finished_at=None,
            locked_at=None,
            locked_by=None,
            heartbeat_at=None,
            lease_expires_at=None,
            started_at=None,
        )
        .returning(jobs.c.id, chosen.c.status)
        .cte("retried")
    )
    # Joins, not a subquery per row: a retry of every failed job may leave thousands.
    winner = chosen.alias("winner")
    held_by = func.coalesce(
        select(func.min(other.c.id)).where(holds).scalar_subquery(), winner.c.id
    )
    left = (
        select(candidates.c.id, candidates.c.status, held_by.label("held_by"))
        .select_from(
            candidates.outerjoin(chosen, chosen.c.id == candidates.c.id).outerjoin(
                winner, winner.c.unique_key == candidates.c.unique_key
            )
        )
        .where(chosen.c.id.is_(None))
    )
    done = select(retried.c.id, retried.c.status, literal(None, BigInteger).label("held_by"))
    return select(union_all(done, left).subquery())


NOT_REVIVED_SETTING = "sqla_queue.not_revived"
"""Where the `job_revived_unique` trigger (migration sqlaq_0016) records, for the current
transaction, each cancelled dependent a retry did not revive because another job holds its
unique key: `<id>:<holder>,` per job."""


def take_not_revived() -> Select[Any]:
    """The dependents the retries of this transaction did not revive (`NOT_REVIVED_SETTING`'s
    text, or NULL), emptied as it is read (OFFSET 0: read before it is emptied)."""
    name = literal(NOT_REVIVED_SETTING, Text)
    recorded = select(func.current_setting(name, True).label("text")).offset(0).subquery("r")
    return select(recorded.c.text, func.set_config(name, "", True))


def delete_jobs() -> Select[Any]:
    """Delete jobs `:job_ids` that are not running, and those of the history of those ids.

    Returns (id, status) of each deleted row. A running job is left alone (cancel it first),
    and so is a cancelled one whose handler still runs (it holds its queue's slot): the
    status condition is re-checked on the locked row.
    """
    ids = job_ids_param()
    live = (
        delete(jobs)
        .where(jobs.c.id == any_(ids), *(~status_is(JobStatus(s)) for s in statuses(delete=False)))
        .where(~cancelled_held())
        .returning(jobs.c.id, jobs.c.status)
        .cte("live")
    )
    archived = (
        delete(history)
        .where(history.c.id == any_(ids))
        .returning(history.c.id, history.c.status)
        .cte("archived")
    )
    return select(union_all(select(live), select(archived)).subquery())


def queue_depth() -> Select[Any]:
    """Due (capped at `:cap`), scheduled (capped) and running jobs of `:queue`.

    Due and scheduled come from the claim index (`ix_jobs_claim`: queue, priority, run_at
    over queued rows); the cap bounds the work whatever the backlog, so it can be polled
    often. Running rows are few (bounded by the workers' concurrency).
    """
    queue = bindparam("queue", type_=Text)
    cap = bindparam("cap", type_=Integer)
    queued = [jobs.c.queue == queue, status_is(JobStatus.queued)]
    one = literal_column("1", Integer)
    due = select(one).where(*queued, jobs.c.run_at <= func.now()).limit(cap).subquery()
    later = select(one).where(*queued, jobs.c.run_at > func.now()).limit(cap).subquery()
    running = select(func.count()).where(jobs.c.queue == queue, status_is(JobStatus.running))
    return select(
        select(func.count()).select_from(due).scalar_subquery().label("due"),
        select(func.count()).select_from(later).scalar_subquery().label("scheduled"),
        running.scalar_subquery().label("running"),
    )


def job_statuses() -> Select[Any]:
    """(id, status) of the jobs among `:job_ids` that exist, in the jobs table or the
    history (by each one's id index; a finished job is found wherever it is kept)."""
    ids = job_ids_param()
    live = select(jobs.c.id, jobs.c.status).where(jobs.c.id == any_(ids))
    kept = select(history.c.id, history.c.status).where(history.c.id == any_(ids))
    return select(union_all(live, kept).subquery())
