"""What a queue routed to a broker refuses: unique keys, sequences, partitions, start
deadlines and ORM row arguments.

The relay deletes a job's row when it publishes it, and broker workers take what the broker
hands them: nothing that the table keeps for a job while it waits or runs holds there. A
unique key would be free again, jobs of one sequence would run at once, and a partition's
limit and the fair queue's turns would not be kept. Such a job is refused at enqueue (before
anything is written, so the transaction goes on), and a queue holding such jobs cannot be
routed (`queue_settings.set_route`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from sqla_queue.db.queries import brokers as broker_queries
from sqla_queue.errors import InvalidJobError
from sqla_queue.job.arguments import ROW_MARK

_ROUTED_AMONG = broker_queries.routed_among()
_MAY_READ_QUEUES = broker_queries.may_read_queues()

NOT_KEPT_ON_ROUTES: dict[str, tuple[str, str, str]] = {
    "sequence": (
        "a sequence cannot be kept: broker workers take its jobs as the broker hands them "
        "out, so jobs of one sequence would run at once",
        "sequence=None, no --sequence",
        "job(s) with a sequence",
    ),
    "partition": (
        "partitions are not honoured: the relay publishes in priority order and broker "
        "workers keep neither a partition limit nor a fair queue's turns",
        "partition=None, no --partition",
        "job(s) with a partition",
    ),
    "unique": (
        "a unique key cannot be held: the relay deletes a job's row, and its key with it, "
        "when it publishes, so the same unique job would be accepted again while the first "
        "waits in the broker",
        "unique=False if the task is unique by default",
        "unique job(s)",
    ),
    "expires_at": (
        "a start deadline is not kept: the relay publishes the job and broker workers run "
        "it whenever the broker hands it out, past its deadline too",
        "no expires_in= or expires_at=",
        "job(s) with a start deadline",
    ),
    "rows": (
        "a row argument cannot be loaded: a broker worker has no database session to load "
        "it in before the handler runs",
        "pass the row's id instead of the row",
        "job(s) with a row argument",
    ),
}
"""Each job feature a routed queue refuses: (why it cannot hold there, how to leave it out,
what its jobs are called)."""
_PARAMS = {
    "sequence": "job_sequence",
    "partition": "job_partition",
    "unique": "job_unique_key",
    "expires_at": "job_expires_at",
    "rows": "job_row_refs",
}


def has_row_refs(args: object) -> bool | None:
    """True when a job's args hold an ORM row reference (`sqla_queue.job.arguments`), else
    None (what `routed_refusal` reads as "not there")."""
    if not isinstance(args, Mapping):
        return None
    found = any(isinstance(v, Mapping) and ROW_MARK in v for v in args.values())
    return True if found else None


def refused_on_routed(feature: str, queue: str, route: str, held: int = 0) -> str:
    """Why jobs with `feature` (`unique`, `sequence`, `partition`) and a route do not go
    together on queue `queue` (with `held` such jobs queued or running: why it cannot be
    routed now)."""
    why, leave_out, jobs = NOT_KEPT_ON_ROUTES[feature]
    fix = (
        f"it has {held} {jobs} queued or running: let them finish (or cancel them) before "
        f"routing it, and enqueue its jobs without {feature}"
        if held
        else f"enqueue it without {feature} ({leave_out}) or into a queue that is not routed"
    )
    return f"queue {queue!r} is routed to a broker ({route}), where {why}; {fix}"


def routed_refusal(
    connection: Connection, params: Sequence[Mapping[str, Any]]
) -> tuple[int, InvalidJobError] | None:
    """The first of the rows (`job_*` parameters) that a routed queue refuses (one with a
    unique key, a sequence or a partition), by index, with its error; None: none is. One
    read, and only when some row has one of them. A role that may not read the queues (an
    enqueue-only role) is not checked: a failed read would abort its transaction."""
    flagged = [
        (i, feature)
        for i, p in enumerate(params)
        for feature, key in _PARAMS.items()
        if p.get(key) is not None
    ]
    if not flagged or not connection.execute(_MAY_READ_QUEUES).scalar():
        return None
    names = sorted({params[i]["job_queue"] for i, _ in flagged})
    routed = connection.execute(_ROUTED_AMONG, {"queues": names}).first()
    if routed is None:
        return None
    i, feature = next((i, f) for i, f in flagged if params[i]["job_queue"] == routed.name)
    detail = refused_on_routed(feature, routed.name, routed.route)
    return i, InvalidJobError(task=params[i]["job_task"], detail=detail)


def refuse_routed(connection: Connection, params: Sequence[Mapping[str, Any]]) -> None:
    """Raise `InvalidJobError` for the first row a routed queue refuses (`routed_refusal`),
    before anything is written: the transaction goes on."""
    refused = routed_refusal(connection, params)
    if refused is not None:
        raise refused[1]


ROW_TEXT = f'"{ROW_MARK}"'
"""A row reference's mark as it shows in a job's args as JSON text."""


def with_row_refs(params: dict[str, Any]) -> dict[str, Any]:
    """A bulk row's parameters, flagged (`job_row_refs`) when its args' JSON text holds a
    row reference; as they are otherwise (no copy)."""
    text = params.get("job_args_json")
    if isinstance(text, str) and ROW_TEXT in text:
        return {**params, "job_row_refs": True}
    return params
