"""The queue's tables as SQLAlchemy models: `Queue`, `Job`, `ArchivedJob`.

They live in their own PostgreSQL schema (`sqla_queue`) and their own `MetaData`,
so they never collide with an application's `jobs` table and an application's
autogenerate can leave them alone (see `sqla_queue.alembic_ext`).
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
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

from .bounds import PRIORITY_MAX as PRIORITY_MAX
from .bounds import invalid_job
from .errors import ConfigurationError, InvalidJobError
from .job.options import OPTION_NAMES, JobOptions, check_fields, delay_interval, options_from

SCHEMA = "sqla_queue"
"""The PostgreSQL schema that holds every table of the queue."""

NOTIFY_CHANNEL = "sqla_queue"
"""The LISTEN/NOTIFY channel; the payload is the queue's name."""

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


SCHEMA_MAX_ARGS_BYTES = 1_000_000
"""The largest `args` (as jsonb text) the schema admits: the trigger ck_jobs_args_size
(migration sqlaq_0007; a CHECK constraint before it) refuses larger ones."""
SCHEMA_MAX_NAME_LENGTH = 200
"""The longest task or queue name the schema's CHECK constraints admit."""
MAX_INT_DIGITS = 4300
"""Python's default limit on int <-> str conversion: a worker could not decode a longer int."""


@dataclass
class Limits:
    """Bounds that enqueue enforces; change them on `sqla_queue.limits` at start-up.

    They may be lowered freely; the database's CHECK constraints hold the size and name
    limits at their defaults whatever is set here, so they cannot be raised above them.
    """

    max_args_bytes: int = SCHEMA_MAX_ARGS_BYTES
    """The largest `args`, as JSON text, that a job may carry."""
    max_name_length: int = SCHEMA_MAX_NAME_LENGTH
    """The longest task or queue name."""
    max_args_depth: int = 100
    """The deepest nesting of lists and dicts in `args` (a worker decodes them recursively)."""

    def __setattr__(self, name: str, value: Any) -> None:
        ceiling = _LIMIT_CEILINGS.get(name)
        if ceiling is not None and (not isinstance(value, int) or not 0 < value <= ceiling):
            raise ConfigurationError(
                detail=f"limits.{name} must be an int from 1 to {ceiling} (the schema's "
                f"CHECK constraint holds it there), got {value!r}"
            )
        super().__setattr__(name, value)


_LIMIT_CEILINGS = {
    "max_args_bytes": SCHEMA_MAX_ARGS_BYTES,
    "max_name_length": SCHEMA_MAX_NAME_LENGTH,
    "max_args_depth": 500,
}

limits = Limits()

_HUGE_INT = 10**MAX_INT_DIGITS
# Fast pre-checks on the JSON text; only a hit costs a walk of the args.
_LONG_DIGIT_RUN = re.compile(rf"\d{{{MAX_INT_DIGITS + 1}}}")
_EXPONENT = re.compile(r"\de[-+]\d")


# A \u0000 escape in json.dumps output (not an escaped backslash followed by "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A surrogate escape that is not half of a pair (a str from surrogateescape decoding).
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f])"
)


def _reject_non_json(value: object) -> object:
    raise TypeError(f"{type(value).__name__} value {value!r:.80}")


_ENCODER = json.JSONEncoder(allow_nan=False, default=_reject_non_json)
"""Built once: `json.dumps` with options builds an encoder per call (profiled: bulk enqueue)."""


def validate_name(label: str, value: object, task: str) -> None:
    """A task or queue name: a non-empty printable string within `limits.max_name_length`."""
    if not isinstance(value, str) or not value:
        raise InvalidJobError(task=task, detail=f"{label} must be a non-empty string")
    if len(value) > limits.max_name_length:
        raise InvalidJobError(
            task=task[:60],
            detail=f"{label} name is {len(value)} characters; the limit is "
            f"{limits.max_name_length} (sqla_queue.limits.max_name_length)",
        )
    if not value.isprintable():
        raise InvalidJobError(task=task[:60], detail=f"{label} name has control characters")


