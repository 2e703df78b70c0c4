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
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    configure_mappers,
    mapped_column,
    relationship,
)
from sqlalchemy.orm.instrumentation import manager_of_class

from sqla_queue.job.options import DEFAULT_MAX_ATTEMPTS as DEFAULT_MAX_ATTEMPTS
from sqla_queue.job.options import (
    OPTION_NAMES,
    JobOptions,
    column_values,
    delay_interval,
    expiry,
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
    """As `archive`, but a job whose unique key blocks its duplicates while `done` (the done
    bit in its `unique_states`) stays `done` in `jobs`, where the unique index sees it,
    until `sqla-queue prune` removes it: "once ever" holds while the row does."""
    archive = "archive"
    """The row moves to the history (`sqla_queue.jobs_history`, partitioned by finish time)
    in the finishing statement, with status `done`, and stays there until `sqla-queue
    prune` drops its partition (before sqlaq_0030_history: the unpartitioned
    `jobs_archive`); a unique key no longer blocks once its job is there."""


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


WAITS_FOR_SIGNAL = "status = 'waiting' AND signal_key IS NOT NULL"
"""A job parked by `ctx.wait_for_signal` (not one waiting for its dependencies): the
predicate of the two partial indexes a statement must spell the same to use."""
SLEEPS = "status = 'waiting' AND signal_key IS NULL AND deps_left IS NULL"
"""A job parked by a durable sleep (`ctx.sleep`): waiting for neither a signal nor a job
it depends on, `run_at` the sleep's end (migration sqlaq_0024_sleep_parked); the predicate
of `ix_jobs_sleep_end`, which a statement must spell the same to use."""


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
        # the jobs parked by ctx.wait_for_signal: a sender's wake by key, the keeper's by deadline
        Index("ix_jobs_signal_key", "signal_key", postgresql_where=text(WAITS_FOR_SIGNAL)),
        Index("ix_jobs_signal_deadline", "run_at", postgresql_where=text(WAITS_FOR_SIGNAL)),
        # the jobs parked by ctx.sleep: the keeper's wake by their end
        Index("ix_jobs_sleep_end", "run_at", postgresql_where=text(SLEEPS)),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    queue: Mapped[str] = mapped_column(
        Text,
        # No foreign key to queues.name since sqlaq_0031: triggers that lock nothing check
        # it (`QUEUE_CHECK_TRIGGERS`); `queue_row` joins on the name.
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
    max_attempts: Mapped[int | None] = mapped_column(Integer().evaluates_none())
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
    workflow_id: Mapped[str | None] = mapped_column(Text().evaluates_none())
    """The workflow it belongs to (`sqla_queue.enqueue.workflows`): shared by a canvas's jobs, or
    taken from the first job it depends on; NULL outside any workflow."""
    about: Mapped[str | None] = mapped_column(Text().evaluates_none())
    """The row it is about, as `<table>:<primary key>` (`enqueue(..., about=order)`, see
    `sqla_queue.orm`); NULL for a job about no row (migration sqlaq_0012)."""
    partition: Mapped[str | None] = mapped_column(Text().evaluates_none())
    """The partition (a tenant, say) it is for: a fair queue takes turns between them, and
    a queue's `partition_limit` caps each one's running jobs (migration sqlaq_0013)."""
    sequence: Mapped[str | None] = mapped_column(Text().evaluates_none())
    """Jobs of one sequence run one at a time, in enqueue order, across all workers."""
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True).evaluates_none())
    """Its start deadline: not started by then, it is cancelled ("expired") by the claim
    instead of running; NULL for none (`expires_in=`, `expires_at=`; migration
    sqlaq_0020_expires)."""
    deps_left: Mapped[int | None] = mapped_column(Integer)
    """While `waiting`: how many jobs it depends on have not ended yet; NULL for a job
    enqueued without `depends_on`, and for a job parked by a durable sleep (`SLEEPS`)."""
    has_dependents: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Some job depends on it: its end fires the workflow triggers (migration sqlaq_0009)."""
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    """Its error history: one entry per attempt that ended without success, at most 20
    (`sqla_queue.job.history`); NULL until its first error (migration sqlaq_0010)."""

    signal_key: Mapped[str | None] = mapped_column(Text().evaluates_none())
    """While `waiting` for a signal (`ctx.wait_for_signal`): the key it waits for, its
    `run_at` the wait's deadline; kept after, as the last key it waited for (migration
    sqlaq_0019_signals), until a durable sleep parks the job (NULL while it sleeps). NULL
    for a job that never waited for a signal."""

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
        # an option not given is left out of the INSERT the flush sends (its type
        # `evaluates_none`): head's ORM enqueue names only the columns a job uses, so it
        # writes into a schema an older release migrated, without a newer column (issue 35)
        kwargs.update(
            (name, value) for name in _OPTION_COLUMNS if (value := getattr(opts, name)) is not None
        )
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
        expires_at = expiry(opts.expires_at, opts.expires_in, error)
        if expires_at is not None:
            kwargs["expires_at"] = expires_at
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


def checked_job(values: dict[str, Any]) -> Job:
    """A `Job` of values an enqueue path has prepared and checked already (task defaults
    and insert hooks applied, `validate_job` and `validate_tags_and_meta` passed): made
    without `Job.__init__`, which would resolve its options and check them all a second
    time (profiled: the larger part of an `enqueue()` call's own Python). `values`: its
    columns by name, a None left out as `Job(...)` leaves out an option not given. No
    insert hook is due at its flush (`HOOKS_DUE`)."""
    if not Job.__mapper__.configured:  # as `Job(...)` does: the mappers are set up first
        configure_mappers()
    job = _JOB_CLASS.new_instance()
    state = job.__dict__
    state.update((name, value) for name, value in values.items() if value is not None)
    state[HOOKS_DUE] = None
    return job


_JOB_CLASS = manager_of_class(Job)


HISTORY_TABLE = "jobs_history"
"""The finished jobs `keep` and `archive` queues keep: a table partitioned by finish time
(migration sqlaq_0030_history), the hot `jobs` table's counterpart for ended rows."""
HISTORY_DEFAULT_PARTITION = "jobs_history_default"
"""The partition that takes a finished row whose finish time has no partition of its own yet
(the keeper was not running): `doctor` names the rows in it; the keeper moves them out."""
HISTORY_PERIOD_DAYS = 1
"""The default span of one history partition, in days (`Registry(history_period_days=...)`
and `sqla-queue worker --history-period-days` change it for partitions made after)."""
HISTORY_AHEAD = 3
"""How many periods ahead of now the keeper keeps history partitions made."""


class HistoryJob(QueueBase):
    """A finished job kept by a queue whose retention is `keep` or `archive`: moved out of
    `jobs` by the statement that finished it, into a partition of its finish time. Pruning
    drops whole partitions (`sqla-queue prune`); `sqla_queue.all_jobs` reads both tables."""

    __tablename__ = HISTORY_TABLE
    __table_args__ = (
        Index("ix_jobs_history_finished_at", "finished_at"),
        Index("ix_jobs_history_workflow_id", "workflow_id", postgresql_where=text(IN_WORKFLOW)),
        Index("ix_jobs_history_about", "about", postgresql_where=text(ABOUT_SOME_ROW)),
        {"postgresql_partition_by": "RANGE (finished_at)"},
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
    finished_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    """When it finished: the partition key (part of the primary key, as PostgreSQL asks)."""
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """When its last attempt's handler started (`Job.started_at`, else its claim's time)."""
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
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


HISTORY_COLUMNS: tuple[str, ...] = tuple(c.name for c in HistoryJob.__table__.c)
"""The columns a finished job keeps in history: every one a reader of finished jobs reads
(`jobs show`, results, the dashboard, the rollup, benchmarks); `sqla_queue.all_jobs` is
these columns of both tables."""


class ArchivedJob(QueueBase):
    """The unpartitioned archive of releases before sqlaq_0030_history: no longer written
    by head (an `archive` queue's jobs go to `HistoryJob`); the keeper moves any rows an
    older worker still writes here into the history, in batches."""

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
    about: Mapped[str | None] = mapped_column(Text)
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


class JobStep(QueueBase):
    """A durable step of a job (`ctx.step`, `ctx.sleep`): its recorded JSON result once done,
    or its last try's error; keyed by the job and the step's name. No foreign key to `jobs`
    (a key-share lock on hot job rows would mint MultiXacts): a statement trigger on `jobs`
    deletes a job's steps with it, whichever statement deletes the job."""

    __tablename__ = "job_steps"
    __table_args__ = (
        CheckConstraint("status IN ('done', 'failed')", name="status"),
        CheckConstraint("kind IN ('step', 'sleep')", name="kind"),
    )

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text, server_default=text("'step'"))
    """`step`, or `sleep` (a durable sleep: its result holds when it ends, `until`)."""
    status: Mapped[str] = mapped_column(Text)
    """`done` (its result is recorded: later runs get it without running the step) or
    `failed` (its last try raised: the next run of the job tries it again)."""
    attempt: Mapped[int] = mapped_column(Integer)
    """The job's attempt that wrote the row (the fence it was written under)."""
    tries: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    """How many tries of the step that attempt made (its own retry policy)."""
    result: Mapped[Any | None] = mapped_column(JSONB(none_as_null=True))
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


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
    version: Mapped[str | None] = mapped_column(Text)
    """The sqla-queue package version the worker runs (NULL: a release before 0022)."""
    schema_revision: Mapped[str | None] = mapped_column(Text)
    """The schema revision the worker's code was built for (`SCHEMA_REVISION`): what
    `sqla-queue migrate` compares with a contract revision before applying it."""
    session_pid: Mapped[int | None] = mapped_column(Integer)
    """The server process id of the connection the worker holds open while it runs (its
    LISTEN connection), as of its last heartbeat; NULL when it holds none (`poll_only`) or
    it is reconnecting. The autoscaling signal counts the worker only while that backend
    is there (`pg_stat_activity`): a SIGKILLed worker's backend ends with it."""


class SchemaRevisionKind(QueueBase):
    """An applied revision of our schema and its kind: `expand` (code built for an earlier
    revision keeps working on it) or `contract` (it removes what such code uses). Code that
    does not know a newer revision reads its kind here."""

    __tablename__ = "schema_revisions"
    __table_args__ = (CheckConstraint("kind IN ('expand', 'contract')", name="kind"),)

    revision: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    applied_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )


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


