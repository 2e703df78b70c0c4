"""The task of `apps.drain_included:registry`, registered from its own module."""

from __future__ import annotations

from helpers.apps.drain_included import registry

ran: list[int] = []


@registry.task(name="included.count")
def count(n: int) -> None:
    ran.append(n)
