"""What the job core and the enqueue paths read of a task and of a registry: `TaskSpec` and
`TaskLookup`.

The runner (`sqla_queue.job.run`), the enqueue paths (`sqla_queue.enqueue`) and the ORM
helpers (`sqla_queue.orm`) sit below the registry: they depend on these protocols, never on
`sqla_queue.registry`. `Registry` and `Task` implement them (structurally: they do not
inherit from them), so a `Registry` is passed wherever a `TaskLookup` is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sqla_queue.job.arguments import RowsRefused
    from sqla_queue.job.context import JobContext
    from sqla_queue.job.lifecycle import LifecycleHooks
    from sqla_queue.job.middleware import Middleware
    from sqla_queue.job.new_job import InsertHook
    from sqla_queue.job.options import JobOptions
    from sqla_queue.job.retry import RetryPolicy

__all__ = ["TaskLookup", "TaskSpec"]


class TaskSpec(Protocol):
    """A registered task as the runner and the enqueue paths read it (`sqla_queue.Task`)."""

    @property
    def name(self) -> str:
        """The name its jobs carry."""

    @property
    def func(self) -> Callable[..., Any]:
        """The handler, sync or async."""

    @property
    def options(self) -> JobOptions:
        """Its jobs' default options (a call's own options win)."""

    @property
    def max_attempts(self) -> int | None:
        """Its jobs' attempt budget by default (None: the default)."""

    @property
    def retry(self) -> RetryPolicy:
        """The delay before each retry."""

    @property
    def timeout(self) -> float | None:
        """Seconds an attempt may run (None: no limit)."""

    @property
    def pass_context(self) -> bool:
        """Whether the handler takes a `JobContext` first."""

    @property
    def middleware(self) -> Sequence[Middleware]:
        """Its own middleware, inside its registry's."""

    @property
    def keep_result(self) -> bool:
        """Whether what the handler returns is stored with the job."""

    @property
    def registry(self) -> TaskLookup | None:
        """The registry it was registered in (its insert hooks apply to its jobs)."""

    def check_args(self, args: Mapping[str, Any]) -> None:
        """Raise `InvalidJobError` unless the handler takes `args`."""

    def args_misfit(self, args: Mapping[str, Any]) -> str | None:
        """Why the handler cannot take `args`, or None when it can."""

    def encode_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """`args` as the JSON a job keeps (annotated values validated and converted)."""

    def decode_args(self, args: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
        """The handler's keyword arguments rebuilt from stored `args`, or why they cannot be."""

    def row_about(self, args: Mapping[str, Any]) -> str | None:
        """The `about` of a job with these encoded args (its row argument), or None."""

    def load_rows(
        self, ctx: JobContext, args: Mapping[str, Any]
    ) -> tuple[Mapping[str, Any], RowsRefused | None]:
        """Decoded `args` with their row references loaded (in the session `ctx.session()`
        returns next), or why the handler is not called; `args` as they are without any."""


class TaskLookup(Protocol):
    """A registry as the runner and the enqueue paths read it (`sqla_queue.Registry`): its
    tasks by name, its insert hooks, its middleware, its resources and its lifecycle hooks."""

    @property
    def insert_hooks(self) -> Sequence[InsertHook]:
        """Run, in order, on every job written through it."""

    @property
    def middleware(self) -> Sequence[Middleware]:
        """Wraps every job's execution (outside each task's own)."""

    @property
    def resources(self) -> Mapping[str, Any]:
        """Handed to every job (`JobContext.resources`)."""

    @property
    def hooks(self) -> LifecycleHooks:
        """The lifecycle hooks (claimed, finished, worker started and stopping)."""

    def get(self, name: str) -> TaskSpec | None:
        """The task registered under `name`, or None."""

    def __getitem__(self, name: str) -> TaskSpec: ...

    def __contains__(self, name: object) -> bool: ...

    def __iter__(self) -> Iterator[str]:
        """The registered task names."""
