"""The worker's own statements run by hand, and what they leave: claim, complete and fail
jobs the way a worker would (`claim`, `claim_rows`, `claim_all`, `finish`, `succeed`, `fail`),
mark claimed rows failed without the fail statement (`mark_failed`), and read a job's state
(`states`, `status_of`)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, text

from sqla_queue.db import queries


def claim_rows(
    conn: Connection, limit: int, queues: list[str] | None = None, worker_id: str = "w"
) -> list[RowMapping]:
    """Run the claim statement (of `queues`, or every queue) for up to `limit` jobs, as
    `worker_id`, in the caller's transaction: the rows it returned, in its order."""
    params: dict[str, Any] = {"limit": limit, "worker_id": worker_id}
    if queues is not None:
        params["queues"] = queues
    return list(conn.execute(queries.claim_jobs(queues), params).mappings().all())


def claim(conn: Connection, limit: int, queues: list[str] | None = None) -> list[RowMapping]:
    """`claim_rows` as worker "w", then commit."""
    rows = claim_rows(conn, limit, queues)
    conn.commit()
    return rows


def claim_all(engine: Engine, limit: int = 1000) -> dict[int, int]:
    """Claim every due job (up to `limit`) in a transaction of its own; {id: attempt}."""
    with engine.begin() as conn:
        return {row["id"]: row["attempts"] for row in claim_rows(conn, limit)}


def finish(conn: Connection, rows: list[Any]) -> None:
    """The worker's finish of claimed `rows` that succeeded, then commit."""
    params = {"job_ids": [r["id"] for r in rows], "job_attempts": [r["attempts"] for r in rows]}
    conn.execute(queries.complete_jobs(), params)
    conn.commit()


def succeed(engine: Engine, claimed: dict[int, int], results: dict[int, Any] | None = None) -> int:
    """Finish claimed jobs ({id: attempt}) as succeeded, keeping `results[id]` (JSON) where
    given; the statement's count."""
    ids = list(claimed)
    results = results or {}
    params = {
        "job_ids": ids,
        "job_attempts": [claimed[i] for i in ids],
        "job_results": [json.dumps(results[i]) if i in results else None for i in ids],
    }
    with engine.begin() as conn:
        return int(conn.execute(queries.complete_jobs(), params).scalar_one())


def fail(engine: Engine, claimed: dict[int, int]) -> None:
    """The worker's fail statement for claimed jobs ({id: attempt}), error "boom"."""
    ids = list(claimed)
    params = {
        "job_ids": ids,
        "job_attempts": [claimed[i] for i in ids],
        "job_errors": ["boom"] * len(ids),
    }
    with engine.begin() as conn:
        conn.execute(queries.fail_jobs(), params)


def mark_failed(conn: Connection, rows: list[Any]) -> None:
    """Mark claimed `rows` failed (as a last attempt would end), then commit."""
    ids = [r["id"] for r in rows]
    conn.execute(
        text(
            "UPDATE sqla_queue.jobs SET status = 'failed', finished_at = now(), "
            "lease_expires_at = NULL WHERE id = ANY(:ids)"
        ),
        {"ids": ids},
    )
    conn.commit()


def states(engine: Engine, *ids: int) -> list[tuple[str, int | None]]:
    """(status, deps_left) of each job, ("gone", None) for one that is not there."""
    with engine.connect() as conn:
        rows = {
            row.id: (row.status, row.deps_left)
            for row in conn.execute(
                text("SELECT id, status, deps_left FROM sqla_queue.jobs WHERE id = ANY(:ids)"),
                {"ids": list(ids)},
            )
        }
    return [rows.get(i, ("gone", None)) for i in ids]


def statuses_of(engine: Engine, *ids: int) -> list[str]:
    """Each job's status, "gone" for one that is not there."""
    return [status for status, _ in states(engine, *ids)]


def status_of(engine: Engine, job_id: int) -> str:
    """The job's status, "gone" when it is not there."""
    return statuses_of(engine, job_id)[0]
