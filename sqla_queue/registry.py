"""Task handlers: `Registry`, `@registry.task`, and `load_registry("pkg.mod:name")`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import functools
import importlib
import inspect
import os
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    TypeVar,
    cast,
    overload,
)

from sqla_queue.db.models import DEFAULT_QUEUE, Retention, validate_tags_and_meta
from sqla_queue.enqueue import install_listeners
from sqla_queue.enqueue.workflows import Signature
from sqla_queue.errors import (
    AppLoadError,
    ConfigurationError,
    InvalidJobError,
)
from sqla_queue.job.arguments import ArgsAdapter, RowsRefused, rows_refused
from sqla_queue.job.lifecycle import LifecycleHooks
from sqla_queue.job.middleware import Middleware
from sqla_queue.job.options import (
    NO_OPTIONS,
    JobOptionFields,
    JobOptions,
    column_values,
    delay_interval,
    options_from,
)
from sqla_queue.job.retry import DEFAULT_RETRY, RetryPolicy
from sqla_queue.job.schedule import Schedule
from sqla_queue.job.unique import Unique, resolve_unique
from sqla_queue.job.validation import check_duration, check_fields, invalid_job, validate_name
from sqla_queue.orm.on_change import (
    MISSING,
    ChangeRules,
    add_rule,
    check_default_args,
    check_rule,
)
from sqla_queue.orm.row_args import DEFAULT_ROW_POLICY, RowPolicy, load_rows

MIN_LEASE = 1.0
"""The shortest lease a worker or a task may have: heartbeats must fit well within it."""

H = TypeVar("H", bound=Callable[..., Any])
P = ParamSpec("P")
"""A task's handler parameters (its `JobContext` left out): what `Task.defer` takes."""
R = TypeVar("R")
"""What a task's handler returns."""

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session
    from typing_extensions import Unpack

    from sqla_queue.db.models import Job
    from sqla_queue.job.context import JobContext
    from sqla_queue.job.new_job import InsertHook


class _HandlerSignature:
    """A handler's signature and, for the common shapes, what `fits` needs to check args
    with a few set operations instead of `Signature.bind` (several times dearer)."""

    def __init__(self, signature: inspect.Signature, pass_context: bool) -> None:
        self.signature = signature
        self.pass_context = pass_context
        params = list(signature.parameters.values())
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.context_name: str | None = None
        if pass_context and params and params[0].kind in positional:
            self.context_name = params.pop(0).name
        self.simple = (not pass_context or self.context_name is not None) and all(
            p.kind is not inspect.Parameter.POSITIONAL_ONLY for p in params
        )
        self.call_signature = signature.replace(parameters=params)
        """The parameters the job's args fill (the `JobContext` left out)."""
        named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self.accepted = frozenset(p.name for p in named)
        self.required = frozenset(p.name for p in named if p.default is p.empty)
        self.any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)

    def fits(self, args: Mapping[str, Any]) -> bool:
        """True when the handler surely takes `args`; False: ask `misfit` why not."""
        keys = args.keys()
        return (
            self.simple
            and keys >= self.required
            and (self.any_keyword or keys <= self.accepted)
            and self.context_name not in keys
        )

    def misfit(self, args: Mapping[str, Any]) -> str | None:
        """Why the handler cannot be called with `args` (None: it can)."""
        if not self.simple or self.context_name in args:
            try:
                self.signature.bind(*[None] * self.pass_context, **args)
            except TypeError as exc:
                return str(exc)
            return None
        problems = []
        missing = sorted(self.required - args.keys())
        if missing:
            problems.append(f"missing required argument {', '.join(missing)}")
        unexpected = [] if self.any_keyword else sorted(map(str, args.keys() - self.accepted))
        for name in unexpected:
            close = difflib.get_close_matches(name, self.accepted, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"unexpected argument {name}{hint}")
        return "; ".join(problems) or None


