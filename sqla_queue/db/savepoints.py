"""Telling a transaction's commit from a savepoint's release in the session's commit events.

SQLAlchemy fires `before_commit` and `after_commit` for the release of a savepoint
(`session.begin_nested()`) as for the commit of the transaction. What must happen once, at
the real commit (enqueue what the transaction's changes call for, finish a job in the
handler's transaction), asks `commits_the_transaction` first.
"""

from __future__ import annotations

from sqlalchemy.orm import Session
from sqlalchemy.orm.state_changes import _StateChangeStates


def commits_the_transaction(session: Session) -> bool:
    """Whether the commit event `session` fires now is its outer transaction's, not a
    savepoint's release."""
    if not session.in_nested_transaction():
        return True
    # The outer transaction committed with a savepoint still open: its commit is under way
    # (SQLAlchemy marks a transaction changing state) while the savepoint is still current.
    outer = session.get_transaction()
    return outer is not None and outer._next_state is _StateChangeStates.CHANGE_IN_PROGRESS


__all__ = ["commits_the_transaction"]
