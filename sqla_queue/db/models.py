"""The queue's tables as SQLAlchemy models: `Queue`, `Job`, `ArchivedJob`.

They live in their own PostgreSQL schema (`sqla_queue`) and their own `MetaData`,
so they never collide with an application's `jobs` table and an application's
autogenerate can leave them alone (see `sqla_queue.db.alembic_ext`).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from sqla_queue.job.options import DEFAULT_MAX_ATTEMPTS as DEFAULT_MAX_ATTEMPTS
from sqla_queue.job.options import (
    OPTION_NAMES,
    JobOptions,
    column_values,
    delay_interval,
    options_from,
)
from sqla_queue.job.states import FINISHED_SQL, in_sql
from sqla_queue.job.states import HOLDS_SEQUENCE as SEQUENCE_HOLDERS
from sqla_queue.job.states import JobStatus as JobStatus
from sqla_queue.job.states import unique_predicate as unique_predicate

# The checks of a job's fields live in sqla_queue.job.validation; their names stay importable here.
from sqla_queue.job.validation import MAX_INT_DIGITS as MAX_INT_DIGITS
from sqla_queue.job.validation import MAX_META_BYTES as MAX_META_BYTES
from sqla_queue.job.validation import MAX_TAGS as MAX_TAGS
from sqla_queue.job.validation import PRIORITY_MAX as PRIORITY_MAX
from sqla_queue.job.validation import SCHEMA_MAX_ARGS_BYTES as SCHEMA_MAX_ARGS_BYTES
from sqla_queue.job.validation import SCHEMA_MAX_NAME_LENGTH as SCHEMA_MAX_NAME_LENGTH
from sqla_queue.job.validation import Limits as Limits
from sqla_queue.job.validation import encode_json_object as encode_json_object
from sqla_queue.job.validation import invalid_job
from sqla_queue.job.validation import limits as limits
from sqla_queue.job.validation import validate_job as validate_job
from sqla_queue.job.validation import validate_name as validate_name
from sqla_queue.job.validation import validate_tags_and_meta as validate_tags_and_meta

SCHEMA = "sqla_queue"
"""The PostgreSQL schema that holds every table of the queue."""

NOTIFY_CHANNEL = "sqla_queue"
"""The LISTEN/NOTIFY channel; the payload is the queue's name."""

DEFAULT_QUEUE = "default"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class QueueBase(DeclarativeBase):
    """Declarative base of the queue's own models (own `MetaData`, own schema).

    Not a base for an application's models: those keep their own `Base`. Its `metadata`
    is what `sqla_queue.db.alembic_ext` and `migrate` compare the queue's schema against.
    """

    metadata = MetaData(schema=SCHEMA, naming_convention=NAMING_CONVENTION)


class OnFailure(str, enum.Enum):
    """What a job does when one it depends on ends failed or cancelled."""

    cancel = "cancel"
    """It is cancelled too (and so are its own dependents), naming the job (the default)."""
    run = "run"
    """It runs anyway, once its other dependencies have ended (a clean-up job)."""


class Retention(str, enum.Enum):
    """What happens to a job that succeeded, chosen per queue."""

    delete = "delete"
    """The row is deleted at once (the default: the table stays small)."""
    keep = "keep"
    """The row stays with status `done` until `sqla-queue prune` removes it."""
    archive = "archive"
    """The row moves to `sqla_queue.jobs_archive` in the finishing statement."""


def _check_in(column: str, enum_type: type[enum.Enum]) -> str:
    return in_sql((member.value for member in enum_type), column)


def check_name(column: str) -> str:
    """The CHECK of a task or queue name's length (printable is checked in Python only)."""
    # A regular expression for control characters doubled the checks' cost per row.
    return f"char_length({column}) BETWEEN 1 AND {SCHEMA_MAX_NAME_LENGTH}"


