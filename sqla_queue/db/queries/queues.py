"""Queue administration: create, pause, retention, delete, stats, prune."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    ARRAY,
    Delete,
    Float,
    Insert,
    Integer,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    union,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import TextClause

from sqla_queue.db.models import HISTORY_TABLE, SCHEMA, JobStatus
from sqla_queue.db.queries.common import (
    FINISHED_STATUSES,
    archive,
    cancelled_held,
    history,
    jobs,
    queues,
    seconds_param,
    seconds_since,
    status_is,
)
from sqla_queue.job.states import CLAIMED, UNFINISHED

# -- administration --------------------------------------------------------------------------


def queue_settings() -> Select[Any]:
    """(name, paused, retention, route, concurrency, rate_limit, rate_window, result_ttl,
    fair, partition_limit, aging, sequence_on_failure) of every queue."""
    return select(
        queues.c.name,
        queues.c.paused,
        queues.c.retention,
        queues.c.route,
        queues.c.concurrency,
        queues.c.rate_limit,
        queues.c.rate_window,
        queues.c.result_ttl,
        queues.c.fair,
        queues.c.partition_limit,
        queues.c.aging,
        queues.c.sequence_on_failure,
    ).order_by(queues.c.name)


def create_queue() -> Insert:
    """Create a queue; parameters `name`, `retention`. Existing queues are left as they are."""
    return (
        pg_insert(queues)
        .values(name=bindparam("name"), retention=bindparam("retention"))
        .on_conflict_do_nothing(index_elements=[queues.c.name])
        .returning(queues.c.name)
    )


def insert_queue() -> Insert:
    """Insert a queue row from the columns given as parameters (the session's flush of an
    added `Queue`, written ahead of its jobs: `enqueue._write_added_queues`)."""
    return insert(queues)


def set_queue(**values: Any) -> Update:
    """`UPDATE queues SET <values> WHERE name = :queue_name RETURNING name`: no row, no queue."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue_name"))
        .values(**values)
        .returning(queues.c.name)
    )


def set_queue_paused(paused: bool) -> Update:
    """Pause or resume the queue `:name`; returns its name if it exists."""
    return set_queue(paused=paused)


def set_queue_retention() -> Update:
    """Set the retention of the queue `:queue_name` to `:new_retention`."""
    return set_queue(retention=bindparam("new_retention"))


def set_queue_route() -> Update:
    """Set (or clear, with NULL) the route of the queue `:queue_name` to `:new_route`."""
    return set_queue(route=bindparam("new_route"))


def set_queue_concurrency() -> Update:
    """Set (or clear, with NULL) the concurrency limit of `:queue_name` to `:concurrency`."""
    return set_queue(concurrency=bindparam("concurrency", type_=Integer))


def set_queue_rate() -> Update:
    """Set (or clear, with NULLs) the rate limit of `:queue_name`: `:rate_limit` starts per
    `:rate_window` seconds."""
    return set_queue(
        rate_limit=bindparam("rate_limit", type_=Integer),
        rate_window=bindparam("rate_window", type_=Float),
    )


def set_queue_result_ttl() -> Update:
    """Set how long (`:result_ttl` seconds) kept results of `:queue_name` stay readable."""
    return set_queue(result_ttl=bindparam("result_ttl", type_=Float))


def count_unfinished_in_queue() -> Select[Any]:
    """How many jobs of `:queue_name` are unfinished (queued, running or waiting)."""
    return select(func.count()).where(
        jobs.c.queue == bindparam("queue_name"),
        or_(*(status_is(JobStatus(status)) for status in UNFINISHED)),
    )


def lock_queue() -> Select[Any]:
    """Lock the queue `:queue_name`'s row; under the foreign key this holds off enqueuers."""
    return select(queues.c.name).where(queues.c.name == bindparam("queue_name")).with_for_update()


def delete_jobs_of_queue(finished_only: bool) -> Delete:
    """Delete the jobs of the queue `:queue_name`: only finished ones, or all (`--force`)."""
    statement = delete(jobs).where(jobs.c.queue == bindparam("queue_name"))
    if finished_only:
        statement = statement.where(or_(*(status_is(JobStatus(s)) for s in FINISHED_STATUSES)))
    return statement


def delete_queue() -> ReturningDelete[Any]:
    """Delete the queue `:queue_name`; returns its name if it existed."""
    return delete(queues).where(queues.c.name == bindparam("queue_name")).returning(queues.c.name)


def queue_stats() -> Select[Any]:
    """Per queue and status: count and the oldest due queued job's age in seconds. The
    `running` rows whose handler has not started count as `claimed` (`states.CLAIMED`).

    Queues with no jobs appear once with a NULL status and a count of 0. The jobs of the
    history (succeeded jobs of `keep` and `archive` queues) count under their status.
    """

    def of(table: Any) -> Select[Any]:
        return select(table.c.id, table.c.queue, table.c.status, table.c.run_at, table.c.started_at)

    every = union_all(of(jobs), of(history)).subquery("j")
    oldest_due = func.min(every.c.run_at).filter(
        and_(status_is(JobStatus.queued, every), every.c.run_at <= func.now())
    )
    due_age = seconds_since(oldest_due)
    status = case(
        (
            and_(status_is(JobStatus.running, every), every.c.started_at.is_(None)),
            literal(CLAIMED),
        ),
        else_=every.c.status,
    ).label("status")
    names = union(
        select(queues.c.name),
        select(jobs.c.queue.label("name")).distinct(),
        select(history.c.queue.label("name")).distinct(),
    ).subquery()
    return (
        select(
            names.c.name,
            queues.c.paused,
            status,
            func.count(every.c.id),
            due_age,
        )
        .select_from(names)
        .outerjoin(queues, queues.c.name == names.c.name)
        .outerjoin(every, every.c.queue == names.c.name)
        .group_by(names.c.name, queues.c.paused, status)
        .order_by(names.c.name, status)
    )


