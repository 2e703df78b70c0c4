"""The NOTIFY channels and the statements that speak on them (LISTEN, pg_notify)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, Text, bindparam, func, select

from sqla_queue.models import NOTIFY_CHANNEL

from .common import queue_names_param

RESULTS_CHANNEL = f"{NOTIFY_CHANNEL}_results"
"""The channel on which finishing statements name (by id) the jobs that reached a final
state with something to tell a waiter: a kept result, or a failure (`sqla_queue.wait_for`)."""


def notify_queues() -> Select[Any]:
    """`pg_notify` once per queue in `:queues`; delivered by PostgreSQL only on commit."""
    names = func.unnest(queue_names_param()).table_valued("name")
    return select(func.pg_notify(NOTIFY_CHANNEL, names.c.name)).select_from(names)


CANCEL_CHANNEL = f"{NOTIFY_CHANNEL}_cancel"
"""The channel on which a cancel names the running jobs it cancelled (comma-separated ids)."""

LISTEN = f'LISTEN "{NOTIFY_CHANNEL}"; LISTEN "{CANCEL_CHANNEL}"'
"""Not expressible in Core: the one plain-text statement, sent by the listener connection."""

LISTEN_RESULTS = f'LISTEN "{RESULTS_CHANNEL}"'
"""Not expressible in Core: what `sqla_queue.wait_for`'s listener connection sends."""


def notify_cancelled() -> Select[Any]:
    """`pg_notify(CANCEL_CHANNEL, :job_ids)`: running jobs that were cancelled, on commit."""
    return select(func.pg_notify(CANCEL_CHANNEL, bindparam("job_ids", type_=Text)))
