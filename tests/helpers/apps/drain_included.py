"""A registry whose only task lives in another module, named by `include`: `drain` must
know it without the test importing that module."""

from __future__ import annotations

from sqla_queue import Registry

registry = Registry(include=["helpers.apps.drain_included_tasks"])
