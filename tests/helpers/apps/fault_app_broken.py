"""For the bad-input tests: a registry module whose import raises."""

from sqla_queue import Registry

registry = Registry()

raise RuntimeError("fault_app_broken fails on import, as a broken app would")
