"""What the tests of partitions, sequences and limited queues share: a backlog that has each
of them as shown (stats, metrics, the dashboard, doctor), and the claim statement driven by
hand (`claim`, `finish`, `fail`, `make_queue`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

from sqla_queue import admin, enqueue, enqueue_many
from sqla_queue.admin import partitions
from sqla_queue.db import queries

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


def claim(conn: Connection, limit: int, queues: list[str] | None = None) -> list[Any]:
    """Run the claim statement (of `queues`, or every queue) for up to `limit` jobs, as
    worker "w", and commit: the rows it returned, in its order."""
    params: dict[str, Any] = {"limit": limit, "worker_id": "w"}
    if queues is not None:
        params["queues"] = queues
    rows = conn.execute(queries.claim_jobs(queues), params).mappings().all()
    conn.commit()
    return list(rows)


def finish(conn: Connection, rows: list[Any]) -> None:
    """The worker's finish of claimed `rows` that succeeded."""
    params = {"job_ids": [r["id"] for r in rows], "job_attempts": [r["attempts"] for r in rows]}
    conn.execute(queries.complete_jobs(), params)
    conn.commit()


def fail(conn: Connection, rows: list[Any]) -> None:
    """Mark claimed `rows` failed (as a last attempt would end)."""
    ids = [r["id"] for r in rows]
    conn.execute(
        text(
            "UPDATE sqla_queue.jobs SET status = 'failed', finished_at = now(), "
            "lease_expires_at = NULL WHERE id = ANY(:ids)"
        ),
        {"ids": ids},
    )
    conn.commit()


def make_queue(engine: Engine, name: str = "tenants", **settings: Any) -> None:
    """Create queue `name` with `settings`: fair, partition_limit, aging, sequence_on_failure."""
    with engine.begin() as conn:
        admin.create_queue(conn, name)
        if settings.get("fair"):
            partitions.set_fair(conn, name, True)
        if "partition_limit" in settings:
            partitions.set_partition_limit(conn, name, settings["partition_limit"])
        if "aging" in settings:
            partitions.set_aging(conn, name, settings["aging"])
        if "sequence_on_failure" in settings:
            partitions.set_sequence_on_failure(conn, name, settings["sequence_on_failure"])
