"""A registry whose periodic task lives in another module, named by `include`:
`sqla-queue worker --app apps.included_app:registry` must know it."""

from __future__ import annotations

from sqla_queue import Registry

registry = Registry(include=["apps.included_reports"])

broken = Registry(include=["apps.included_reports", "apps.no_such_reports"])
"""Names a module that does not exist."""