@dataclass
class Task(Generic[P, R]):
    """A registered handler and its options. Calling it calls the function directly.

    `task.defer(session, order_id=1)` enqueues a job with the handler's own parameters,
    which mypy and pyright check (`Task` is generic in them); `task.using(delay=60)` sets
    the job's options apart; `task.enqueue(session, {...})` is the dict form.
    """

    func: Callable[..., Any]
    name: str
    options: JobOptions = NO_OPTIONS
    """Its jobs' options by default (queue, priority, max_attempts, unique, ...): a call's
    own options win (`JobOptions.over`). `unique` is resolved: a `Unique`, or None."""
    retry: RetryPolicy = DEFAULT_RETRY
    timeout: float | None = None
    pass_context: bool = False
    middleware: Sequence[Middleware] = ()
    lease: float | None = None
    """Seconds this task's jobs may go without a heartbeat; None: the worker's lease."""
    keep_result: bool = False
    """Store what the handler returns (JSON) with the job, for `sqla_queue.wait_for`."""
    rows: RowPolicy = DEFAULT_ROW_POLICY
    """What its ORM row arguments do when a row is gone, changed or locked."""
    is_async: bool = field(init=False)
    registry: Registry | None = field(default=None, repr=False, compare=False)
    """The registry it was registered in: its hooks apply to this task's `.enqueue`."""

    def __post_init__(self) -> None:
        # A decorator made with functools.wraps around an async def still counts as async.
        self.is_async = inspect.iscoroutinefunction(self.func) or inspect.iscoroutinefunction(
            inspect.unwrap(self.func)
        )

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return cast("R", self.func(*args, **kwargs))

    @property
    def queue(self) -> str | None:
        """Its jobs' queue by default (None: "default")."""
        return self.options.queue

    @property
    def priority(self) -> int | None:
        """Its jobs' priority by default (None: 0)."""
        return self.options.priority

    @property
    def max_attempts(self) -> int | None:
        """Its jobs' max_attempts by default (None: the worker's default, 5)."""
        return self.options.max_attempts

    @property
    def unique(self) -> Unique | None:
        """Its jobs' uniqueness by default (`enqueue(..., unique=False)` opts one job out)."""
        unique = self.options.unique
        return unique if isinstance(unique, Unique) else None

    @functools.cached_property
    def _signature(self) -> _HandlerSignature | None:
        """The handler's signature, read once (None: Python cannot tell it, e.g. a builtin)."""
        try:
            # the worker calls the handler as given: a decorator's wrapper (functools.wraps)
            # may supply arguments its inner function needs, so its own signature counts
            signature = inspect.signature(self.func, follow_wrapped=False)
            return _HandlerSignature(signature, self.pass_context)
        except (TypeError, ValueError):
            return None

    @functools.cached_property
    def _adapter(self) -> ArgsAdapter | None:
        """The converters of its annotated parameters (`sqla_queue.job.arguments`), built
        once; None when Python cannot tell its signature."""
        signature = self._signature
        if signature is None:
            return None
        return ArgsAdapter(self.func, signature.call_signature.parameters)

    def encode_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """`args` as the JSON the job keeps: each parameter annotated with a type JSON does
        not hold (`datetime`, `UUID`, a dataclass, ...) validated and converted; a value
        that does not fit is refused (`InvalidJobError` naming the parameter)."""
        adapter = self._adapter
        if adapter is not None and adapter.refused is not None:
            raise self._too_many_rows(adapter.refused)
        if adapter is None or not adapter.converters:  # nothing to convert: no copy either
            return args if isinstance(args, dict) else dict(args)
        encoded, why = adapter.encode(args)
        if why is not None:
            raise InvalidJobError(task=self.name, detail=f"{why}; nothing was enqueued")
        return encoded

    def decode_args(self, args: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
        """The handler's keyword arguments rebuilt from a job's stored `args`, or (args, why
        they no longer fit its annotations: the job fails at once, as no retry helps)."""
        adapter = self._adapter
        if adapter is not None and adapter.refused is not None:  # no retry can change that
            handler = getattr(self.func, "__qualname__", self.name)
            return args, f"the handler {handler} cannot be a task's: {adapter.refused}"
        if adapter is None or not adapter.converters:
            return args, None
        decoded, why = adapter.decode(args)
        if why is None:
            return decoded, None
        handler = getattr(self.func, "__qualname__", self.name)
        return args, f"its stored args no longer fit the handler {handler}: {why}"

    def _too_many_rows(self, why: str) -> ConfigurationError:
        handler = getattr(self.func, "__qualname__", self.name)
        return ConfigurationError(detail=f"task {self.name!r} (the handler {handler}): {why}")

    def check_rows(self) -> None:
        """Raise `ConfigurationError` if the handler takes more than one ORM row (see
        `sqla_queue.job.arguments.ONE_ROW`) or a row inside another type (`list[Order]`,
        `Order | Customer`), when its annotations can be resolved now (else
        its first enqueue refuses it, and a worker fails its jobs without loading a row)."""
        signature = self._signature
        if signature is None:
            return
        why = rows_refused(self.func, signature.call_signature.parameters)
        if why is not None:
            raise self._too_many_rows(why)

    def load_rows(
        self, ctx: JobContext, args: Mapping[str, Any]
    ) -> tuple[Mapping[str, Any], RowsRefused | None]:
        """Its ORM row arguments loaded before the call, by its row policy (`self.rows`,
        `sqla_queue.orm.row_args.load_rows`); `args` as they are when it takes none."""
        adapter = self._adapter
        if adapter is None or not adapter.rows:
            return args, None
        return load_rows(ctx, args, adapter.rows, self.rows)

    def row_about(self, args: Mapping[str, Any]) -> str | None:
        """The `about` of a job with these encoded args: its row argument's `<table>:<key>`
        (None: it has none)."""
        adapter = self._adapter
        if adapter is None or not adapter.rows:
            return None
        return adapter.about(args)

    def check_args(self, args: Mapping[str, Any]) -> None:
        """Raise `InvalidJobError` unless the handler takes `args` as its keyword arguments
        (after the `JobContext` for `pass_context=True`), as the worker will call it: a
        missing or unexpected argument is refused at enqueue instead of failing every
        attempt."""
        signature = self._signature
        if signature is None or signature.fits(args):
            return
        why = signature.misfit(args)
        if why is None:
            return
        handler = getattr(self.func, "__qualname__", self.name)
        context = " (pass_context=True: the JobContext comes first)" * self.pass_context
        raise InvalidJobError(
            task=self.name,
            detail=f"its args do not fit the handler {handler}{signature.signature}{context}: "
            f"{why}",
        )

    def args_misfit(self, args: Mapping[str, Any]) -> str | None:
        """Why the handler cannot be called with `args` (`inspect.Signature.bind`, as the
        worker will call it), naming its signature and the args given; None when it can
        (or Python cannot tell its signature). The worker fails such a job at once: no
        retry can make the same args fit."""
        signature = self._signature
        if signature is None or signature.fits(args):
            return None
        try:
            signature.signature.bind(*[None] * self.pass_context, **args)
        except TypeError as exc:
            why = str(exc)
        else:
            return None
        handler = getattr(self.func, "__qualname__", self.name)
        context = " (pass_context=True: the JobContext comes first)" * self.pass_context
        given = ", ".join(sorted(map(str, args))) or "none"
        return (
            f"its args do not fit the handler {handler}{signature.signature}{context}: {why} "
            f"(args given: {given})"
        )

    def enqueue(
        self,
        session: Session | AsyncSession,
        args: dict[str, Any] | None = None,
        *,
        options: JobOptions | None = None,
        flush: bool = False,
        **fields: Unpack[JobOptionFields],
    ) -> Job:
        """`enqueue(session, self.name, args, ...)` with this task's registry and defaults.

        The task's options (`self.options`: queue, priority, max_attempts, unique, ...)
        apply unless given here, as keywords or `options=`; its registry's insert hooks run.
        As with `enqueue`, `job.id` is None until a flush (`flush=True`).
        """
        from sqla_queue.enqueue import enqueue_job

        call = options_from("Task.enqueue()", options, fields, invalid_job(self.name))
        job = enqueue_job(session, self.name, args, call, flush, self.registry, self.options)
        return cast("Job", job)

    async def enqueue_async(
        self,
        session: AsyncSession,
        args: dict[str, Any] | None = None,
        *,
        options: JobOptions | None = None,
        flush: bool = False,
        **fields: Unpack[JobOptionFields],
    ) -> Job:
        """`Task.enqueue` for an `AsyncSession`: the same options, the task's queue and
        defaults (`unique=` among them, written at once as with a sync `Session`) and its
        registry's insert hooks; run in the session's sync session, as `enqueue_async`.
        `flush=True` flushes at once, so `job.id` is set."""
        from sqla_queue.enqueue import check_async_session, enqueue_job

        call = options_from("Task.enqueue_async()", options, fields, invalid_job(self.name))
        check_async_session(session, "Task.enqueue_async()")

        def write(sync_session: Session) -> Job:
            job = enqueue_job(
                sync_session, self.name, args, call, flush, self.registry, self.options
            )
            return cast("Job", job)

        return await session.run_sync(write)

    # -- the typed call -------------------------------------------------------------------

    def using(
        self, *, options: JobOptions | None = None, **fields: Unpack[JobOptionFields]
    ) -> TaskCall[P, R]:
        """This task with the options of one call (`delay`, `queue`, `unique=False`,
        `expires_in`, ...), set apart from the handler's arguments: `.defer(session, ...)`,
        `.defer_async(...)` or `.row(...)` then enqueues with them, over the task's defaults."""
        call = options_from(f"{self.name}.using()", options, fields, invalid_job(self.name))
        return TaskCall(self, call)

    @overload
    def defer(self, session: Connection, /, *args: P.args, **kwargs: P.kwargs) -> int: ...

    @overload
    def defer(self, session: Session, /, *args: P.args, **kwargs: P.kwargs) -> Job: ...

    def defer(
        self, session: Session | Connection, /, *args: P.args, **kwargs: P.kwargs
    ) -> Job | int:
        """Enqueue a job of this task in `session`'s transaction, its args given as the
        handler's own parameters (checked by the type checker, then here: values of
        annotated types are validated and converted). A `Session` gives the `Job` (its id
        set at flush), a Core `Connection` the new job's id. Options: `task.using(...)`."""
        return TaskCall(self, NO_OPTIONS).defer(session, *args, **kwargs)

    async def defer_async(self, session: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> Job:
        """`defer` for an `AsyncSession` (run in its sync session: `unique` works too)."""
        return await TaskCall(self, NO_OPTIONS).defer_async(session, *args, **kwargs)

    def row(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """One row for `enqueue_many(session, rows)`: this task, these args (checked as
        `defer` checks them) and the task's default options."""
        return TaskCall(self, NO_OPTIONS).row(*args, **kwargs)

    def bind_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A typed call's arguments as the job's args by parameter name (positional ones
        named by the handler's signature)."""
        if not args:
            return kwargs
        signature = self._signature
        if signature is None:
            raise InvalidJobError(
                task=self.name, detail="its handler's signature is unknown: pass keywords"
            )
        try:
            bound = signature.call_signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise InvalidJobError(task=self.name, detail=str(exc)) from None
        return dict(bound.arguments)

    def s(self, **args: Any) -> Signature:
        """A signature of this task with these args (its handler's keyword arguments), for
        `chain`, `group` and `chord` (`sqla_queue.enqueue.workflows`); `.set(queue=..., ...)` gives
        it options. Args the handler does not take are refused here."""
        return Signature(self, args)


@dataclass(frozen=True)
class TaskCall(Generic[P, R]):
    """A task with the options of one call (`Task.using(...)`): `defer`, `defer_async`,
    `row` enqueue with them, the task's defaults applying where they say nothing."""

    task: Task[P, R]
    options: JobOptions

    @overload
    def defer(self, session: Connection, /, *args: P.args, **kwargs: P.kwargs) -> int: ...

    @overload
    def defer(self, session: Session, /, *args: P.args, **kwargs: P.kwargs) -> Job: ...

    def defer(
        self, session: Session | Connection, /, *args: P.args, **kwargs: P.kwargs
    ) -> Job | int:
        """`Task.defer` with these options."""
        from sqla_queue.enqueue import enqueue_job

        task = self.task
        values = task.bind_args(args, kwargs)
        options, registry = self.options, task.registry
        return enqueue_job(
            session, task.name, values, options, False, registry, task.options, "defer()"
        )

    async def defer_async(self, session: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> Job:
        """`Task.defer_async` with these options."""
        from sqla_queue.enqueue import check_async_session, enqueue_job

        check_async_session(session, "defer_async()")
        task = self.task
        values = task.bind_args(args, kwargs)

        def write(sync_session: Session) -> Job:
            job = enqueue_job(
                sync_session, task.name, values, self.options, False, task.registry, task.options
            )
            return cast("Job", job)

        return await session.run_sync(write)

    def row(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """`Task.row` with these options."""
        task = self.task
        values = task.bind_args(args, kwargs)
        task.check_args(values)
        row = self.options.over(task.options).given()
        encoded = task.encode_args(values)
        row.update(task=task.name, args=encoded)
        if row.get("about") is None:  # a row argument's job is about it, registry or not
            about = task.row_about(encoded)
            if about is not None:
                row["about"] = about
        return row


@dataclass(frozen=True)
class QueueDeclaration:
    """A queue declared in code (`Registry.declare_queue`), with the settings it is created
    with by `sqla-queue queues sync --app ... --yes` and by the pytest plugin (a queue that
    exists already is left as it is)."""

    name: str
    retention: str = Retention.delete.value
    """What happens to its succeeded jobs: delete, keep or archive."""
    max_running: int | None = None
    """At most this many of its jobs run at once, across all workers (None: no limit)."""


class Registry:
    """The tasks a worker can run, by name.

    registry = Registry()

    @registry.task(queue="emails", max_attempts=10)
    def send_receipt(order_id: int) -> None: ...

    `insert_hooks` (or `@registry.on_insert`) run on every job written through this
    registry's tasks, or through any enqueue path while it is the default registry
    (`sqla_queue.set_default_registry`); see `sqla_queue.enqueue.hooks`.

    `middleware` wraps every job's execution (see `sqla_queue.job.middleware`); `resources`
    are handed to every job through `JobContext.resources`; lifecycle hooks are added with
    `@registry.on_job_claimed`, `on_job_finished`, `on_worker_started`, `on_worker_stopping`.

    `include`: the modules that register more tasks and schedules in this registry
    (`Registry(include=["shop.emails", "shop.reports"])`, as Celery's `include`), imported
    when a worker or an `--app` command loads it (`load_included`).
    """

    def __init__(
        self,
        *,
        middleware: Sequence[Middleware] = (),
        resources: Mapping[str, Any] | None = None,
        insert_hooks: Iterable[InsertHook] = (),
        include: Iterable[str] = (),
    ) -> None:
        modules = [include] if isinstance(include, str) else list(include)
        if isinstance(include, str) or not all(isinstance(m, str) and m for m in modules):
            raise ConfigurationError(
                detail=f"include is a list of module names, e.g. include=['shop.emails'], "
                f"got {include!r}"
            )
        self.include: list[str] = modules
        """The modules `load_included` imports: they register tasks in this registry."""
        self._tasks: dict[str, Task[Any, Any]] = {}
        self.declared_queues: dict[str, QueueDeclaration] = {}
        """The queues declared with `declare_queue`, by name, with their settings."""
        self.insert_hooks: list[InsertHook] = list(insert_hooks)
        self.middleware: list[Middleware] = list(middleware)
        self.resources: dict[str, Any] = dict(resources or {})
        self.hooks = LifecycleHooks()
        self.schedules: dict[str, Schedule] = {}
        """The periodic tasks' schedules by task name (`@registry.periodic`)."""
        self.change_rules = ChangeRules()
        """This registry's `@registry.on_change` rules, with their own `Session` listeners."""
        install_listeners()  # the enqueue paths' (sqla_queue.enqueue): none at import

    def on_job_claimed(self, hook: H) -> H:
        """Register `hook(ctx)`, called for every job this registry's worker claims."""
        return self._add_hook(self.hooks.job_claimed, hook)

    def on_job_finished(self, hook: H) -> H:
        """Register `hook(ctx, outcome)`, called once per claimed job with its `Outcome`."""
        return self._add_hook(self.hooks.job_finished, hook)

    def on_worker_started(self, hook: H) -> H:
        """Register `hook(worker)`, called once the worker is connected and running."""
        return self._add_hook(self.hooks.worker_started, hook)

    def on_worker_stopping(self, hook: H) -> H:
        """Register `hook(worker)`, called when the worker begins to stop."""
        return self._add_hook(self.hooks.worker_stopping, hook)

    @staticmethod
    def _add_hook(hooks: list[Any], hook: H) -> H:
        """Append `hook` to `hooks` and return it (each `on_*` decorator's whole body)."""
        if not callable(hook):
            raise ConfigurationError(detail=f"a hook must be callable, got {hook!r}")
        hooks.append(hook)
        return hook

    def on_insert(self, hook: InsertHook) -> InsertHook:
        """Register an insert hook (a decorator): it runs after those registered before."""
        self.insert_hooks.append(hook)
        return hook

    @overload
    def task(self, func: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        pass_context: Literal[False] = False,
        middleware: Sequence[Middleware] = (),
        lease: float | None = None,
        keep_result: bool = False,
        missing: Literal["cancel", "none"] = "cancel",
        changed: Literal["run", "skip", "latest"] = "run",
        for_update: bool = False,
        options: JobOptions | None = None,
        **fields: Unpack[JobOptionFields],
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        pass_context: Literal[True],
        middleware: Sequence[Middleware] = (),
        lease: float | None = None,
        keep_result: bool = False,
        missing: Literal["cancel", "none"] = "cancel",
        changed: Literal["run", "skip", "latest"] = "run",
        for_update: bool = False,
        options: JobOptions | None = None,
        **fields: Unpack[JobOptionFields],
    ) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        pass_context: bool,
        middleware: Sequence[Middleware] = (),
        lease: float | None = None,
        keep_result: bool = False,
        missing: Literal["cancel", "none"] = "cancel",
        changed: Literal["run", "skip", "latest"] = "run",
        for_update: bool = False,
        options: JobOptions | None = None,
        **fields: Unpack[JobOptionFields],
    ) -> Callable[[Callable[..., R]], Task[..., R]]: ...

    def task(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        pass_context: bool = False,
        middleware: Sequence[Middleware] = (),
        lease: float | None = None,
        keep_result: bool = False,
        missing: Literal["cancel", "none"] = "cancel",
        changed: Literal["run", "skip", "latest"] = "run",
        for_update: bool = False,
        options: JobOptions | None = None,
        **fields: Unpack[JobOptionFields],
    ) -> Task[Any, Any] | Callable[[Callable[..., Any]], Task[Any, Any]]:
        """Register a sync or async function as a task.

        The name defaults to `module.function`. Its jobs' default options, as keywords or
        `options=JobOptions(...)` (for `.enqueue`, and for every enqueue path while this is
        the default registry): `queue`, `priority`, `max_attempts` (used when the job row
        does not set it), `delay`, `tags`, `meta`, `unique` (not `run_at`: one instant for
        every job). Its own: `retry` (a `RetryPolicy`), `timeout` in seconds,
        `pass_context` to receive a `JobContext` as the first argument, `middleware` of its
        own (inside the registry's), `lease`: its own seconds without a heartbeat before it
        is reaped (at least 1), and `keep_result`: store what the handler returns
        (JSON-serialisable) with the job, for `sqla_queue.wait_for`; in a queue that deletes
        its jobs the row then stays `done` for the queue's `result_ttl` (a day unless
        `sqla-queue queues set --result-ttl`). For a handler taking ORM rows (`order: Order`):
        `missing` ("cancel" or "none": a row gone before the run), `changed` ("run", "skip"
        or "latest": a row whose `version_id_col` moved since enqueue) and `for_update`
        (lock the rows, `SKIP LOCKED`: the job snoozes while another transaction holds one);
        see `sqla_queue.orm.row_args`.
        """
        rows = RowPolicy(missing, changed, for_update)
        defaults = _task_defaults(options_from("task()", options, fields, _misconfigured))
        if timeout is not None and (timeout := check_duration("timeout", timeout)) <= 0:
            raise ConfigurationError(detail=f"timeout must be positive, got {timeout}")
        if lease is not None and not (lease := check_duration("lease", lease)) >= MIN_LEASE:
            raise ConfigurationError(
                detail=f"lease must be at least {MIN_LEASE:g} s (heartbeats must fit in it), "
                f"got {lease}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(detail=f"retry must be a RetryPolicy, got {retry!r}")

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            if task_name in self._tasks and self._tasks[task_name].func is not f:
                raise ConfigurationError(detail=f"task {task_name!r} is registered twice")
            task: Task[Any, Any] = Task(
                func=f,
                name=task_name,
                options=defaults,
                retry=retry or DEFAULT_RETRY,
                timeout=timeout,
                pass_context=pass_context,
                registry=self,
                middleware=tuple(middleware),
                lease=lease,
                keep_result=bool(keep_result),
                rows=rows,
            )
            task.check_rows()  # refused before it is registered: a job is about one row
            self._tasks[task_name] = task
            return task

        return register(func) if func is not None else register

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | dt.timedelta | None = None,
        timezone: str = "UTC",
        args: Mapping[str, Any] | None = None,
        catch_up: int | dt.timedelta = 1,
        **task_options: Any,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task (as `@registry.task(**task_options)`) that is enqueued on a schedule.

        `cron` (read by cronsim, in `timezone`) or `every` (seconds or a timedelta, aligned to
        the epoch) says when; `args` are the jobs' arguments. Every worker of this registry
        enqueues each due slot and the database keeps one (`sqla_queue.worker.periodic`); of the
        slots missed while no worker ran, `catch_up` are enqueued when one starts (a count,
        newest first: 1, the default, is the last missed slot only; 0 none; a timedelta:
        those within that long).
        """
        seconds = every.total_seconds() if isinstance(every, dt.timedelta) else every
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float)
        ):
            raise ConfigurationError(detail=f"every is seconds or a timedelta, got {every!r}")
        register = cast("Callable[[Callable[P, R]], Task[P, R]]", self.task(**task_options))

        def schedule(f: Callable[P, R]) -> Task[P, R]:
            task_name = task_options.get("name") or f"{f.__module__}.{f.__qualname__}"
            plan = Schedule(
                task_name,
                cron=cron,
                every=None if seconds is None else float(seconds),
                timezone=timezone,
                args=dict(args or {}),
                catch_up=catch_up,
            )
            task = register(f)
            try:  # refused now, not at every look of the scheduler (which would stop them all)
                task.check_args(plan.args)
                # typed values (a date, a UUID, ...): kept as the jobs keep them
                plan = dataclasses.replace(plan, args=task.encode_args(plan.args))
            except InvalidJobError as exc:
                raise ConfigurationError(detail=f"periodic task {task.name!r}: {exc}") from exc
            self.schedules[task.name] = plan
            return task

        return schedule

    def on_change(
        self,
        *attributes: Any,
        to: Any = MISSING,
        from_: Any = MISSING,
        when: Callable[[Any], bool] | None = None,
        args: Callable[[Any], Mapping[str, Any]] | None = None,
        **task_options: Any,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task (as `@registry.task(**task_options)`) enqueued by the change that
        calls for it: each transaction that leaves a mapped object's attribute changed (an
        insert counts) and equal to `to` (and, with `from_`, that started equal to it; with
        `when`, for which `when(obj)` is true) enqueues one job about that object, at
        commit, in that transaction. Its args: the object's primary key by attribute name
        (`{"id": 42}`), or `args(obj)`. ORM events only: `session.execute(update(...))`
        enqueues nothing. See `sqla_queue.orm.on_change`.

            @registry.on_change(Order.status, to="paid")
            def send_receipt(id: int) -> None: ...
        """
        cls = check_rule(attributes, to, from_, when, args)
        register = cast("Callable[[Callable[P, R]], Task[P, R]]", self.task(**task_options))

        def watch(f: Callable[P, R]) -> Task[P, R]:
            if args is None:  # refused before it is registered: every commit would fail
                name = task_options.get("name") or f.__qualname__
                probe: Task[Any, Any] = Task(
                    f, name, pass_context=bool(task_options.get("pass_context"))
                )
                check_default_args(probe, cls)
            task = register(f)
            add_rule(self.change_rules, task, attributes, to, from_, when, args)
            return task

        return watch

    def load_included(self, path: str | None = None) -> None:
        """Import each module of `include` (those imported already are not run again), so
        that the tasks and schedules they register are known. A module that cannot be
        imported raises `AppLoadError` naming it. `path`: how this registry was named
        (`pkg.module:registry`), for the error."""
        for module in self.include:
            _import_module(path or f"Registry(include={self.include!r})", module, include=True)

    def declare_queue(
        self, name: str, *, retention: str = "delete", max_running: int | None = None
    ) -> QueueDeclaration:
        """Declare queue `name` with its settings (`retention`: delete, keep or archive;
        `max_running`): `sqla-queue queues sync --app` and the pytest plugin create it so,
        and a worker without -q serves it. A task naming it needs no declaration (it is
        created with the default settings); declare it for its settings."""
        validate_name("queue name", name, _misconfigured)
        if retention not in {r.value for r in Retention}:
            choices = ", ".join(r.value for r in Retention)
            raise ConfigurationError(
                detail=f"declare_queue({name!r}): retention is one of {choices}, got {retention!r}"
            )
        if max_running is not None and (
            isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1
        ):
            raise ConfigurationError(
                detail=f"declare_queue({name!r}): max_running is a positive int or None, "
                f"got {max_running!r}"
            )
        declared = QueueDeclaration(name, retention, max_running)
        self.declared_queues[name] = declared
        return declared

    def queue_names(self) -> list[str]:
        """The queues its tasks name (a task without one: "default") and those it declares,
        sorted: what `sqla-queue queues sync --app` creates and a worker without -q serves."""
        names = {task.queue or DEFAULT_QUEUE for task in self._tasks.values()}
        return sorted(names | self.declared_queues.keys())

    def queue_declaration(self, name: str) -> QueueDeclaration:
        """The settings queue `name` is created with: its declaration, else the defaults."""
        return self.declared_queues.get(name) or QueueDeclaration(name)

    def get(self, name: str) -> Task[Any, Any] | None:
        """The task registered under `name`, or None."""
        return self._tasks.get(name)

    def __getitem__(self, name: str) -> Task[Any, Any]:
        return self._tasks[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)


def _misconfigured(detail: str) -> Exception:
    return ConfigurationError(detail=detail)


def _task_defaults(options: JobOptions) -> JobOptions:
    """A task's default options, checked as a job's are (a `ConfigurationError` at
    registration), with `unique` resolved to a `Unique` or None."""
    if options.run_at is not None:
        raise ConfigurationError(
            detail="a task has no default run_at (it would be one instant for every job); "
            "give it a delay=, or pass run_at= to each enqueue"
        )
    if options.expires_at is not None:
        raise ConfigurationError(
            detail="a task has no default expires_at (it would be one instant for every job); "
            "give it an expires_in=, or pass expires_at= to each enqueue"
        )
    if options.expires_in is not None:
        check_duration("expires_in", options.expires_in)
    priority = 0 if options.priority is None else options.priority
    check_fields(priority, None, column_values(options), _misconfigured)
    delay_interval(None, options.delay, _misconfigured)
    if options.tags is not None or options.meta is not None:
        try:
            validate_tags_and_meta("(a task's defaults)", options.tags, options.meta)
        except (InvalidJobError, TypeError) as exc:
            raise ConfigurationError(detail=str(exc)) from exc
    return dataclasses.replace(options, unique=resolve_unique(options.unique))


def load_registry(path: str) -> Registry:
    """Import `"package.module:attribute"` and return the `Registry` found there."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(path=path, detail="expected 'package.module:registry'")
    module = _import_module(path, module_name)
    try:
        registry = getattr(module, attribute)
    except AttributeError:
        raise AppLoadError(
            path=path, detail=f"module {module_name!r} has no attribute {attribute!r}"
        ) from None
    if not isinstance(registry, Registry):
        raise AppLoadError(
            path=path,
            detail=f"{attribute!r} is a {type(registry).__name__}, not a sqla_queue.Registry",
        )
    registry.load_included(path)
    return registry


def _import_module(path: str, module_name: str, include: bool = False) -> Any:
    """Import `module_name` (the registry's own module, or one of its `include`) for the
    registry `path`; an `AppLoadError` that names what failed."""
    which = f"its include {module_name!r}" if include else "it"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and f"{module_name}.".startswith(f"{exc.name}."):
            missing = f"no module named {exc.name!r} (is it on PYTHONPATH? run from its folder)"
            detail = f"{which}: {missing}" if include else missing
            raise AppLoadError(path=path, detail=detail) from exc
        raise _raised_on_import(path, which, exc) from exc
    except Exception as exc:
        raise _raised_on_import(path, which, exc) from exc


def _raised_on_import(path: str, which: str, exc: Exception) -> AppLoadError:
    """The `AppLoadError` for a module of the registry `path` that raised `exc` as it was
    imported: the exception and where, and the exception itself (`raised`)."""
    error = AppLoadError(path=path, detail=f"importing {which} raised {exc!r}{_where(exc)}")
    error.raised = exc
    return error


_LIBRARY_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")
"""The `sysconfig` paths whose files are not the application's own code."""


def _where(exc: BaseException) -> str:
    """` at FILE:LINE`: where `exc` was raised in the application's own code (the innermost
    frame outside Python's library, installed packages and sqla-queue; a SyntaxError's own
    file and line), or the innermost frame of all; "" when there is none."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {_shown_path(exc.filename)}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    paths = sysconfig.get_paths()
    library = tuple(
        os.path.realpath(p) + os.sep
        for p in {*(paths.get(k) for k in _LIBRARY_PATHS), os.path.dirname(__file__)}
        if p
    )
    own = [
        f
        for f in frames
        if not f.filename.startswith("<") and not os.path.realpath(f.filename).startswith(library)
    ]
    found = own[-1] if own else (frames[-1] if frames else None)
    return "" if found is None else f" at {_shown_path(found.filename)}:{found.lineno}"


def _shown_path(filename: str) -> str:
    """`filename` relative to the current folder when it is under it."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if relative.startswith(os.pardir) else relative
