"""What a statement's plans did, counted rather than timed: every plan a block of work ran,
the trigger functions' statements too (auto_explain, sent back to the session as notices),
and the rows their nodes produced and filtered. A loaded machine changes how long a plan
takes, never these counts, so a test may bound them where it may not bound a time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection

AUTO_EXPLAIN = (
    "log_min_duration = 0",
    "log_analyze = on",
    "log_timing = off",
    "log_nested_statements = on",
    "log_format = json",
    "log_level = notice",
)


@contextmanager
def explained(conn: Connection) -> Iterator[list[dict[str, Any]]]:
    """The plans (EXPLAIN ANALYZE's `Plan`, JSON) of every statement run on `conn` within
    the block, nested ones included. Call it inside a transaction: the settings are its own
    (SET LOCAL), so the pooled connection goes back as it was (the library stays loaded)."""
    plans: list[dict[str, Any]] = []

    def noticed(diag: Any) -> None:
        message = diag.message_primary or ""
        if "plan:" in message:
            plans.append(json.loads(message.split("plan:", 1)[1])["Plan"])

    raw = conn.connection.driver_connection
    assert raw is not None
    conn.exec_driver_sql("LOAD 'auto_explain'")
    for setting in AUTO_EXPLAIN:
        conn.exec_driver_sql(f"SET LOCAL auto_explain.{setting}")
    raw.add_notice_handler(noticed)
    try:
        yield plans
    finally:
        raw.remove_notice_handler(noticed)
    conn.exec_driver_sql("SET LOCAL auto_explain.log_min_duration = -1")  # the rest: unexplained


def rows_scanned(node: dict[str, Any]) -> int:
    """Rows a plan's nodes produced and filtered out, over all their loops (EXPLAIN ANALYZE
    reports both per loop): the work a plan did, whatever the machine's load."""
    loops = int(node.get("Actual Loops", 1))
    own = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    own += node.get("Rows Removed by Index Recheck", 0)
    return int(own * loops) + sum(rows_scanned(child) for child in node.get("Plans", []))
