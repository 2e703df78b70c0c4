"""What the tests of partitions, sequences and limited queues share: a backlog that has each
of them as shown (stats, metrics, the dashboard, doctor). The claim statement driven by hand
is in helpers/statements.py, `make_queue` in helpers/support.py."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import admin, enqueue, enqueue_many
from sqla_queue.admin import partitions

HELD_SEQUENCE = "order-<b>[42]</b>"
"""The sequence the failed job holds: markup of HTML and of rich, to be shown as text."""


def turns_backlog(
    engine: Engine,
    partition_counts: tuple[tuple[str, int], ...] = (("[red]acme", 3), ("globex", 1)),
    held_minutes: int = 20,
) -> int:
    """A fair queue `tenants` with jobs in partitions `partition_counts` and one without a
    partition, an aging queue `slow` (60 s) with one aged job, and sequence
    `HELD_SEQUENCE` of queue default held by a failed job (failed `held_minutes` ago) with
    two queued jobs behind it; returns the failed job's id."""
    with engine.begin() as conn:
        admin.create_queue(conn, "tenants")
        partitions.set_fair(conn, "tenants", True)
        admin.create_queue(conn, "slow")
        partitions.set_aging(conn, "slow", 60)
    rows: list[dict[str, object]] = [
        {"task": "t", "args": {"n": n}, "queue": "tenants", "partition": tenant}
        for tenant, count in partition_counts
        for n in range(count)
    ]
    rows.append({"task": "t", "args": {}, "queue": "tenants"})
    waited = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    rows.append({"task": "t", "args": {}, "queue": "slow", "priority": 5, "run_at": waited})
    with Session(engine) as session, session.begin():
        enqueue_many(session, rows)
        held = [enqueue(session, "t", {"n": n}, sequence=HELD_SEQUENCE) for n in range(3)]
        session.flush()
        failed_id = held[0].id
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'failed', "
                "finished_at = now() - make_interval(mins => :minutes) WHERE id = :id"
            ),
            {"id": failed_id, "minutes": held_minutes},
        )
    return failed_id