class JobProgress(QueueBase):
    """A job's latest `ctx.progress(fraction, message)`, of its latest attempt that reported
    one. A row of its own, not a column of `jobs` (no write to the hot row), with no foreign
    key (no share lock on the job row); deleted with its job by the `job_journal_gone`
    trigger (migration sqlaq_0021_progress_logs)."""

    __tablename__ = "job_progress"
    __table_args__ = (CheckConstraint("fraction >= 0 AND fraction <= 1", name="fraction"),)

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(Integer)
    fraction: Mapped[float | None] = mapped_column(Float)
    """How much is done, 0 to 1 (None: only a message)."""
    message: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )


class JobLogLines(QueueBase):
    """The log lines a job's handler emitted during one attempt (through `logging`, on its
    own thread or task), as a JSON array of `{"at", "level", "logger", "message"}`, capped
    per attempt and per line (`dropped` counts the lines past the cap). Deleted with its
    job, as `JobProgress`."""

    __tablename__ = "job_logs"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    lines: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    dropped: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class ApiIdempotencyKey(QueueBase):
    """The answer the HTTP API gave to an action sent with an `Idempotency-Key`, per token
    (its digest) and key: a retried request to any dashboard process of a fleet gets this
    answer instead of acting again. While the first request is answered, `status` is NULL
    (another request with the key is refused with 409). A row past `expires_at` counts as
    gone (a day after its answer; minutes after an answer that never came), and the API
    deletes such rows as it takes new keys (migration sqlaq_0025_api_idempotency)."""

    __tablename__ = "api_idempotency"
    __table_args__ = (Index("ix_api_idempotency_expires_at", "expires_at"),)

    caller: Mapped[str] = mapped_column(Text, primary_key=True)
    """The digest of the token that sent it (keys are per token)."""
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    request: Mapped[str] = mapped_column(Text)
    """The digest of the request (method, path, body): the same key on another request is
    refused."""
    status: Mapped[int | None] = mapped_column(Integer)
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


