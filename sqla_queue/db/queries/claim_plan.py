"""The claim's plan and the jobs table's planner statistics.

The worker's claim (`claim.claim_jobs`) is planned once and kept (a prepared statement's
generic plan). On a table PostgreSQL has never analyzed it expects a few dozen due rows
whatever the backlog; `claim_jobs` is written so that even then the claim index is read in
order, and a worker's upkeep (`sqla_queue.worker.vacuum`, on a thread of its own, never the
claim loop's) still refreshes statistics it finds missing or far off (`statistics_stale`).
`doctor` EXPLAINs the claim and warns when its plan is not the index-ordered one
(`reads_claim_index_in_order`).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Connection, Dialect, Float, Select, cast, func, select

from sqla_queue.db.models import SCHEMA
from sqla_queue.db.queries.claim import claim_jobs
from sqla_queue.db.queries.common import catalog_view, jobs

ANALYZE_JOBS = f"ANALYZE {jobs.fullname}"
"""What doctor advises when the claim's plan sorts (a worker runs it with SKIP_LOCKED)."""

STALE_CHANGES = 1_000
"""Rows changed since the last ANALYZE that make statistics stale, at the least; above that,
more changes than the table had rows then (the estimate is off by more than 2x)."""

_classes = catalog_view("pg_class", "oid", "reltuples")
_stats = catalog_view(
    "pg_stat_user_tables", "relid", "schemaname", "relname", "n_mod_since_analyze"
)


def jobs_statistics() -> Select[Any]:
    """(reltuples, rows changed since the last ANALYZE) of the jobs table; reltuples is -1
    on a table never analyzed (nor vacuumed)."""
    return (
        select(cast(_classes.c.reltuples, Float), func.coalesce(_stats.c.n_mod_since_analyze, 0))
        .select_from(_stats.join(_classes, _classes.c.oid == _stats.c.relid))
        .where(_stats.c.schemaname == SCHEMA, _stats.c.relname == jobs.name)
    )


def statistics_stale(reltuples: float, changed: int) -> bool:
    """Whether the planner's statistics of the jobs table are missing or far off."""
    return reltuples < 0 or changed > max(STALE_CHANGES, reltuples)


_EXPLAIN_TEXTS: dict[tuple[Any, ...], tuple[str, str]] = {}
"""`claim_explain_sql`'s texts by (dialect class, paramstyle, queue names, batch): building
and compiling the claim costs tens of ms of CPU each time, and its text depends on nothing
else (doctor and the dashboard's doctor page EXPLAIN both forms on every call)."""
EXPLAIN_TEXTS_KEPT = 32
"""Texts `_EXPLAIN_TEXTS` keeps at most (forms of `--queues` lists); then it starts over."""


def claim_explain_sql(
    dialect: Dialect, queue_names: list[str] | None, batch: int
) -> tuple[str, str]:
    """`PREPARE` and `EXPLAIN EXECUTE` texts of the worker's claim (no limited queue, the
    batch in its text, as the worker sends it), for a generic plan's EXPLAIN; built once
    per form and kept (`_EXPLAIN_TEXTS`)."""
    key = (
        type(dialect),
        dialect.paramstyle,
        None if queue_names is None else tuple(queue_names),
        batch,
    )
    texts = _EXPLAIN_TEXTS.get(key)
    if texts is None:
        if len(_EXPLAIN_TEXTS) >= EXPLAIN_TEXTS_KEPT:
            _EXPLAIN_TEXTS.clear()
        texts = _EXPLAIN_TEXTS[key] = _build_explain_sql(dialect, queue_names, batch)
    return texts


def _build_explain_sql(
    dialect: Dialect, queue_names: list[str] | None, batch: int
) -> tuple[str, str]:
    statement = claim_jobs(queue_names, False, batch, {"task_leases": {}, "task_max_attempts": {}})
    compiled = statement.compile(dialect=dialect)
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    body = re.sub(r"%\((\w+)\)s", positional, compiled.string).replace("%%", "%")
    values = {"worker_id": "'doctor'", "lease": "60", "queues": _text_array(queue_names)}
    arguments = ", ".join(values[name] for name in names)
    return (
        f"PREPARE sqla_queue_claim_plan AS {body}",
        f"EXPLAIN EXECUTE sqla_queue_claim_plan({arguments})",
    )


