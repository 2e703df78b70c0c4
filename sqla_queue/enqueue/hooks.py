"""Insert hooks and the default registry: what every job passes on its way into the table.

Every way of writing a job (`enqueue`, `Task.enqueue`, `enqueue_many` by INSERT or COPY,
`enqueue_many_async`, and `session.add(Job(...))` at flush) calls `prepare_job` once.
(`session.merge(Job(...))` of a new job is refused at flush, naming `session.add`: its copy
would lose the job's `unique=` and `depends_on=`.) (`insert(Job)` statements and
`bulk_save_objects` skip the ORM's flush and these steps with it; the database's CHECK
constraints still hold for them.)

1. the registry in force is the one given (a task's `.enqueue` gives its own), else the
   application's default registry (`set_default_registry`), else none;
2. with a registry, fields the caller left out take the task's own defaults (queue,
   priority, max_attempts);
3. with a registry, a task name it does not know is refused (`UnknownTaskError`, naming
   close matches), before any hook sees it;
4. the registry's insert hooks run in registration order on a `NewJob`; each may change its
   fields, or refuse the job by raising `ValueError` (the caller gets an `InvalidJobError`
   naming the hook and the reason, before anything is sent, so the transaction goes on).
   A hook that renames the task is held to the same check;
5. with a registry, the args (as the hooks leave them) must fit the handler's signature
   (`Task.check_args`: a missing or unexpected argument is an `InvalidJobError` naming it),
   and the values of its annotated parameters are validated and turned into JSON
   (`Task.encode_args`, `sqla_queue.job.arguments`: a `datetime` becomes its ISO text).

Without a registry (no default set, a plain `enqueue(session, "name")`) none of this
happens: the job is written as given and an unknown name fails later, in the worker.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqla_queue.db.models import DEFAULT_QUEUE
from sqla_queue.errors import InvalidJobError, UnknownTaskError
from sqla_queue.job.new_job import InsertHook, NewJob
from sqla_queue.job.options import NO_OPTIONS, OPTION_NAMES, JobOptions, expiry
from sqla_queue.job.unique import resolve_unique
from sqla_queue.job.validation import invalid_job

if TYPE_CHECKING:
    from sqla_queue.job.tasks import TaskLookup


_default_registry: TaskLookup | None = None


def set_default_registry(registry: TaskLookup | None) -> None:
    """Make `registry` the application's default (None: no default, as at start-up).

    While it is set, every enqueue path refuses task names it does not know, fills in its
    tasks' defaults, and runs its insert hooks. Call it once at start-up, where the
    application builds its registry; it holds for every thread of the process.
    """
    global _default_registry
    _default_registry = registry


def default_registry() -> TaskLookup | None:
    """The registry set by `set_default_registry`, or None."""
    return _default_registry


def _hook_name(hook: InsertHook) -> str:
    module = getattr(hook, "__module__", None)
    name = getattr(hook, "__qualname__", None) or repr(hook)
    return f"{module}.{name}" if module else name


def prepare_job(
    task: Any,
    args: Any,
    options: JobOptions = NO_OPTIONS,
    *,
    registry: TaskLookup | None = None,
    defaults: JobOptions | None = None,
) -> NewJob:
    """Apply the registry's task defaults and insert hooks; refuse unknown task names.

    `options` as given by the caller; where one is None the task's own applies (its
    `Task.options`, or `defaults` for a task outside the registry in force), then the
    queue's ("default", priority 0). The result is not validated yet: the caller validates
    what the hooks leave (`models.validate_job`, `models.validate_tags_and_meta`).
    """
    in_force = registry if registry is not None else _default_registry
    known = in_force.get(task) if in_force is not None and isinstance(task, str) else None
    if known is not None:
        options = options.over(known.options)
    elif defaults is not None:
        options = options.over(defaults)
    values = {name: getattr(options, name) for name in OPTION_NAMES}
    tags, meta = values["tags"], values["meta"]
    values.update(
        queue=DEFAULT_QUEUE if options.queue is None else options.queue,
        priority=0 if options.priority is None else options.priority,
        # Copies: a hook changing them must not change the caller's own list or dict.
        tags=[] if tags is None else (list(tags) if _is_collection(tags) else tags),
        meta={} if meta is None else (dict(meta) if isinstance(meta, Mapping) else meta),
        unique=resolve_unique(options.unique),
        depends_on=None if options.depends_on is None else _listed(options.depends_on),
        expires_at=expiry(options.expires_at, values.pop("expires_in"), invalid_job(task)),
    )
    job = NewJob(
        task=task,
        args=dict(args) if isinstance(args, Mapping) else ({} if args is None else args),
        **values,
    )
    if in_force is None:
        return job
    _refuse_unknown(in_force, job.task)
    for hook in in_force.insert_hooks:
        try:
            hook(job)
        except ValueError as exc:
            reason = exc.context.get("detail", exc) if isinstance(exc, InvalidJobError) else exc
            raise InvalidJobError(
                task=job.task, detail=f"refused by insert hook {_hook_name(hook)}: {reason}"
            ) from exc
    if job.task != task:
        _refuse_unknown(in_force, job.task)
        known = in_force.get(job.task) if isinstance(job.task, str) else None
    if known is not None and isinstance(job.args, dict):
        known.check_args(job.args)
        job.args = known.encode_args(job.args)
        if job.about is None:  # a job taking a row is about it, as `about=` records
            job.about = known.row_about(job.args)
    return job


def _listed(depends_on: object) -> Any:
    """`depends_on` as a list of its own (a hook changing it must not change the caller's);
    a single job or id is refused where the dependencies are checked
    (`sqla_queue.enqueue.workflows`)."""
    if isinstance(depends_on, (list, tuple, set, frozenset)):
        return list(depends_on)
    return depends_on


def _is_collection(value: object) -> bool:
    return isinstance(value, (list, tuple, set, frozenset))


def _refuse_unknown(registry: TaskLookup, task: object) -> None:
    """Raise `UnknownTaskError`, naming close matches, if `registry` has no task `task`."""
    if not isinstance(task, str) or not task or task in registry:
        return  # a name that is not a str is validate_job's to refuse
    names = list(registry)
    close = difflib.get_close_matches(task, names, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(repr(name) for name in close)}?"
        if close
        else f"it has {len(names)} task(s); register this one with @registry.task"
    )
    raise UnknownTaskError(task=task, hint=hint)
