"""A registry whose periodic task lives in another module, named by `include`:
`sqla-queue worker --app helpers.apps.included_app:registry` must know it."""

from __future__ import annotations

from sqla_queue import Registry

registry = Registry(include=["helpers.apps.included_reports"])

broken = Registry(include=["helpers.apps.included_reports", "helpers.apps.no_such_reports"])
"""Names a module that does not exist."""