def _args_problem(args: object, max_depth: int, label: str = "args") -> str | None:
    """Why decoding `args` would fail in a worker (too deep, too long an int), or None."""
    stack: list[tuple[object, int]] = [(args, 0)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children: Iterable[object] = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            if isinstance(value, int) and abs(value) >= _HUGE_INT:
                return (
                    f"{label} hold an integer of more than {MAX_INT_DIGITS} digits, which a "
                    "worker cannot decode (Python's int max str digits); pass it as a string"
                )
            continue
        if level >= max_depth:
            return (
                f"{label} are nested more than {max_depth} levels deep (sqla_queue.limits."
                "max_args_depth); a worker decodes them recursively: flatten them"
            )
        stack.extend((child, level + 1) for child in children)
    return None


def encode_json_object(
    label: str, value: object, name: str, max_bytes: int, limit_name: str, what: str
) -> str:
    """`value` (a dict with str keys) as JSON text PostgreSQL's jsonb can store and a worker
    can decode; `InvalidJobError` or `TypeError` naming `label`, the task and the fix."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidJobError(
            task=name,
            detail=f"{label} must be a dict of {what} with str keys, got {type(value).__name__}",
        )
    try:
        encoded = _ENCODER.encode(value)
    except (RecursionError, ValueError) as exc:
        problem = _args_problem(value, limits.max_args_depth, label)
        if problem is None and isinstance(exc, RecursionError):
            problem = f"{label} are nested too deeply (or refer to themselves) to encode as JSON"
        if problem is None:
            raise TypeError(
                f"{label} of task {name!r} are not JSON-serialisable: {exc}. "
                "Pass only dicts, lists, str, int, float, bool and None (e.g. ids, not objects)."
            ) from None
        raise InvalidJobError(task=name, detail=problem) from None
    except TypeError as exc:
        raise TypeError(
            f"{label} of task {name!r} are not JSON-serialisable: {exc}. "
            "Pass only dicts, lists, str, int, float, bool and None (e.g. ids, not objects)."
        ) from None
    # Each scan of the text below runs only when a cheap test says it may find something:
    # the text is ASCII (ensure_ascii), so a NUL or a surrogate can only be a \u escape.
    size = len(encoded)
    if (size > MAX_INT_DIGITS and _LONG_DIGIT_RUN.search(encoded)) or encoded.count(
        "["
    ) + encoded.count("{") > limits.max_args_depth:
        problem = _args_problem(value, limits.max_args_depth, label)
        if problem is not None:
            raise InvalidJobError(task=name, detail=problem)
    if ("e+" in encoded or "e-" in encoded) and _EXPONENT.search(encoded):
        size += _jsonb_growth(value)  # a float in exponent form, perhaps: see _jsonb_growth
    if size > max_bytes:
        stored = f" as jsonb ({len(encoded)} as JSON text)" if size != len(encoded) else " as JSON"
        raise InvalidJobError(
            task=name,
            detail=f"{label} are {size} bytes{stored}; the limit is {max_bytes} "
            f"({limit_name}). Store large payloads elsewhere and pass a key.",
        )
    if "\\u" not in encoded:
        return encoded
    if _NUL_ESCAPE.search(encoded):
        raise InvalidJobError(
            task=name,
            detail=f"{label} contain a NUL character (\\u0000), which PostgreSQL's jsonb cannot "
            "store; encode binary data, e.g. as base64",
        )
    if _LONE_SURROGATE.search(encoded):
        raise InvalidJobError(
            task=name,
            detail=f"{label} contain a lone surrogate (a str that is not valid Unicode, e.g. "
            "decoded with surrogateescape), which PostgreSQL's jsonb cannot store",
        )
    return encoded


def _jsonb_growth(args: object) -> int:
    """How much longer `args` are as jsonb text than as JSON text: floats in exponent form.

    jsonb stores numbers as `numeric`, which writes them out in full: `1e+300` (6 characters)
    is 301 digits as jsonb text, which the schema's size CHECK measures. Nothing else grows.
    """
    growth = 0
    stack = [args]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, float) and "e" in (short := repr(value)):
            growth += len(format(Decimal(short), "f")) - len(short)
    return growth


def validate_job(
    task: object,
    args: object,
    queue: object,
    priority: object,
    max_attempts: object,
    run_at: object,
    names_checked: bool = False,
) -> str:
    """Check a job's fields before it reaches the database; returns `args` as JSON text.

    Raises `InvalidJobError` (a ValueError) for a bad field and `TypeError` for args that
    are not JSON-serialisable, each naming the task and the fix. `names_checked`: the task
    and queue names passed this check already (bulk enqueue checks each pair once).
    """
    name = task if isinstance(task, str) else repr(task)
    if not names_checked:
        validate_name("task", task, name)
        validate_name("queue", queue, name)
    encoded = encode_json_object(
        "args",
        args,
        name,
        limits.max_args_bytes,
        "sqla_queue.limits.max_args_bytes",
        "keyword arguments",
    )
    check_fields(priority, max_attempts, run_at, invalid_job(name))
    return encoded


MAX_META_BYTES = 100_000
"""The largest `meta` (as JSON text) a job may carry: context for tracing and tools, not data."""
MAX_TAGS = 50
"""The most tags one job may carry."""


def validate_tags_and_meta(task: object, tags: object, meta: object) -> tuple[list[str], str]:
    """A job's `tags` (a list of names; None is none) and `meta` (a dict; None is empty):
    returns the tags without repeats, in order, and meta as JSON text."""
    if (
        not tags
        and not meta
        and (tags is None or type(tags) is list)
        and (meta is None or type(meta) is dict)
    ):
        return [], "{}"  # the common case, nothing to check: skip the encoder (bulk enqueue)
    name = task if isinstance(task, str) else repr(task)
    if tags is None:
        tags = []
    if isinstance(tags, str) or not isinstance(tags, (list, tuple, set, frozenset)):
        raise InvalidJobError(
            task=name, detail=f"tags must be a list of str (tags=['billing']), got {tags!r:.60}"
        )
    for tag in tags:
        validate_name("tag", tag, name)
    unique = list(dict.fromkeys(tags))
    if len(unique) > MAX_TAGS:
        raise InvalidJobError(
            task=name, detail=f"a job has at most {MAX_TAGS} tags, got {len(unique)}"
        )
    encoded = encode_json_object(
        "meta",
        {} if meta is None else meta,
        name,
        MAX_META_BYTES,
        "sqla_queue.models.MAX_META_BYTES",
        "JSON values",
    )
    return unique, encoded


class Base(DeclarativeBase):
    """Declarative base of the queue's own models (own `MetaData`, own schema)."""

    metadata = MetaData(schema=SCHEMA, naming_convention=NAMING_CONVENTION)


class JobStatus(str, enum.Enum):
    """Where a job is in its life."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


class Retention(str, enum.Enum):
    """What happens to a job that succeeded, chosen per queue."""

    delete = "delete"
    """The row is deleted at once (the default: the table stays small)."""
    keep = "keep"
    """The row stays with status `done` until `sqla-queue prune` removes it."""
    archive = "archive"
    """The row moves to `sqla_queue.jobs_archive` in the finishing statement."""


def _check_in(column: str, enum_type: type[enum.Enum]) -> str:
    values = ", ".join(f"'{member.value}'" for member in enum_type)
    return f"{column} IN ({values})"


def check_name(column: str) -> str:
    """The CHECK of a task or queue name's length (printable is checked in Python only)."""
    # A regular expression for control characters doubled the checks' cost per row.
    return f"char_length({column}) BETWEEN 1 AND {SCHEMA_MAX_NAME_LENGTH}"


CHECK_ARGS_OBJECT = "jsonb_typeof(args) = 'object'"
CHECK_PRIORITY = f"priority BETWEEN 0 AND {PRIORITY_MAX}"
NO_TAGS = text("'{}'::text[]")
TAGGED = text("tags <> '{}'::text[]")
"""The predicate of `ix_jobs_tags`: a query by tags states it so the index may serve it."""


def unique_predicate(table: str = "") -> str:
    """`UNIQUE_PREDICATE` over the columns of `table` (an alias name), or unqualified."""
    of = f"{table}." if table else ""
    return (
        f"{of}unique_key IS NOT NULL AND ({of}unique_states & CASE {of}status "
        "WHEN 'queued' THEN 1 WHEN 'running' THEN 2 WHEN 'done' THEN 4 WHEN 'failed' THEN 8 "
        "WHEN 'cancelled' THEN 16 ELSE 0 END) <> 0"
    )


UNIQUE_PREDICATE = unique_predicate()
"""Rows that block their duplicates: a key, and a status among the row's own unique states
(bits in JobStatus order: sqla_queue.unique.STATE_BITS)."""
NO_META = text("'{}'::jsonb")


class Queue(Base):
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
DELAY_DUE = "_sqla_queue_delay"
"""Instance key of a constructed Job's `delay=` as an interval (its run_at is now() plus it)."""
_TASK_DEFAULTED = frozenset(OPTION_NAMES)
"""A Job's options a task's default may fill in at flush, where not given."""


class Job(Base):
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
            postgresql_where=text("status IN ('done', 'failed', 'cancelled')"),
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
    """A unique job's key (SHA-256, see `sqla_queue.unique`); NULL for other jobs."""
    unique_states: Mapped[int | None] = mapped_column(SmallInteger)
    """The statuses (as bits) in which this job blocks its duplicates."""
    result: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    """What its handler returned, when its task keeps results (`keep_result=True`)."""

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
            opts.max_attempts,
            opts.run_at,
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


class ArchivedJob(Base):
    """A finished job moved out of `jobs` by a queue whose retention is `archive`."""

    __tablename__ = "jobs_archive"
    __table_args__ = (Index("ix_jobs_archive_finished_at", "finished_at"),)

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


class QueueStart(Base):
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


class WorkerRegistration(Base):
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


class BrokerDone(Base):
    """Ids of relayed jobs a broker worker finished: its consumer-side de-duplication record."""

    __tablename__ = "broker_done"
    __table_args__ = (Index("ix_broker_done_done_at", "done_at"),)

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    done_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )


class PeriodicSlot(Base):
    """A slot a periodic job was enqueued for: the primary key lets exactly one worker win."""

    __tablename__ = "periodic_slots"

    task: Mapped[str] = mapped_column(Text, primary_key=True)
    slot: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    enqueued_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