CHECK_ARGS_OBJECT = "jsonb_typeof(args) = 'object'"
CHECK_PRIORITY = f"priority BETWEEN 0 AND {PRIORITY_MAX}"
NO_TAGS = text("'{}'::text[]")
TAGGED = text("tags <> '{}'::text[]")
"""The predicate of `ix_jobs_tags`: a query by tags states it so the index may serve it."""


UNIQUE_PREDICATE = unique_predicate()
"""Rows that block their duplicates: a key, and a status among the row's own unique states
(each status's bit is its `unique_bit` in sqla_queue.job.states.STATES)."""
NO_META = text("'{}'::jsonb")
ABOUT_SOME_ROW = "about IS NOT NULL"
"""The predicate of `ix_jobs_about`: a query by the row a job is about states it too."""
IN_WORKFLOW = "workflow_id IS NOT NULL"
"""The predicate of `ix_jobs_workflow_id`: a query by workflow states it too."""
HOLDS_SEQUENCE = f"sequence IS NOT NULL AND {in_sql(SEQUENCE_HOLDERS)}"
"""The predicate of `ix_jobs_sequence`: the jobs that may hold their sequence (a failed one
does in a queue whose `sequence_on_failure` is `hold`)."""


class Queue(QueueBase):
    """A named queue. Jobs reference it by name; pausing it stops claims from it."""

    __tablename__ = "queues"
    __table_args__ = (
        CheckConstraint(_check_in("retention", Retention), name="retention"),
        CheckConstraint(check_name("name"), name="name"),
        CheckConstraint("route IS NULL OR route ~ '^(nats|amqp):.'", name="route"),
        CheckConstraint("concurrency > 0", name="concurrency"),
        CheckConstraint(
            "(rate_limit IS NULL) = (rate_window IS NULL) AND rate_limit > 0 AND rate_window > 0",
            name="rate",
        ),
        CheckConstraint("result_ttl >= 0", name="result_ttl"),
        CheckConstraint("partition_limit > 0", name="partition_limit"),
        CheckConstraint("aging > 0", name="aging"),
        CheckConstraint("sequence_on_failure IN ('hold', 'skip')", name="sequence_on_failure"),
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    retention: Mapped[str] = mapped_column(Text, server_default=text("'delete'"))
    route: Mapped[str | None] = mapped_column(Text)
    """`nats:SUBJECT` or `amqp:EXCHANGE/ROUTING_KEY`: its jobs go to a broker (brokers package)."""
    concurrency: Mapped[int | None] = mapped_column(Integer)
    """At most this many of its jobs run at once, across all workers (None: no limit)."""
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many of its jobs start in any `rate_window` seconds (None: no limit)."""
    rate_window: Mapped[float | None] = mapped_column(Float)
    """The length in seconds of the window `rate_limit` counts starts in."""
    result_ttl: Mapped[float] = mapped_column(Float, server_default=text("86400"))
    """Seconds a kept result stays readable when the queue's retention deletes its jobs."""
    fair: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Claims take its due jobs round-robin across their partitions (migration sqlaq_0013)."""
    partition_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many of its jobs of one partition run at once, across all workers."""
    aging: Mapped[float | None] = mapped_column(Float)
    """Seconds after which a waiting job's priority improves one step (None: never)."""
    sequence_on_failure: Mapped[str] = mapped_column(Text, server_default=text("'hold'"))
    """`hold`: a failed job of a sequence holds it until retried or deleted;
    `skip`: the sequence goes on past it."""
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )

    jobs: Mapped[list[Job]] = relationship(
        back_populates="queue_row",
        primaryjoin="Queue.name == foreign(Job.queue)",
        viewonly=True,
    )

    def __repr__(self) -> str:
        return f"Queue(name={self.name!r}, paused={self.paused!r}, retention={self.retention!r})"