def _text_array(names: list[str] | None) -> str:
    quoted = ", ".join("'" + name.replace("'", "''") + "'" for name in names or [])
    return f"ARRAY[{quoted}]::text[]"


def claim_plan(conn: Connection, queue_names: list[str] | None = None, batch: int = 50) -> str:
    """The generic plan of the worker's claim on `conn`, as EXPLAIN prints it (EXPLAIN
    without ANALYZE: nothing runs, nothing is claimed)."""
    prepare, explain = claim_explain_sql(conn.dialect, queue_names, batch)
    conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    try:
        conn.exec_driver_sql(prepare.replace("%", "%%"))
        try:
            return "\n".join(str(row[0]) for row in conn.exec_driver_sql(explain))
        finally:
            conn.exec_driver_sql("DEALLOCATE sqla_queue_claim_plan")
    finally:
        conn.exec_driver_sql("RESET plan_cache_mode")


def _outside_subplans(plan: str) -> str:
    """The lines of `plan` that are not inside a SubPlan: the probes a filter runs per row
    (a job's sequence, say) may read any index any way; the scan they filter is the rest."""
    kept: list[str] = []
    inside: int | None = None  # the indentation of the SubPlan being skipped
    for line in plan.splitlines():
        indent = len(line) - len(line.lstrip())
        if inside is not None and indent > inside:
            continue
        inside = indent if line.strip().startswith("SubPlan") else None
        if inside is None:
            kept.append(line)
    return "\n".join(kept)


def reads_claim_index_in_order(plan: str) -> bool:
    """Whether the plan's locking scan (the candidates CTE) reads a claim index in order:
    an index scan of `ix_jobs_claim*` with no sort and no bitmap scan under the lock (in
    the SubPlans its filter runs per row, any index read goes)."""
    candidates = plan.split("CTE candidates")[-1].split("\n  CTE ")[0]
    locking = _outside_subplans(candidates.split("LockRows", 1)[-1])
    ordered = re.search(r"Index (Only )?Scan using ix_jobs_claim", locking) is not None
    return ordered and "Sort" not in locking and "Bitmap" not in locking


FIX_CLAIM_PLAN = (
    f"Run {ANALYZE_JOBS} (a worker does when it sees the statistics missing or far off); "
    "keep autovacuum on, whose analyze the migration's settings start every 1,000 changes."
)
"""What doctor advises when the claim's plan is not the index-ordered one."""


def claim_plan_health(conn: Connection) -> tuple[bool, str, dict[str, Any]]:
    """Whether both forms of the worker's claim (any queue, and a list of queues: `-q`) read
    the claim index in order as generic plans; a line saying so, and the figures."""
    row = conn.execute(jobs_statistics()).first()
    reltuples, changed = (float(row[0]), int(row[1])) if row is not None else (-1.0, 0)
    ordered = {
        form: reads_claim_index_in_order(claim_plan(conn, names))
        for form, names in (("any queue", None), ("listed queues", ["default"]))
    }
    details: dict[str, Any] = {
        "index_ordered": ordered,
        "reltuples": reltuples,
        "changed_since_analyze": changed,
    }
    statistics = (
        "the jobs table was never analyzed"
        if reltuples < 0
        else f"{changed} rows changed since the last ANALYZE of {reltuples:.0f}"
    )
    if all(ordered.values()):
        return True, f"reads the claim index in order ({statistics})", details
    sorted_forms = " and ".join(form for form, good in ordered.items() if not good)
    message = (
        f"the claim of {sorted_forms} sorts every due job instead of reading the claim "
        f"index in order ({statistics}): its cost grows with the backlog"
    )
    return False, message, details
