"""The claim: the one statement that picks due jobs and marks them running, and its form that
also finishes the last batch's successes (`complete_and_claim`). A reader can audit it alone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    ARRAY,
    CTE,
    BigInteger,
    Float,
    Integer,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    case,
    column,
    delete,
    exists,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.db.models import (
    DEFAULT_MAX_ATTEMPTS,
    JobStatus,
    OnFailure,
    Retention,
)
from sqla_queue.db.queries.channels import wake_sequence_successor
from sqla_queue.db.queries.common import (
    CLAIMED_COLUMNS,
    ONE,
    ONE_SECOND,
    ZERO,
    cancelled_held,
    claimed_columns,
    held_rows,
    job_ids_param,
    jobs,
    jobs_alias,
    literal_text,
    queue_names_param,
    queue_starts,
    queues,
    status_is,
)
from sqla_queue.db.queries.workflows import deps as job_deps
from sqla_queue.job.states import HOLDS_SEQUENCE, status_in
from sqla_queue.job.validation import MAX_DURATION

# -- claim -----------------------------------------------------------------------------------

EXPIRED = "expired"
"""The reason a job not started by its `expires_at` is cancelled with, by the claim."""


TaskSettings = Mapping[str, Mapping[str, Any]]
"""The registered tasks' own settings, `{"task_leases": {task: seconds}, "task_max_attempts":
{task: n}}`, for a claim that carries them in its text rather than as parameters."""


def _json_literal(value: Mapping[str, Any]) -> Any:
    """A JSON object as a jsonb constant in the statement's text, dollar-quoted (a tag the
    text does not hold), so no quote or backslash in it needs escaping."""
    body = json.dumps(value, sort_keys=True)
    tag, n = "$j$", 0
    while tag in body:
        n += 1
        tag = f"$j{n}$"
    return literal_column(f"{tag}{body}{tag}::jsonb", JSONB)


def _task_number(
    name: str, type_: Any, table: Any = jobs, settings: TaskSettings | None = None
) -> Any:
    """`(:name ->> jobs.task)::type`: a task's own setting from a JSON object of them, or NULL.

    With `settings`, the object is a constant in the text: a plan made once for all runs
    (see `claim_jobs`) then still reads it once, where a parameter is cast to jsonb again
    for every row; and an empty object is no lookup at all (a typed NULL, which PostgreSQL
    folds away: `coalesce(NULL, x)` is `x`), so a worker whose tasks set no lease of their
    own computes none per claimed row.
    """
    if settings is not None and not settings[name]:  # no task has its own: NULL, as looked up
        return null().cast(type_)
    source = bindparam(name, {}, type_=JSONB) if settings is None else _json_literal(settings[name])
    return source[table.c.task].astext.cast(type_)


def bounded_seconds(column: Any) -> Any:
    """A queue's stored seconds within 0 to `MAX_DURATION`: one row written past what an
    interval holds (before input was bounded, or by hand) fails no statement for all queues;
    NULL stays NULL, NaN is the longest."""
    longest = literal_column(f"{MAX_DURATION:.1f}", Float)
    zero = literal_column("0.0", Float)
    return case((column > longest, longest), (column < zero, zero), else_=column)


def effective_max_attempts(table: Any = jobs, settings: TaskSettings | None = None) -> Any:
    """A job's max_attempts: its own, else its task's (`:task_max_attempts`), else the default."""
    return func.coalesce(
        table.c.max_attempts,
        _task_number("task_max_attempts", Integer, table, settings),
        literal_column(str(DEFAULT_MAX_ATTEMPTS), Integer),
    )


def _due(table: Any) -> ColumnElement[bool]:
    """A queued job whose time has come."""
    return and_(status_is(JobStatus.queued, table), table.c.run_at <= func.now())


def limited_queue(table: Any = queues) -> ColumnElement[bool]:
    """A queue with a concurrency or a rate limit, or one that takes turns (`takes_turns`): its
    claims go through `claim_slots`."""
    return or_(
        table.c.concurrency.is_not(None), table.c.rate_limit.is_not(None), takes_turns(table)
    )


def takes_turns(table: Any = queues) -> ColumnElement[bool]:
    """A fair, partition-limited or aging queue: `sqla_queue.claim_turns` picks its jobs."""
    return or_(table.c.fair, table.c.partition_limit.is_not(None), table.c.aging.is_not(None))


def sequence_free(table: Any) -> ColumnElement[bool]:
    """A job of no sequence, or one no other job of its sequence holds: no earlier one
    queued, running or waiting, nor failed in a queue whose `sequence_on_failure` is
    `hold`, no later one running (an earlier job retried while a later one runs waits), and
    none cancelled while its handler runs (`cancelled_held`: it holds its sequence until the
    handler returns). A job that depends on a failed job of its sequence through an
    `on_failure="run"` edge (a clean-up) is held neither by it nor by the jobs behind it.

    The same text as `SEQUENCE_FREE` of migration sqlaq_0015 (`claim_turns`). A job's
    earlier jobs are those of lower id: its enqueue order. Two probes, each with an index
    condition on all of `ix_jobs_sequence`'s columns (sequence, status, id), which holds
    exactly the rows that may hold a sequence: the head of a sequence reads no row; and one
    of `ix_jobs_cancelled_held` (a few rows).
    """
    e, s = jobs_alias("e"), queues.alias("s")
    skips = select(ONE).where(
        s.c.name == e.c.queue, s.c.sequence_on_failure == literal_text("skip")
    )
    f = jobs_alias("f")
    cleans_up_after = (
        select(ONE)
        .select_from(job_deps.join(f, f.c.id == job_deps.c.parent_id))
        .where(
            job_deps.c.child_id == table.c.id,
            job_deps.c.on_failure == literal_text(OnFailure.run.value),
            f.c.status == literal_column(f"'{JobStatus.failed.value}'"),
            f.c.sequence == table.c.sequence,
            f.c.id <= e.c.id,
        )
        .correlate_except(job_deps, f)  # two levels out: `table` and `e`
    )
    earlier = select(ONE).where(
        e.c.sequence == table.c.sequence,
        status_in(e.c.status, HOLDS_SEQUENCE),
        e.c.id < table.c.id,
        or_(e.c.status != literal_column(f"'{JobStatus.failed.value}'"), ~exists(skips)),
        or_(e.c.status == literal_column(f"'{JobStatus.running.value}'"), ~exists(cleans_up_after)),
    )
    r = jobs_alias("sr")  # not "r": the name of claim_turns rows
    later_running = select(ONE).where(
        r.c.sequence == table.c.sequence,
        r.c.status == literal_column(f"'{JobStatus.running.value}'"),
        r.c.id > table.c.id,
    )
    h = jobs_alias("sh")
    handler_running = select(ONE).where(cancelled_held(h), h.c.sequence == table.c.sequence)
    return or_(
        table.c.sequence.is_(None),
        and_(~exists(earlier), ~exists(later_running), ~exists(handler_running)),
    )


def _limited_queues(queue_names: Sequence[str] | None) -> CTE:
    """The limited queues with a due job, each with how many of its jobs may start now.

    `sqla_queue.claim_slots` (migration sqlaq_0006) takes the queue's advisory transaction
    lock, held until this claim commits, so claims of one limited queue take turns while
    claims of other queues never wait; it counts running jobs (less those this statement
    finishes, `:job_ids`/`:job_attempts`, when the queue deletes them) and recent starts
    with a fresh snapshot, after the lock. A queue without a due job is not locked.
    """
    x, q = jobs_alias("x"), queues.alias("q")  # short names keep the text short (see below)
    finishing = q.c.retention == literal_text(Retention.delete.value)
    slots = func.sqla_queue.claim_slots(
        q.c.name,
        q.c.concurrency,
        q.c.rate_limit,
        bounded_seconds(q.c.rate_window),
        case((finishing, job_ids_param(optional=True))),
        case((finishing, bindparam("job_attempts", None, type_=ARRAY(Integer)))),
    )
    conditions = [
        limited_queue(q),
        ~q.c.paused,
        q.c.route.is_(None),
        # a correlated LIMIT 1, probed per limited queue (an EXISTS could read every due job)
        select(true()).where(x.c.queue == q.c.name, _due(x)).limit(ONE).scalar_subquery(),
    ]
    if queue_names is not None:
        conditions.append(q.c.name == any_(queue_names_param()))
    return (
        select(
            q.c.name,
            q.c.rate_limit,
            slots.label("slots"),
            takes_turns(q).label("turns"),
            q.c.fair,
            q.c.partition_limit,
            bounded_seconds(q.c.aging).label("aging"),
            finishing.label("finishing"),
        )
        .where(*conditions)
        .cte("limited")
        .prefix_with("MATERIALIZED")
    )


def claim_jobs(
    queue_names: Sequence[str] | None,
    limits: bool = True,
    size: int | None = None,
    settings: TaskSettings | None = None,
) -> Select[Any]:
    """Claim up to `:limit` due jobs, lowest priority first, and mark them running; the
    rows come back in that order (`CLAIMED_COLUMNS`).

    Parameters: `limit` (unless `size` is given: then the text says it, which lets
    PostgreSQL plan a prepared claim once instead of on every run; see `DriverStatement`),
    `worker_id`, `lease` (seconds), `task_leases` and `task_max_attempts` (JSON objects of
    the registered tasks' own settings, unless `settings` puts them in the text), and `queues`
    (a list) when `queue_names` is given; `None` claims from every queue. Paused queues are
    skipped, and so are routed ones (their jobs are the relay's, see sqla_queue.brokers). The
    candidates CTE is MATERIALIZED so the planner cannot re-run the locking
    subquery and lock more than `limit` rows.

    Jobs of queues with a concurrency or rate limit are claimed apart, at most as many as
    `claim_slots` allows each queue (see `_limited_queues`), and each such claim records
    its starts in `queue_starts` for the rate limit; without a limited queue that branch
    reads the small queues table and nothing more. With `limits=False` the statement has
    no such branch: it claims from unlimited queues only (limited ones stay held back),
    and plans in well under half the time (0.16 against 0.39 ms). The worker uses it while
    no queue has a limit (its heartbeat tells it, `beat_worker`).

    A fair, partition-limited or aging queue is limited too, and `claim_turns` (migration
    sqlaq_0013) chooses its jobs, each with its turn and (aged) priority. A job whose
    sequence another job holds is skipped in every branch (`sequence_free`). The rows come
    back by priority, then age (a turn-taking queue's jobs as of its oldest), then turn.

    Each job's lease deadline is now plus its task's lease, else the worker's. A job whose
    next attempt would exceed its max_attempts (its last worker died mid-run) is marked
    failed here instead of running, and a job never started and past its start deadline
    (`expires_at`) is cancelled with the reason "expired" (its attempt not counted): the
    returned `status` says which.
    """
    c, k = jobs_alias("c"), jobs_alias("k")
    limit: Any = (
        bindparam("limit", type_=Integer)
        if size is None
        else literal_column(str(int(size)), Integer)
    )
    # routed queues' jobs are the relay's (sqla_queue.brokers); limited ones go below
    p = queues.alias("p")
    held_back = select(p.c.name).where(or_(p.c.paused, p.c.route.is_not(None), limited_queue(p)))
    if queue_names is None:
        # NOT IN, not NOT EXISTS: a hashed filter the planner cannot turn into an anti join
        # that would sort every due job instead of reading the claim index in order
        served = c.c.queue.not_in(held_back)
    else:
        # the held-back queues leave the list first
        listed = func.unnest(queue_names_param()).table_valued("name").render_derived("v")
        allowed = (
            select(listed.c.name)
            .where(listed.c.name.not_in(held_back))
            .cte("free")
            .prefix_with("MATERIALIZED")
        )
        # the second condition is on no row: a one-time filter that skips the scan at once
        # when every listed queue is held back (an index read in priority order would
        # otherwise walk a limited queue's whole backlog finding nothing)
        served = and_(
            c.c.queue == any_(func.array(select(allowed.c.name).scalar_subquery())),
            exists(select(allowed.c.name)),
        )
    conditions = [_due(c), served, sequence_free(c)]
    # a LIMIT the planner cannot read plans for a tenth of the rows: the index read in order
    # wins whatever the statistics (cold, it sorted all 100,000 due jobs on disk: 74 ms)
    unseen_limit = select(limit).scalar_subquery()

    def columns(t: Any) -> tuple[Any, ...]:
        # `since` and `turn`: the order among a queue's own (see `candidates` below)
        return (
            t.c.id,
            t.c.task,
            t.c.max_attempts,
            t.c.queue,
            t.c.priority,
            t.c.run_at.label("since"),
            literal_column("0", Integer).label("turn"),
        )

    def due_first(*selected: Any) -> Select[Any]:
        """The first `:limit` due jobs of unlimited queues, locked, skipping locked ones."""
        return (
            select(*selected)
            .where(*conditions)
            .order_by(c.c.priority, c.c.run_at, c.c.id)
            .limit(unseen_limit)
            .with_for_update(skip_locked=True)
        )

    if not limits:
        picked = due_first(
            c.c.id, c.c.queue, effective_max_attempts(c, settings).label("max_attempts")
        )
        return _claimed(picked.cte("candidates").prefix_with("MATERIALIZED"), settings)
    # FOR UPDATE is not allowed in a UNION's own branches: a subquery each
    free = due_first(*columns(c)).subquery("a")
    limited = _limited_queues(queue_names)
    held = (
        select(*columns(k))
        .where(k.c.queue == limited.c.name, _due(k), sequence_free(k), ~limited.c.turns)
        .order_by(k.c.priority, k.c.run_at, k.c.id)
        .limit(func.least(limited.c.slots, limit))
        .with_for_update(skip_locked=True)
        .lateral("h")
    )
    # a fair, partition-limited or aging queue: `claim_turns` picks and locks its jobs, each
    # with its turn and its priority (aged: the priority it has come to)
    t = jobs_alias("t")
    turns = (
        func.sqla_queue.claim_turns(
            limited.c.name,
            func.least(limited.c.slots, limit),
            limited.c.fair,
            limited.c.partition_limit,
            limited.c.aging,
            case((limited.c.finishing, job_ids_param(optional=True))),
            case((limited.c.finishing, bindparam("job_attempts", None, type_=ARRAY(Integer)))),
        )
        .table_valued(
            column("id", BigInteger), column("turn", Integer), column("priority", Integer)
        )
        .render_derived("r")
        .lateral()
    )
    turned = (
        select(
            t.c.id,
            t.c.task,
            t.c.max_attempts,
            t.c.queue,
            turns.c.priority,
            # the queue's turns compete with other queues' jobs as of its oldest one
            func.min(t.c.run_at).over(partition_by=t.c.queue).label("since"),
            turns.c.turn,
        )
        .select_from(limited)
        .join(turns, true())
        .join(t, t.c.id == turns.c.id)
        .where(limited.c.turns)
    )
    both = (
        select(*free.c)
        .union_all(select(*held.c).select_from(limited).join(held, true()), turned)
        .subquery("u")
    )
    # priority first (an aged job's own), then age: a plain job's run_at, and for the jobs
    # of a queue that takes turns, that queue's oldest, then their turns; the rows come
    # back in this order (`ord`), which is the order the worker starts them in
    order = (both.c.priority, both.c.since, both.c.turn, both.c.id)
    candidates = (
        select(
            both.c.id,
            both.c.queue,
            effective_max_attempts(both, settings).label("max_attempts"),
            func.row_number().over(order_by=order).label("ord"),
        )
        .order_by(*order)
        .limit(limit)
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    started = (
        insert(queue_starts)
        .from_select(
            ["queue", "started_at", "jobs"],
            select(candidates.c.queue, func.clock_timestamp(), func.count())
            .join_from(candidates, limited, limited.c.name == candidates.c.queue)
            .where(limited.c.rate_limit.is_not(None))
            .group_by(candidates.c.queue),
        )
        .cte("started")
    )
    return _claimed(candidates, settings).add_cte(started)


def _claimed(candidates: CTE, settings: TaskSettings | None) -> Select[Any]:
    """Mark `candidates` (id, queue, max_attempts, and `ord` if they have one; locked)
    running, in claim order: `ord`'s, else priority, run_at and id."""
    j = jobs_alias("j")
    ordinal = [candidates.c.ord] if "ord" in candidates.c else []
    lease = func.coalesce(
        _task_number("task_leases", Float, j, settings), bindparam("lease", 60.0, type_=Float)
    )
    exhausted = j.c.attempts >= candidates.c.max_attempts
    # checked on the claimed rows only: the plain claim reads no more rows for it. A start
    # deadline: a job that has started once (a retry, a snooze, a durable sleep or wait
    # resumed) is past it and runs on
    expired = and_(j.c.expires_at <= func.now(), j.c.attempts == ZERO)
    ended = or_(expired, exhausted)
    claimed = (
        update(j)
        .where(
            j.c.id == candidates.c.id,
            # each candidate looked up by id: without it the planner, which cannot read
            # the LIMIT, expects thousands of candidates and merge-joins them with the
            # primary key read from its first entry, through every id a drain finished
            # and VACUUM has not removed yet (a walk that grew with the drain: 0.66x)
            j.c.id == any_(func.array(select(candidates.c.id).scalar_subquery())),
        )
        .values(
            status=case(
                (expired, literal_column(f"'{JobStatus.cancelled.value}'")),
                (exhausted, literal_column(f"'{JobStatus.failed.value}'")),
                else_=literal_column(f"'{JobStatus.running.value}'"),
            ),
            attempts=case((expired, j.c.attempts), else_=j.c.attempts + ONE),
            # the budget the worker runs it with, kept for jobs show (the task's, if known)
            max_attempts=func.coalesce(
                j.c.max_attempts, _task_number("task_max_attempts", Integer, j, settings)
            ),
            locked_at=func.now(),
            heartbeat_at=func.now(),
            locked_by=bindparam("worker_id", type_=Text),
            # none for an expired job: a cancelled job with a lease is one whose handler runs
            lease_expires_at=case((expired, null()), else_=func.now() + lease * ONE_SECOND),
            started_at=null(),
            finished_at=case((ended, func.now())),
            last_error=case(
                (expired, literal_text(EXPIRED)),
                (
                    exhausted,
                    func.concat(
                        literal_text("attempt "),
                        j.c.attempts + ONE,
                        literal_text(" exceeds max_attempts "),
                        candidates.c.max_attempts,
                        literal_text(" (the previous attempt's worker stopped heartbeating)"),
                    ),
                ),
                else_=j.c.last_error,
            ),
        )
        .returning(*claimed_columns(j), j.c.priority, j.c.run_at, *ordinal)
        .cte("claimed")
    )
    # UPDATE ... RETURNING has no order: the join back may read jobs in any order
    returned = [claimed.c[column.name] for column in CLAIMED_COLUMNS]
    if ordinal:
        return select(*returned).order_by(claimed.c.ord)
    order = (claimed.c.priority, claimed.c.run_at, claimed.c.id)
    return select(*returned).order_by(*order)


def complete_and_claim(
    queue_names: Sequence[str] | None,
    limits: bool = True,
    size: int | None = None,
    settings: TaskSettings | None = None,
) -> Select[Any]:
    """Delete succeeded jobs of queues whose retention is `delete`, then `claim_jobs`, in one
    statement: one commit per cycle, not two.

    Parameters: those of both. Each claimed row also carries `finished`, how many it deleted
    (the same on every row: a count, not the ids, which 50 rows of 50 ids each cost the
    server more to send than the rest of the claim's rows). When that is fewer than the
    successes given (a queue keeps or archives, or a job is no longer ours), or nothing was
    claimed to tell, the successes all go to `complete_jobs`: it is fenced, so the ones
    deleted here match nothing there. The deleted rows were `running`, so they are never
    among the candidates.
    """
    d = jobs_alias("d")
    keeps_rows = exists().where(
        queues.c.name == d.c.queue, queues.c.retention != literal_text(Retention.delete.value)
    )
    removed = (
        delete(d).where(*held_rows(d), ~keeps_rows).returning(d.c.id, d.c.sequence).cte("removed")
    )
    finished = select(func.count()).select_from(removed).scalar_subquery().label("finished")
    # this statement's claim sees the removed jobs still holding their sequences: the
    # next of each is claimed by a later claim, which this wakes (a one-time filter: it
    # runs whether or not anything is claimed)
    woken = select(
        func.count(wake_sequence_successor(removed.c.sequence, removed.c.id))
    ).scalar_subquery()
    claim = claim_jobs(queue_names, limits, size, settings)
    return claim.add_cte(removed).add_columns(finished).where(woken >= 0)
