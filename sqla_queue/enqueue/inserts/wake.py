"""Waking workers: one `pg_notify` per queue per transaction, delivered on commit."""

from __future__ import annotations

import threading

from sqlalchemy import event
from sqlalchemy.orm import (
    Session,
    SessionTransaction,
    UOWTransaction,
)

from sqla_queue.db import queries
from sqla_queue.db.models import (
    Job,
)
from sqla_queue.enqueue.inserts.params import JOB_BIND

NOTIFIED_KEY = "sqla_queue.notified"
"""Key in `session.info`: the queues this transaction has notified already."""
NOTIFY_QUEUES = queries.notify_queues()
"""One `pg_notify` per queue of `:queues` (built once)."""


def wake_queues(session: Session, queue_names: set[str]) -> None:
    """Notify the queues of `queue_names` this transaction has not notified yet."""
    notified: set[str] = session.info.setdefault(NOTIFIED_KEY, set())
    fresh = queue_names - notified
    if fresh:
        session.connection(bind_arguments=JOB_BIND).execute(
            NOTIFY_QUEUES, {"queues": sorted(fresh)}
        )
        notified |= fresh


def _notify_after_flush(session: Session, flush_context: UOWTransaction) -> None:
    queue_names = {obj.queue for obj in session.new if isinstance(obj, Job)}
    if queue_names:
        wake_queues(session, queue_names)


def _forget_notified(session: Session, transaction: SessionTransaction) -> None:
    # Flushes run in their own inner SessionTransaction: only a real (sub)transaction's end
    # counts. PostgreSQL drops notifications of a rolled-back savepoint: notify again then.
    if transaction.parent is None or transaction.nested:
        session.info.pop(NOTIFIED_KEY, None)


def listen() -> None:
    """Install the two `Session` listeners that wake workers (idempotent): called by the
    enqueue paths (`sqla_queue.enqueue.install_listeners`), never at import."""
    if event.contains(Session, "after_flush", _notify_after_flush):
        return
    with _LISTENING:
        if not event.contains(Session, "after_flush", _notify_after_flush):
            event.listen(Session, "after_transaction_end", _forget_notified)
            event.listen(Session, "after_flush", _notify_after_flush)  # last: the check above


_LISTENING = threading.Lock()
