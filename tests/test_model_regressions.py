"""Examples the model-based test (tests/test_model.py) found, kept as plain tests.

Each replays the shrunk steps Hypothesis printed on a `QueueMachine` of its own database,
checking the model's invariants after every step, as the state machine does. Those that
are defects of issue 20 being fixed on another branch are marked xfail (not strict) until
that branch is merged; the merger removes the mark.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from model_kit import Clones
from test_model import QueueMachine

from sqla_queue.testing import TemplateDatabases


@pytest.fixture
def machine(databases: TemplateDatabases) -> Iterator[QueueMachine]:
    QueueMachine.pool = Clones(databases)
    state = QueueMachine()
    try:
        yield state
    finally:
        state.teardown()
        QueueMachine.pool = None


def replay(state: QueueMachine, *steps: tuple[str, dict[str, Any]]) -> None:
    """Run each (rule, arguments), then the invariants, as the state machine does."""
    state.holds()
    for name, arguments in steps:
        getattr(state, name)(**arguments)
        state.holds()


def job(task: str, b: str, queue: str = "default", letter: str | None = None, **more: Any) -> Any:
    return {
        "tb": (task, b),
        "queue": queue,
        "letter": letter,
        "delay": more.get("delay"),
        "max_attempts": more.get("max_attempts"),
    }


@pytest.mark.xfail(strict=False, reason="defect 1.6 of issue 20, fixed on branch fix/enqueue")
def test_wait_for_with_timeout_0_reports_a_cancelled_job(machine: QueueMachine) -> None:
    replay(
        machine,
        ("enqueue", {"spec": job("plain", "ok"), "via": "connection"}),
        ("cancel", {"indices": [0]}),
        ("poll_result", {"index": 0}),
    )
