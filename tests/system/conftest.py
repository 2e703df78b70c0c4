"""Fixtures of the model-based tests (tests/system/test_model*.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sqla_queue.testing import TemplateDatabases
from system.model_kit import Clones
from system.test_model import QueueMachine


@pytest.fixture
def machine(databases: TemplateDatabases) -> Iterator[QueueMachine]:
    """A `QueueMachine` on a database of its own, to replay rules one by one."""
    QueueMachine.pool = Clones(databases)
    state = QueueMachine()
    try:
        yield state
    finally:
        state.teardown()
        QueueMachine.pool = None