HOOKS_DUE = "_sqla_queue_hooks_due"
"""Instance key of a constructed Job: the fields not given while its insert hooks are due,
None once they ran (absent: a Job made without `__init__`, e.g. by `session.merge`)."""
UNIQUE_DUE = "_sqla_queue_unique"
"""Instance key of a constructed Job's `unique=` option (None: the task's default)."""
LINKS_DUE = "_sqla_queue_links"
"""Instance key of a Job enqueued with `depends_on`: (depends_on, on_failure), linked once
the job and its parents have ids (`sqla_queue.enqueue.inserts.links`)."""
DELAY_DUE = "_sqla_queue_delay"
"""Instance key of a constructed Job's `delay=` as an interval (its run_at is now() plus it)."""
_TASK_DEFAULTED = frozenset(OPTION_NAMES)
"""A Job's options a task's default may fill in at flush, where not given."""


class Job(QueueBase):
    """A unit of work: `task` called with `args` as keyword arguments.

    Add one to a session beside your own objects (`session.add(Job(task=..., args=...))`)
    or call `sqla_queue.enqueue`; it becomes visible to workers when that transaction commits.
    """

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_check_in("status", JobStatus), name="status"),
        CheckConstraint("max_attempts IS NULL OR max_attempts > 0", name="max_attempts"),
        CheckConstraint(check_name("task"), name="task_name"),
        CheckConstraint(check_name("queue"), name="queue_name"),
        CheckConstraint(CHECK_ARGS_OBJECT, name="args_object"),
        CheckConstraint(CHECK_PRIORITY, name="priority"),
        Index(
            "ix_jobs_claim",
            "queue",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("status = 'queued'"),
        ),
        Index(
            "ix_jobs_claim_any_queue",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("status = 'queued'"),
        ),
        Index(
            "ix_jobs_lease_expires_at",
            "lease_expires_at",
            postgresql_where=text("status = 'running'"),
        ),
        Index(
            "ix_jobs_cancelled_held",
            "queue",
            postgresql_where=text("status = 'cancelled' AND lease_expires_at IS NOT NULL"),
        ),
        Index(
            "ix_jobs_finished",
            "finished_at",
            postgresql_where=text(FINISHED_SQL),
        ),
        CheckConstraint("jsonb_typeof(meta) = 'object'", name="meta_object"),
        # tagged jobs only: a filter by tags must say `tags <> '{}'` too (`TAGGED`)
        Index("ix_jobs_tags", "tags", postgresql_using="gin", postgresql_where=TAGGED),
        Index(
            "ix_jobs_kept_results",
            "finished_at",
            postgresql_where=text("status = 'done' AND result IS NOT NULL"),
        ),
        Index(
            "ux_jobs_unique_key",
            "unique_key",
            unique=True,
            postgresql_where=text(UNIQUE_PREDICATE),
        ),
        Index("ix_jobs_workflow_id", "workflow_id", postgresql_where=text(IN_WORKFLOW)),
        Index("ix_jobs_about", "about", postgresql_where=text(ABOUT_SOME_ROW)),
        # the few waiting jobs, for doctor and stats without a scan of the table
        Index("ix_jobs_waiting", "id", postgresql_where=text("status = 'waiting'")),
        # a fair queue's partitions and each one's first due jobs (sqla_queue.claim_turns);
        # `priority >= 0` (true of every row) keeps any other query from using it (sqlaq_0013)
        Index(
            "ix_jobs_partition_claim",
            "queue",
            "partition",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("status = 'queued' AND priority >= 0"),
        ),
        Index(
            "ix_jobs_partition_running",
            "queue",
            "partition",
            postgresql_where=text("status = 'running' AND partition IS NOT NULL"),
        ),
        Index(
            "ix_jobs_sequence", "sequence", "status", "id", postgresql_where=text(HOLDS_SEQUENCE)
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    queue: Mapped[str] = mapped_column(
        Text,
        ForeignKey(f"{SCHEMA}.queues.name", onupdate="CASCADE"),
        server_default=text(f"'{DEFAULT_QUEUE}'"),
    )
    task: Mapped[str] = mapped_column(Text)
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    status: Mapped[str] = mapped_column(Text, server_default=text("'queued'"))
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    run_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int | None] = mapped_column(Integer)
    locked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    locked_by: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """While running: when the reaper may requeue it (claim and heartbeats set it)."""
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """While running: when its handler started, as the worker's heartbeat reported it."""
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=NO_TAGS)
    """Names to find the job by (`sqla-queue jobs list --tag`); GIN-indexed."""
    meta: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=NO_META)
    """Context that is not the handler's arguments (trace ids, who enqueued it)."""
    unique_key: Mapped[bytes | None] = mapped_column(LargeBinary)
    """A unique job's key (SHA-256, see `sqla_queue.job.unique`); NULL for other jobs."""
    unique_states: Mapped[int | None] = mapped_column(SmallInteger)
    """The statuses (as bits) in which this job blocks its duplicates."""
    result: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    """What its handler returned, when its task keeps results (`keep_result=True`)."""
    workflow_id: Mapped[str | None] = mapped_column(Text)
    """The workflow it belongs to (`sqla_queue.enqueue.workflows`): shared by a canvas's jobs, or
    taken from the first job it depends on; NULL outside any workflow."""
    about: Mapped[str | None] = mapped_column(Text)
    """The row it is about, as `<table>:<primary key>` (`enqueue(..., about=order)`, see
    `sqla_queue.orm`); NULL for a job about no row (migration sqlaq_0012)."""
    partition: Mapped[str | None] = mapped_column(Text)
    """The partition (a tenant, say) it is for: a fair queue takes turns between them, and
    a queue's `partition_limit` caps each one's running jobs (migration sqlaq_0013)."""
    sequence: Mapped[str | None] = mapped_column(Text)
    """Jobs of one sequence run one at a time, in enqueue order, across all workers."""
    deps_left: Mapped[int | None] = mapped_column(Integer)
    """While `waiting`: how many jobs it depends on have not ended yet; NULL for a job
    enqueued without `depends_on`."""
    has_dependents: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Some job depends on it: its end fires the workflow triggers (migration sqlaq_0009)."""
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    """Its error history: one entry per attempt that ended without success, at most 20
    (`sqla_queue.job.history`); NULL until its first error (migration sqlaq_0010)."""

    duplicate = False
    """Set True on the job `enqueue(..., unique=...)` returns when one with the same key was
    there already (the returned job is that one); not a column."""

    queue_row: Mapped[Queue | None] = relationship(
        back_populates="jobs",
        primaryjoin="Queue.name == foreign(Job.queue)",
        viewonly=True,
    )

    __mapper_args__ = {"eager_defaults": False}

    def __init__(self, *, options: JobOptions | None = None, **kwargs: Any) -> None:
        task = kwargs.get("task")
        error = invalid_job(task if isinstance(task, str) else repr(task))
        given = {name: kwargs.pop(name) for name in OPTION_NAMES if name in kwargs}
        opts = options_from("Job(...)", options, given, error)
        not_given = _TASK_DEFAULTED - opts.given().keys()
        if kwargs.get("args") is None:  # as enqueue takes it: no args
            kwargs["args"] = {}
        kwargs.update((name, getattr(opts, name)) for name in _OPTION_COLUMNS)
        kwargs["queue"] = DEFAULT_QUEUE if opts.queue is None else opts.queue
        kwargs["priority"] = 0 if opts.priority is None else opts.priority
        kwargs["tags"], _ = validate_tags_and_meta(task, opts.tags, opts.meta)
        kwargs["meta"] = {} if opts.meta is None else opts.meta
        validate_job(
            task,
            kwargs["args"],
            kwargs["queue"],
            kwargs["priority"],
            opts.run_at,
            column_values(opts),
        )
        interval = delay_interval(opts.run_at, opts.delay, error)
        if interval is not None:
            kwargs["run_at"] = func.now() + interval
        elif opts.run_at is not None:
            kwargs["run_at"] = opts.run_at
        super().__init__(**kwargs)
        # The flush hook (sqla_queue.enqueue) pops them: task defaults and insert hooks are due.
        self.__dict__[HOOKS_DUE] = not_given
        self.__dict__[UNIQUE_DUE] = opts.unique
        if opts.depends_on is not None:
            self.__dict__[LINKS_DUE] = (opts.depends_on, opts.on_failure)
        elif opts.on_failure is not None:
            self.__dict__[LINKS_DUE] = (None, opts.on_failure)
        if interval is not None:
            self.__dict__[DELAY_DUE] = interval

    def __repr__(self) -> str:
        return (
            f"Job(id={self.id!r}, task={self.task!r}, queue={self.queue!r}, "
            f"status={self.status!r}, attempts={self.attempts!r})"
        )


_OPTION_COLUMNS = tuple(
    name for name in OPTION_NAMES if name in Job.__table__.c and name not in ("run_at", "meta")
)
"""The options a `Job` stores as given (run_at may come from a delay; meta defaults to {})."""


class ArchivedJob(QueueBase):
    """A finished job moved out of `jobs` by a queue whose retention is `archive`."""

    __tablename__ = "jobs_archive"
    __table_args__ = (
        Index("ix_jobs_archive_finished_at", "finished_at"),
        Index("ix_jobs_archive_workflow_id", "workflow_id", postgresql_where=text(IN_WORKFLOW)),
        Index("ix_jobs_archive_about", "about", postgresql_where=text(ABOUT_SOME_ROW)),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    queue: Mapped[str] = mapped_column(Text)
    task: Mapped[str] = mapped_column(Text)
    args: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(SmallInteger)
    run_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer)
    max_attempts: Mapped[int | None] = mapped_column(Integer)
    locked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    locked_by: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=NO_TAGS)
    meta: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=NO_META)
    result: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    workflow_id: Mapped[str | None] = mapped_column(Text)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    """Its error history, as the job kept it (`Job.errors`)."""
    about: Mapped[str | None] = mapped_column(Text)
    """The row it was about (`Job.about`)."""
    partition: Mapped[str | None] = mapped_column(Text)
    sequence: Mapped[str | None] = mapped_column(Text)


class JobDependency(QueueBase):
    """An edge of a workflow: `child_id` waits for `parent_id` (no foreign keys: a key-share
    lock on hot job rows would mint MultiXacts). `parent_status` records how the parent
    ended, written in the transaction that ended it, so the edge outlives the parent's row."""

    __tablename__ = "job_deps"
    __table_args__ = (
        CheckConstraint(_check_in("on_failure", OnFailure), name="on_failure"),
        Index("ix_job_deps_child_id", "child_id", "position"),
    )

    parent_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    child_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    position: Mapped[int] = mapped_column(Integer)
    """Where the parent stands in the child's `depends_on` (its `ctx.parent_results()` order)."""
    on_failure: Mapped[str] = mapped_column(Text, server_default=text("'cancel'"))
    """What the parent's failure or cancel does to the child: cancel it, or let it run."""
    parent_status: Mapped[str | None] = mapped_column(Text)
    """How the parent ended (done, failed, cancelled); NULL while it has not."""


