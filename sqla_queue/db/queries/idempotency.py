"""The HTTP API's idempotency keys (`sqla_queue.dashboard.api_auth.IdempotencyKeys`), in
`sqla_queue.api_idempotency`: each statement touches one key's row, or a bounded batch of
expired rows."""

from __future__ import annotations

from sqlalchemy import TextClause, text

EXPIRE_BATCH = 100
"""Expired keys deleted at most per key taken: the table's upkeep, a little at a time."""

DELETE_EXPIRED: TextClause = text(
    """
    DELETE FROM sqla_queue.api_idempotency a
    WHERE (a.caller, a.key) IN (
      SELECT e.caller, e.key FROM sqla_queue.api_idempotency e
      WHERE e.expires_at <= now() ORDER BY e.expires_at LIMIT :batch
      FOR UPDATE SKIP LOCKED)
       OR (a.caller = :caller AND a.key = :key AND a.expires_at <= now())
    """
)
"""Delete up to `:batch` expired keys (the oldest first, skipping those another process is
deleting) and `:caller`'s `:key` if it has expired."""

RESERVE: TextClause = text(
    """
    INSERT INTO sqla_queue.api_idempotency (caller, key, request, expires_at)
    VALUES (:caller, :key, :request, now() + make_interval(secs => :seconds))
    ON CONFLICT (caller, key) DO NOTHING
    RETURNING 1
    """
)
"""Reserve `:caller`'s `:key` for the request `:request` for `:seconds` (its answer's
time): a row back when it was free, none when another request holds or answered it."""

KEPT: TextClause = text(
    """
    SELECT status, body, request FROM sqla_queue.api_idempotency
    WHERE caller = :caller AND key = :key AND expires_at > now()
    """
)
"""The key's (status or NULL while it is answered, body, request digest), unless expired."""

KEEP: TextClause = text(
    """
    UPDATE sqla_queue.api_idempotency
    SET status = :status, body = :body, request = :request,
        expires_at = now() + make_interval(secs => :seconds)
    WHERE caller = :caller AND key = :key
    """
)
"""Keep the answer of `:caller`'s `:key` for `:seconds`."""

RELEASE: TextClause = text(
    """
    DELETE FROM sqla_queue.api_idempotency
    WHERE caller = :caller AND key = :key AND status IS NULL
    """
)
"""Forget a reservation whose request raised or failed on the server: a retry may act."""