def prune_jobs() -> Delete:
    """Delete finished jobs (`:statuses`) that finished more than `:older_than` seconds ago
    (not a cancelled one whose handler still runs: it holds its queue's slot)."""
    return delete(jobs).where(
        jobs.c.status == any_(bindparam("statuses", type_=ARRAY(Text))),
        jobs.c.finished_at < func.now() - seconds_param("older_than"),
        ~cancelled_held(),
    )


def prune_archive() -> Delete:
    """Delete jobs of the unpartitioned archive (releases before sqlaq_0030) older than
    `:older_than` seconds."""
    return delete(archive).where(archive.c.finished_at < func.now() - seconds_param("older_than"))


def prune_history() -> Delete:
    """Delete the history's jobs (`:statuses`) older than `:older_than` seconds: the rows of
    the partitions `history_partitions_before` did not name (the partition the cut-off
    falls in, and the DEFAULT one); partition pruning keeps it to those."""
    return delete(history).where(
        history.c.status == any_(bindparam("statuses", type_=ARRAY(Text))),
        history.c.finished_at < func.now() - seconds_param("older_than"),
    )


HISTORY_PARTITION_NAME = r"^jobs_history_p[0-9]{8}$"
"""The name the keeper gives a history partition (`keep_history`, sqlaq_0030_history)."""


def history_partitions() -> TextClause:
    """(name, starts, ends, rows estimate, total bytes) of each period partition of the
    history, the oldest first (not the DEFAULT partition)."""
    return text(
        f"""
        SELECT c.relname AS name,
               substring(b.bound FROM 'FROM \\(''([^'']+)''\\)')::timestamptz AS starts,
               substring(b.bound FROM 'TO \\(''([^'']+)''\\)')::timestamptz AS ends,
               greatest(c.reltuples, 0)::bigint AS estimate,
               pg_total_relation_size(c.oid) AS bytes
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
             LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) b
        WHERE i.inhparent = '{SCHEMA}.{HISTORY_TABLE}'::regclass
          AND c.relname ~ '{HISTORY_PARTITION_NAME}'
        ORDER BY starts"""
    )


def history_partition_rows(name: str) -> TextClause:
    """How many jobs of `:statuses` partition `name` (a name `history_partitions` gave)
    holds, and how many it holds in all (`kept`, `other`)."""
    return text(
        f"SELECT count(*) FILTER (WHERE status = ANY(:statuses)) AS kept, "
        f"count(*) FILTER (WHERE status <> ALL(:statuses)) AS other "
        f"FROM {SCHEMA}.{_partition(name)}"
    ).bindparams(bindparam("statuses", type_=ARRAY(Text)))


def drop_history_journal(name: str) -> TextClause:
    """Delete the steps, progress and log lines of the jobs of partition `name`."""
    part = f"{SCHEMA}.{_partition(name)}"
    return text(
        f"DELETE FROM {SCHEMA}.job_steps WHERE job_id IN (SELECT id FROM {part}); "
        f"DELETE FROM {SCHEMA}.job_progress WHERE job_id IN (SELECT id FROM {part}); "
        f"DELETE FROM {SCHEMA}.job_logs WHERE job_id IN (SELECT id FROM {part})"
    )


def drop_history_partition(name: str) -> TextClause:
    """Drop partition `name` of the history: its jobs go at once, whatever their number."""
    return text(f"DROP TABLE {SCHEMA}.{_partition(name)}")


def _partition(name: str) -> str:
    if re.fullmatch(HISTORY_PARTITION_NAME, name) is None:
        raise ValueError(f"not a history partition's name: {name!r}")
    return name


def keep_history() -> TextClause:
    """The keeper's history upkeep (`sqla_queue.keep_history`, sqlaq_0030_history): the
    partitions of `:period_days` days for now and `:ahead` periods after, strays out of
    the DEFAULT partition, an ANALYZE of each partition whose period has passed, and at
    most `:batch` rows an earlier release left moved in. Returns the rows moved in."""
    return text(f"SELECT {SCHEMA}.keep_history(:period_days, :ahead, :batch)").bindparams(
        bindparam("period_days", type_=Integer),
        bindparam("ahead", type_=Integer),
        bindparam("batch", type_=Integer),
    )


def history_default_rows() -> TextClause:
    """(rows, oldest finished_at) of the history's DEFAULT partition: jobs that finished in
    a period no partition was made for (no keeper ran)."""
    return text(
        f"SELECT count(*) AS rows, min(finished_at) AS oldest FROM {SCHEMA}.{HISTORY_TABLE}_default"
    )


def prune_cut_off() -> Select[Any]:
    """The time `:older_than` seconds before now: what prune removes jobs finished before."""
    return select(func.now() - seconds_param("older_than"))


def history_made_until() -> TextClause:
    """The end of the run of history partitions that covers now (NULL: none covers now)."""
    return text(
        f"""
        WITH RECURSIVE parts AS (
            SELECT substring(b FROM 'FROM \\(''([^'']+)''\\)')::timestamptz AS starts,
                   substring(b FROM 'TO \\(''([^'']+)''\\)')::timestamptz AS ends
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
                 LATERAL pg_get_expr(c.relpartbound, c.oid) b
            WHERE i.inhparent = '{SCHEMA}.{HISTORY_TABLE}'::regclass
              AND c.relname ~ '{HISTORY_PARTITION_NAME}'),
        run AS (
            SELECT ends FROM parts WHERE starts <= now() AND ends > now()
            UNION
            SELECT p.ends FROM parts p JOIN run r ON p.starts = r.ends)
        SELECT max(ends) FROM run"""
    )
