"""`QueueHelper`: the testing functions bound to one session (or engine) and one registry."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from sqla_queue.db.models import HistoryJob, Job
from sqla_queue.errors import ConfigurationError
from sqla_queue.registry import Registry
from sqla_queue.testing.assertions import (
    JobFilters,
    assert_enqueued,
    assert_not_enqueued,
    enqueued_jobs,
)
from sqla_queue.testing.drain import DrainResult, drain
from sqla_queue.testing.inline import inline

if TYPE_CHECKING:
    from typing_extensions import Unpack


class QueueHelper:
    """What the plugin's `queue` fixture is: look at jobs, run them, on one database.

    def test_order_sends_receipt(queue, sqla_queue_session):
        place_order(sqla_queue_session, "ada@example.com")
        queue.assert_enqueued(task="shop.tasks.send_receipt", args={"email": "ada@example.com"})
        assert queue.drain().succeeded == 1
    """

    def __init__(
        self, target: Session | Connection | Engine, registry: Registry | None = None
    ) -> None:
        self.target = target
        self.registry = registry

    def _registry(self, registry: Registry | None) -> Registry:
        found = registry or self.registry
        if found is None:
            raise ConfigurationError(
                detail="no task registry to run jobs with: pass one (queue.drain(registry)), "
                "set `sqla_queue_registry = pkg.module:registry` in the pytest ini options, "
                "or override the `sqla_queue_registry` fixture"
            )
        return found

    def jobs(self, **filters: Unpack[JobFilters]) -> list[Job | HistoryJob]:
        """`enqueued_jobs` on this helper's database."""
        return enqueued_jobs(self.target, **filters)

    def assert_enqueued(
        self, *, count: int | None = None, **filters: Unpack[JobFilters]
    ) -> list[Job | HistoryJob]:
        """`assert_enqueued` on this helper's database."""
        return assert_enqueued(self.target, count=count, **filters)

    def assert_not_enqueued(self, **filters: Unpack[JobFilters]) -> None:
        """`assert_not_enqueued` on this helper's database."""
        assert_not_enqueued(self.target, **filters)

    def drain(
        self,
        registry: Registry | None = None,
        *,
        queue: str | Sequence[str] | None = None,
        max_jobs: int | None = None,
        include_scheduled: bool = False,
        reraise: bool = False,
    ) -> DrainResult:
        """`drain` on this helper's database, with its registry unless one is given."""
        return drain(
            self.target,
            self._registry(registry),
            queue=queue,
            max_jobs=max_jobs,
            include_scheduled=include_scheduled,
            reraise=reraise,
        )

    def inline(
        self,
        registry: Registry | None = None,
        *,
        include_scheduled: bool = False,
        reraise: bool = True,
    ) -> AbstractContextManager[DrainResult]:
        """`inline` mode with this helper's registry unless one is given."""
        return inline(
            self._registry(registry), include_scheduled=include_scheduled, reraise=reraise
        )