class PartitionWeight(QueueBase):
    """A partition's share of a fair queue: one with weight 2 gets twice the turns of one
    with weight 1 (the weight of a partition without a row; `admin.set_partition_weight`)."""

    __tablename__ = "partition_weights"
    __table_args__ = (CheckConstraint("weight > 0 AND weight <= 1000", name="weight"),)

    queue: Mapped[str] = mapped_column(
        Text,
        ForeignKey(f"{SCHEMA}.queues.name", onupdate="CASCADE", ondelete="CASCADE"),
        primary_key=True,
    )
    partition: Mapped[str] = mapped_column(Text, primary_key=True)
    weight: Mapped[float] = mapped_column(Float)


class PartitionTurn(QueueBase):
    """When a fair queue last served a partition (`''`: its jobs without one), written by
    the claim (`sqla_queue.claim_turns`): among partitions with as many running jobs, the
    one served longest ago goes first. No foreign key: every claim writes these rows."""

    __tablename__ = "partition_turns"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[str] = mapped_column(Text, primary_key=True)
    served_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


class QueueStart(QueueBase):
    """Jobs a claim started in a rate-limited queue: what `rate_limit` counts (pruned as
    windows pass, by the claim itself)."""

    __tablename__ = "queue_starts"
    __table_args__ = (Index("ix_queue_starts_queue_started_at", "queue", "started_at"),)
    __mapper_args__ = {"primary_key": ["queue", "started_at"]}

    queue: Mapped[str] = mapped_column(
        Text, ForeignKey(f"{SCHEMA}.queues.name", onupdate="CASCADE", ondelete="CASCADE")
    )
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    jobs: Mapped[int] = mapped_column(Integer)


