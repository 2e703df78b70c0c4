"""The canvas, in Celery's words: signatures, `chain`, `group` and `chord`.

    from sqla_queue import chain, chord, group

    handle = chain(
        fetch.s(url=url),
        group(resize.s(size=64), resize.s(size=512)),
        publish.s(),
    ).enqueue(session)
    # handle.workflow_id is shared by its jobs; handle.last_id is publish's job

A signature (`task.s(**args)`, or `signature("task.name", args)` for a task known only by
name) is one job to be: its task, its args, and its options (`.set(queue=..., priority=...)`).
`chain(a, b, c)` runs each after the previous one ended; `group(a, b, c)` runs them side by
side; `chord(group(...), callback)` is `chain(group(...), callback)`: the callback runs
once every job of the group ended, and reads their results with `ctx.parent_results()`.
Chains and groups nest: a chain's step waits for every job its previous step ends in.

`.enqueue(session)` writes the whole workflow in the caller's transaction, with one
`enqueue_many` (COPY from 100 jobs on: a group of 10,000 is not 10,000 INSERTs) and one
`link_jobs` for all its edges (three statements), and returns a `WorkflowHandle`. Task
defaults and insert hooks apply to each job, as with `enqueue`. What happens next is the
core's (`sqla_queue.enqueue.inserts.links`, migration sqlaq_0009): a job waits until the jobs it
depends on ended; a failure cancels what comes after it, unless a job says
`on_failure="run"`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from sqla_queue.enqueue import enqueue_many
from sqla_queue.enqueue.hooks import default_registry
from sqla_queue.enqueue.inserts.links import Link, link_jobs
from sqla_queue.enqueue.inserts.params import JOB_BIND
from sqla_queue.job.options import OPTION_NAMES
from sqla_queue.job.validation import ON_FAILURE, check_on_failure

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from typing_extensions import Unpack

    from sqla_queue.job.options import JobOptionFields
    from sqla_queue.job.tasks import TaskLookup, TaskSpec

SIGNATURE_OPTIONS = tuple(
    name for name in OPTION_NAMES if name not in ("depends_on", "workflow_id")
)
"""The options a signature takes (`.set(...)`): a job's, but its dependencies and workflow,
which the canvas gives."""


@dataclass(frozen=True)
class WorkflowHandle:
    """What `.enqueue(session)` of a canvas returns.

    `workflow_id` (a uuid4 hex) is on every job of it; `job_ids` are its jobs' ids in the
    order the canvas names them; `last_ids` are the jobs nothing else in it waits for (a
    chain's last step; each job of a group). `last_id` is the one such job, for
    `sqla_queue.wait_for(engine, handle.last_id)`.
    """

    workflow_id: str
    job_ids: list[int]
    last_ids: list[int]

    @property
    def last_id(self) -> int:
        """The job the workflow ends in; a `ValueError` when it ends in several (a group)."""
        if len(self.last_ids) != 1:
            raise ValueError(
                f"workflow {self.workflow_id} ends in {len(self.last_ids)} jobs "
                f"({', '.join(map(str, self.last_ids[:5]))}{', ...' * (len(self.last_ids) > 5)})"
                ", not one: use handle.last_ids, or end it with one job (a chord's callback)"
            )
        return self.last_ids[0]


class Canvas:
    """A signature, chain or group: something `.enqueue(session)` writes as a workflow."""

    __slots__ = ()

    def _place(self, plan: _Plan, after: tuple[int, ...]) -> tuple[int, ...]:
        """Add this canvas's jobs to `plan`, its first ones waiting for `after` (indexes in
        the plan); returns the indexes of the jobs it ends in."""
        raise NotImplementedError

    def __or__(self, other: Canvas) -> Canvas:
        """`a | b` is `chain(a, b)`."""
        return chain(self, other)

    def enqueue(
        self, session: Session | Connection, *, registry: TaskLookup | None = None
    ) -> WorkflowHandle:
        """Write this workflow's jobs and edges in `session`'s transaction (a sync `Session`
        or a Core `Connection`; nothing is committed) and return its `WorkflowHandle`.

        `registry`: whose task defaults and insert hooks apply (default: the registry of
        the tasks its signatures were made from, when they share one, else the default
        registry)."""
        plan = _Plan()
        self._place(plan, ())
        return plan.write(session, registry)

    async def enqueue_async(
        self, session: AsyncSession, *, registry: TaskLookup | None = None
    ) -> WorkflowHandle:
        """`enqueue` for an `AsyncSession`."""
        return await session.run_sync(lambda sync: self.enqueue(sync, registry=registry))


class Signature(Canvas):
    """One job to be: a task (its name, or the `Task` it was made from), its args and its
    options. Made by `task.s(**args)` or `signature("task.name", args, **options)`;
    `.set(**options)` returns a copy with more options."""

    __slots__ = ("args", "options", "task", "task_name")

    def __init__(
        self,
        task: str | TaskSpec,
        args: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        name = task if isinstance(task, str) else getattr(task, "name", None)
        if not isinstance(name, str):
            raise TypeError(
                f"a signature's task is a task name or a registered Task, got {task!r:.80}"
            )
        if args is not None and not isinstance(args, Mapping):
            raise TypeError(
                f"signature {name!r}: args must be a dict of the handler's keyword arguments, "
                f"got {args!r:.80}"
            )
        self.task_name = name
        self.task: TaskSpec | None = None if isinstance(task, str) else task
        self.args: dict[str, Any] = dict(args or {})
        self.options: dict[str, Any] = _checked(name, options or {})
        if self.task is not None:
            self.task.check_args(self.args)

    def set(self, **options: Unpack[JobOptionFields]) -> Signature:
        """A copy of this signature with these options too (`queue`, `priority`,
        `max_attempts`, `run_at` or `delay`, `tags`, `meta`, `unique`, `on_failure`): the
        options of `JobOptions` but `depends_on` and `workflow_id`, which the canvas sets."""
        copy = Signature(self.task if self.task is not None else self.task_name, self.args)
        copy.options = {**self.options, **_checked(self.task_name, options)}
        return copy

    def _place(self, plan: _Plan, after: tuple[int, ...]) -> tuple[int, ...]:
        return (plan.add(self, after),)

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"{self.task_name}.s({self.args!r}{options})"


def _checked(task: str, options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(SIGNATURE_OPTIONS))
    if unknown:
        canvas = {"depends_on", "workflow_id"} & set(unknown)
        why = (
            f"{', '.join(sorted(canvas))} come(s) from the canvas (chain, group, chord)"
            if canvas
            else f"the options are {', '.join(SIGNATURE_OPTIONS)}"
        )
        raise TypeError(f"signature {task!r} got unknown option(s) {', '.join(unknown)}: {why}")

    def refuse(detail: str) -> TypeError:
        return TypeError(f"signature {task!r}: {detail}")

    check_on_failure(options.get("on_failure"), refuse)
    return {name: value for name, value in options.items() if value is not None}


def signature(
    task: str | TaskSpec, args: Mapping[str, Any] | None = None, **options: Unpack[JobOptionFields]
) -> Signature:
    """A signature for a task known by name (or a `Task`): `signature("emails.send",
    {"to": to}, queue="emails")`, for canvases built where the handler is not imported."""
    return Signature(task, args, options)


def _parts(kind: str, parts: Sequence[object]) -> tuple[Canvas, ...]:
    listed: tuple[Any, ...] = tuple(parts)
    if len(listed) == 1 and _iterable(listed[0]):
        listed = tuple(listed[0])  # group([a, b]) as well as group(a, b)
    if not listed:
        raise ValueError(f"{kind}() needs at least one signature, chain or group; got none")
    for part in listed:
        if not isinstance(part, Canvas):
            raise TypeError(
                f"{kind}() takes signatures (task.s(...) or sqla_queue.signature(...)), "
                f"chains, groups and chords; got {part!r:.80}"
                + (" (a Task: write task.s(**args))" if hasattr(part, "s") else "")
            )
    return listed


def _iterable(value: object) -> bool:
    return not isinstance(value, (Canvas, str, bytes, Mapping)) and isinstance(value, Iterable)


class chain(Canvas):  # Celery's name
    """Its parts one after the other: each starts once every job the previous one ends in
    has ended (succeeded; see `on_failure`)."""

    __slots__ = ("parts",)

    def __init__(self, *parts: Canvas | Iterable[Canvas]) -> None:
        self.parts = _parts("chain", parts)

    def _place(self, plan: _Plan, after: tuple[int, ...]) -> tuple[int, ...]:
        for part in self.parts:
            after = part._place(plan, after)
        return after

    def __repr__(self) -> str:
        return f"chain({', '.join(map(repr, self.parts))})"


class group(Canvas):  # Celery's name
    """Its parts side by side: each waits only for what the group itself waits for."""

    __slots__ = ("parts",)

    def __init__(self, *parts: Canvas | Iterable[Canvas]) -> None:
        self.parts = _parts("group", parts)

    def _place(self, plan: _Plan, after: tuple[int, ...]) -> tuple[int, ...]:
        ends: list[int] = []
        for part in self.parts:
            ends.extend(part._place(plan, after))
        return tuple(ends)

    def __repr__(self) -> str:
        return f"group({', '.join(map(repr, self.parts))})"


def chord(header: group | Iterable[Canvas], body: Canvas) -> chain:
    """`chain(group(header), body)`: `body` runs once every job of `header` has ended, and
    reads their results in order with `ctx.parent_results()`."""
    if not isinstance(header, group):
        if isinstance(header, Canvas):
            raise TypeError(
                f"chord()'s header is a group (or a list of signatures), got {header!r:.80}; "
                "for one job before another, write chain(a, b)"
            )
        header = group(header)
    if not isinstance(body, Canvas):
        raise TypeError(
            f"chord()'s body (its callback) is a signature, chain or group, got {body!r:.80}"
        )
    return chain(header, body)


class _Plan:
    """A canvas flattened: its jobs in order, each with the indexes of those it waits for."""

    def __init__(self) -> None:
        self.signatures: list[Signature] = []
        self.parents: list[tuple[int, ...]] = []

    def add(self, job: Signature, after: tuple[int, ...]) -> int:
        self.signatures.append(job)
        self.parents.append(after)
        return len(self.signatures) - 1

    def write(self, session: Session | Connection, registry: TaskLookup | None) -> WorkflowHandle:
        if registry is None:
            registry = _common_registry(self.signatures)
        workflow_id = uuid.uuid4().hex
        rows = [_row(job, workflow_id) for job in self.signatures]
        ids = enqueue_many(session, rows, registry=registry)
        links = []
        in_force = registry if registry is not None else default_registry()
        for index, after in enumerate(self.parents):
            if not after or ids.duplicates[index]:
                continue  # a duplicate is the job there already: it gains no dependency
            job = self.signatures[index]
            edge = _on_failure(job, in_force)
            parents = list(dict.fromkeys(ids[i] for i in after))  # duplicates may share an id
            links.append(Link(ids[index], job.task_name, [(p, edge) for p in parents], workflow_id))
        if links:
            if isinstance(session, Session):
                link_jobs(session.connection(bind_arguments=JOB_BIND), links)
            else:
                link_jobs(session, links)
        waited_on = {i for after in self.parents for i in after}
        last = [ids[i] for i in range(len(ids)) if i not in waited_on]
        return WorkflowHandle(workflow_id, list(ids), list(dict.fromkeys(last)))


def _row(job: Signature, workflow_id: str) -> dict[str, Any]:
    options = dict(job.options)
    if job.task is not None:  # a Task's defaults, also outside the registry in force
        defaults = job.task.options.given()
        options = {**{k: v for k, v in defaults.items() if k in SIGNATURE_OPTIONS}, **options}
    return {"task": job.task_name, "args": job.args, **options, "workflow_id": workflow_id}


def _on_failure(job: Signature, registry: TaskLookup | None) -> str:
    """The edges' on_failure of `job`: its own, else its task's default, else "cancel"."""
    given = job.options.get("on_failure")
    if given is None and job.task is not None:
        given = job.task.options.on_failure
    if given is None and registry is not None:
        known = registry.get(job.task_name)
        given = known.options.on_failure if known is not None else None
    return str(given) if given is not None else ON_FAILURE[0]


def _common_registry(signatures: Sequence[Signature]) -> TaskLookup | None:
    """The registry every Task-made signature's task was registered in, if they share one."""
    found = {id(job.task.registry): job.task.registry for job in signatures if job.task}
    return next(iter(found.values())) if len(found) == 1 else None


__all__ = [
    "SIGNATURE_OPTIONS",
    "Canvas",
    "Signature",
    "WorkflowHandle",
    "chain",
    "chord",
    "group",
    "signature",
]
