"""The jobs table's upkeep: how many dead rows it has, the lock that lets one worker at a
time VACUUM or ANALYZE it (`sqla_queue.worker.vacuum`), the statements, which never wait for
the table's lock, and the empty pages at its end a truncation could give back; `doctor`
reads the same."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Select,
    TextClause,
    cast,
    column,
    exists,
    func,
    select,
    table,
    text,
)

from sqla_queue.db.models import SCHEMA
from sqla_queue.db.queries.catalog import table_stats
from sqla_queue.db.queries.common import catalog_view, seconds_since

VACUUM_LOCK_SPACE = 1936813174
"""The advisory lock namespace of the self-vacuum ('sqlv' as an int4)."""
VACUUM_LOCK_KEY = 1
"""The key, in that namespace, of the jobs table's upkeep (its VACUUM or ANALYZE)."""
UPKEEP_LOCK_TIMEOUT = "1s"
"""The upkeep session's `lock_timeout`: SKIP_LOCKED does not wait for the table's lock, and
no other lock it needs may hold it longer than this."""
TRUNCATE_JOBS = f"VACUUM (TRUNCATE true) {SCHEMA}.jobs"
"""What gives the empty pages at the jobs table's end back (its `vacuum_truncate` is false,
migration sqlaq_0017): an operator's command for a quiet moment, as `doctor` prints it."""

_locks = catalog_view("pg_locks", "locktype", "database", "classid", "objid", "objsubid", "granted")


def jobs_vacuum_state() -> Select[Any]:
    """One row for the jobs table: `live` and `dead` rows as the statistics collector
    counts them, seconds since its last `vacuum` (by anybody: a worker, a user) and last
    `autovacuum` (NULL when never), and whether a worker is `vacuuming` it now."""
    vacuuming = exists().where(
        _locks.c.locktype == "advisory",
        _locks.c.database
        == select(column("oid"))
        .select_from(table("pg_database", column("oid"), column("datname")))
        .where(column("datname") == func.current_database())
        .scalar_subquery(),
        cast(_locks.c.classid, BigInteger) == VACUUM_LOCK_SPACE,
        cast(_locks.c.objid, BigInteger) == VACUUM_LOCK_KEY,
        _locks.c.objsubid == 2,  # the two-int4 form of an advisory lock key
        _locks.c.granted,
    )
    return select(
        table_stats.c.n_live_tup.label("live"),
        table_stats.c.n_dead_tup.label("dead"),
        seconds_since(table_stats.c.last_vacuum).label("vacuum"),
        seconds_since(table_stats.c.last_autovacuum).label("autovacuum"),
        vacuuming.label("vacuuming"),
    ).where(table_stats.c.schemaname == SCHEMA, table_stats.c.relname == "jobs")


def try_vacuum_lock() -> Select[Any]:
    """Take the upkeep's session advisory lock if nobody holds it: true if taken (never
    waits: a worker that does not get it leaves the table to the one that has it)."""
    return select(func.pg_try_advisory_lock(VACUUM_LOCK_SPACE, VACUUM_LOCK_KEY))


def vacuum_unlock() -> Select[Any]:
    """Release the upkeep's lock taken by `try_vacuum_lock` on this session."""
    return select(func.pg_advisory_unlock(VACUUM_LOCK_SPACE, VACUUM_LOCK_KEY))


def set_upkeep_lock_timeout() -> TextClause:
    """`lock_timeout` for the upkeep's session (`UPKEEP_LOCK_TIMEOUT`)."""
    return text(f"SET lock_timeout = '{UPKEEP_LOCK_TIMEOUT}'")


def reset_lock_timeout() -> TextClause:
    return text("RESET lock_timeout")


def vacuum_jobs() -> TextClause:
    """VACUUM and ANALYZE the jobs table (outside any transaction: on an autocommit
    connection). ANALYZE too: a VACUUM alone sets the table's row estimate to its few live
    rows and leaves its columns unanalysed, and the claim's cached plan then reads every
    queued row of a growing backlog (measured: 0.1x the offered rate until autovacuum's
    ANALYZE). It skips the table at once, with a warning of SQLSTATE 55P03, while another
    VACUUM or autovacuum holds it, instead of waiting behind it. TRUNCATE false: giving the
    empty pages at the end back takes an ACCESS EXCLUSIVE lock that blocks every claim, and
    its attempts keep the VACUUM's own lock up to 5 s longer (issue 40): `TRUNCATE_JOBS`."""
    return text(f"VACUUM (ANALYZE, SKIP_LOCKED, TRUNCATE false) {SCHEMA}.jobs")


def analyze_jobs() -> TextClause:
    """ANALYZE the jobs table, skipped at once (a warning of SQLSTATE 55P03) while a VACUUM,
    an autovacuum or another ANALYZE holds it."""
    return text(f"ANALYZE (SKIP_LOCKED) {SCHEMA}.jobs")


def jobs_empty_tail(conn: Connection) -> tuple[int, int, int]:
    """(pages, empty pages at the end, bytes a page) of the jobs table: what a truncating
    VACUUM could give back, at most (rows not yet vacuumed may still sit there). Reads the
    table from its end by TID ranges, a window growing fourfold, so a full table costs one
    small scan."""
    size, block = conn.execute(
        text(f"SELECT pg_relation_size('{SCHEMA}.jobs'), current_setting('block_size')::bigint")
    ).one()
    pages, block = int(size) // int(block), int(block)
    window = 256
    while True:
        start = max(0, pages - window)
        last = conn.execute(
            text(
                f"SELECT (max(ctid)::text::point)[0]::bigint FROM {SCHEMA}.jobs "
                "WHERE ctid >= ('(' || CAST(:start AS bigint) || ',0)')::tid"
            ),
            {"start": start},
        ).scalar()
        if last is not None:
            return pages, pages - int(last) - 1, block
        if start == 0:
            return pages, pages, block
        window *= 4


BEHIND_DEAD_ROWS = 10_000
"""Dead rows (beyond a fifth of the live ones) past which `doctor` says vacuum is behind."""


def jobs_vacuum_report(conn: Connection) -> tuple[bool, str, dict[str, Any]]:
    """For `doctor`: whether vacuum is behind on the jobs table, a line saying how it
    stands (dead and live rows, the last vacuum of each kind, a worker's VACUUM running),
    and the figures."""
    row = conn.execute(jobs_vacuum_state()).mappings().first()
    if row is None:
        return False, "no statistics for the jobs table yet", {}
    live, dead = int(row["live"]), int(row["dead"])
    vacuumed, autovacuumed = _float(row["vacuum"]), _float(row["autovacuum"])
    line = (
        f"{dead} dead / {live} live rows; vacuumed {_ago(vacuumed)}, autovacuumed "
        f"{_ago(autovacuumed)}" + ("; a worker is vacuuming it now" if row["vacuuming"] else "")
    )
    details = {
        "live_tuples": live,
        "dead_tuples": dead,
        "last_vacuum_seconds_ago": vacuumed,
        "last_autovacuum_seconds_ago": autovacuumed,
        "worker_vacuuming": bool(row["vacuuming"]),
    }
    behind = dead > BEHIND_DEAD_ROWS + 0.2 * live
    return behind, line, details


def _float(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s ago"