class WorkerRegistration(QueueBase):
    """A live worker, registered at start and kept alive by its own fast heartbeat.

    Once `expires_at` has passed, any worker's reaper requeues the jobs it holds at once,
    without waiting for their leases: a SIGKILLed worker's jobs come back within seconds.
    """

    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_expires_at", "expires_at"),)

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    concurrency: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    heartbeat_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    loop_blocked_since: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """Since when the worker's event loop has not run (an async handler calls blocking
    code), as of its last heartbeat; NULL while it runs. `doctor` warns of it."""
    overruns: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    """Handlers past their timeout or cancel that have not returned, as of its last
    heartbeat (job, task, queue, reason, seconds); NULL when there is none. Each still
    holds its slot; `doctor` and the metrics report them."""


class BrokerDone(QueueBase):
    """Ids of relayed jobs a broker worker finished: its consumer-side de-duplication record."""

    __tablename__ = "broker_done"
    __table_args__ = (Index("ix_broker_done_done_at", "done_at"),)

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    done_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )


class PeriodicSlot(QueueBase):
    """A slot a periodic job was enqueued for: the primary key lets exactly one worker win."""

    __tablename__ = "periodic_slots"

    task: Mapped[str] = mapped_column(Text, primary_key=True)
    slot: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    enqueued_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )


