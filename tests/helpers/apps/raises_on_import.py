"""An application whose module raises while it is imported (`--app` must say where)."""

from __future__ import annotations

from sqla_queue import Registry

registry = Registry()

SETTINGS: dict[str, str] = {}
DATABASE = SETTINGS["DATABASE"]  # the line the error names