class Signal(QueueBase):
    """A signal in the mailbox (`sqla_queue.signal`, or the SQL function `sqla_queue.signal`):
    kept until a waiting job consumes it (`wake='one'`) or it expires (`wake='all'` is read
    by every job that waits for its key until then). No foreign key to `jobs` (a key-share
    lock on hot job rows would mint MultiXacts)."""

    __tablename__ = "signals"
    __table_args__ = (
        CheckConstraint("wake IN ('one', 'all')", name="wake"),
        Index("ix_signals_key", "key", "id"),
        Index("ix_signals_expires_at", "expires_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    key: Mapped[str] = mapped_column(Text)
    payload: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    wake: Mapped[str] = mapped_column(Text, server_default=text("'one'"))
    """`one`: one waiting job is woken and consumes it; `all`: every job waiting for its
    key is woken, and each (and each later waiter, until it expires) reads it once."""
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    """When the workers' upkeep deletes it, consumed or not."""


class SignalWait(QueueBase):
    """One `ctx.wait_for_signal` of a job: its deadline while it waits, then what it got
    (a payload, or the timeout), so a later run of the job (after a crash, a retry, a wake)
    gets the same answer without consuming another signal. Keyed by the job, the signal's
    key and the call's number among this key's waits in one run (`seq`, from 1). No foreign
    key to `jobs`; the workers' upkeep deletes the rows of jobs that no longer exist."""

    __tablename__ = "signal_waits"
    __table_args__ = (
        CheckConstraint("state IN ('waiting', 'received', 'timed_out')", name="state"),
    )

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(Text, server_default=text("'waiting'"))
    deadline: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    attempt: Mapped[int] = mapped_column(Integer)
    """The job's attempt that last wrote the row (consumption is fenced on it)."""
    signal_id: Mapped[int | None] = mapped_column(BigInteger)
    payload: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    resolved_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


SCHEMA_TRIGGERS: dict[str, tuple[str, str]] = {
    "ck_jobs_args_size": ("jobs", "sqlaq_0026_feature_tax.py (ARGS_SIZE_TRIGGER)"),
    "job_ended_update": ("jobs", "sqlaq_0015_claim_seams.py (JOB_ENDED_TRIGGER)"),
    "job_ended_delete": ("jobs", "sqlaq_0009_workflows.py (TRIGGERS)"),
    "jobs_ended_update": ("jobs", "sqlaq_0009_workflows.py (TRIGGERS)"),
    "jobs_ended_delete": ("jobs", "sqlaq_0009_workflows.py (TRIGGERS)"),
    "job_retried": ("jobs", "sqlaq_0009_workflows.py (TRIGGERS)"),
    "job_revived_unique": ("jobs", "sqlaq_0016_unique_revival.py (TRIGGER)"),
    "job_journal_gone": ("jobs", "sqlaq_0021_progress_logs.py (JOURNAL_GONE)"),
    "history_journal_gone": ("jobs_history", "sqlaq_0030_history.py (HISTORY_JOURNAL_GONE)"),
}
"""The triggers the schema at head has: name -> (table, the revision file and constant
holding its CREATE TRIGGER). Not in the models: `doctor` compares the catalogue with it."""

QUEUE_CHECK_TRIGGERS: dict[str, tuple[str, str]] = {
    name: (table, "sqlaq_0031_queue_check.py (TRIGGERS)")
    for name, table in (
        ("jobs_queue_known", "jobs"),
        ("job_queue_known", "jobs"),
        ("queue_in_use", "queues"),
        ("queue_renamed", "queues"),
    )
}
"""The triggers that refuse a job of an unknown queue (in place of the foreign key): at head
unless the opt-in `migrate --drop-queue-fk` dropped them on purpose."""

SCHEMA_FUNCTIONS: dict[str, str] = {
    "claim_slots": "sqlaq_0008_held_slots.py (CLAIM_SLOTS)",
    "claim_turns": "sqlaq_0015_claim_seams.py (CLAIM_TURNS)",
    "job_ended": "sqlaq_0015_claim_seams.py (_job_ended)",
    "jobs_ended": "sqlaq_0014_workflow_triggers.py (JOBS_ENDED)",
    "job_retried": "sqlaq_0009_workflows.py (JOB_RETRIED)",
    "job_revived_unique": "sqlaq_0016_unique_revival.py (JOB_REVIVED_UNIQUE)",
    "refuse_large_args": "sqlaq_0007_lean_claim_indexes.py (REFUSE_LARGE_ARGS)",
    "signal": "sqlaq_0019_signals.py (SIGNAL_FUNCTION)",
    "job_journal_gone": "sqlaq_0030_history.py (JOURNAL_GONE)",
    "history_period_start": "sqlaq_0030_history.py (PERIOD_START)",
    "keep_history": "sqlaq_0030_history.py (KEEP_HISTORY)",
    "history_journal_gone": "sqlaq_0030_history.py (HISTORY_JOURNAL_GONE)",
    "jobs_queue_known": "sqlaq_0031_queue_check.py (FUNCTIONS)",
    "job_queue_known": "sqlaq_0031_queue_check.py (FUNCTIONS)",
    "queue_in_use": "sqlaq_0031_queue_check.py (FUNCTIONS)",
    "queue_renamed": "sqlaq_0031_queue_check.py (FUNCTIONS)",
}
"""The functions the schema at head has: name -> the revision file and constant holding its
CREATE FUNCTION."""

WORKER_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "queues": ("SELECT",),
    "jobs": ("SELECT", "UPDATE", "DELETE"),
    "jobs_history": ("SELECT", "INSERT", "UPDATE"),
    "workers": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "queue_starts": ("SELECT", "INSERT", "DELETE"),
    "job_counts": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "stopped_workers": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "partition_weights": ("SELECT",),
    "partition_turns": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "job_deps": ("SELECT", "UPDATE"),
    "schema_revisions": ("SELECT",),
    "job_steps": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "signals": ("SELECT", "UPDATE", "DELETE"),
    "signal_waits": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "job_progress": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "job_logs": ("SELECT", "INSERT", "UPDATE", "DELETE"),
}
"""What a worker's role needs on our tables (docs/production.md, "Security"; with USAGE on
the schema): `doctor --worker-role ROLE` checks each."""