class JobCount(QueueBase):
    """Jobs finished per minute, per queue and task: the rollup the workers write (each
    adds its own counts about once a minute), so charts and `stats` read a few hundred
    rows whatever the jobs table holds. Kept for `ROLLUP_KEEP` (a day), then pruned."""

    __tablename__ = "job_counts"

    minute: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    """The minute the jobs ended in (truncated, UTC)."""
    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    task: Mapped[str] = mapped_column(Text, primary_key=True)
    succeeded: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    failed: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """Attempts that ended the job failed (its last attempt raised, or it was lost)."""
    retried: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """Attempts that raised and were scheduled again."""
    run_seconds: Mapped[float] = mapped_column(Float, server_default=text("0"))
    """The handlers' run time summed over those attempts (divide for the mean)."""


class StoppedWorker(QueueBase):
    """A worker that stopped: gracefully (it deregistered) or lost (its registration
    expired, and the reaper took its jobs back). Kept for a day, for the workers page."""

    __tablename__ = "stopped_workers"
    __table_args__ = (
        CheckConstraint("how IN ('graceful', 'lost')", name="how"),
        Index("ix_stopped_workers_stopped_at", "stopped_at"),
    )

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    concurrency: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    """Its last heartbeat."""
    stopped_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    """When it deregistered, or when a reaper found it expired."""
    how: Mapped[str] = mapped_column(Text)
    """`graceful` or `lost`."""
