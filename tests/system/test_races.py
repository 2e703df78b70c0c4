"""The race harness itself (tests/helpers/races.py): it sees a wait, reports a wedge, never
hangs."""

from __future__ import annotations

import pytest
from helpers.races import Race, open_transactions
from sqlalchemy import Connection, Engine, text


def _lock_queues(conn: Connection) -> None:
    conn.execute(text("select * from sqla_queue.queues where name = 'default' for update"))


def _pause_default(engine: Engine) -> int:
    with engine.begin() as conn:
        return conn.execute(
            text("update sqla_queue.queues set paused = paused where name = 'default'")
        ).rowcount


def test_a_call_behind_a_held_row_lock_waits_and_finishes_after_the_commit(engine: Engine) -> None:
    with Race(engine) as race:
        held = race.hold(_lock_queues)
        other = race.beside(lambda: _pause_default(engine), "update of the locked queue")
        assert race.wait_blocked_by(held, other) is True
        assert open_transactions(engine)  # the held one
        held.commit()
        assert other.result() == 1
    assert open_transactions(engine) == []


def test_a_call_that_never_returns_fails_the_test_instead_of_hanging(engine: Engine) -> None:
    with Race(engine) as race:
        race.hold(_lock_queues)
        other = race.beside(lambda: _pause_default(engine), "update of the locked queue")
        with pytest.raises(AssertionError, match=r"did not return within 0\.5 s .*behind"):
            other.result(deadline=0.5)
    # leaving the block rolled the holder back and ended the waiting session
    assert open_transactions(engine) == []


def test_a_call_that_needs_no_lock_of_the_holder_is_not_reported_blocked(engine: Engine) -> None:
    with Race(engine) as race:
        held = race.hold(_lock_queues)
        other = race.beside(lambda: 42, "a call that takes no lock")
        assert race.wait_blocked_by(held, other) is False
        assert other.result() == 42
