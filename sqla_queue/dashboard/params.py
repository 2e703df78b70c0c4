"""The dashboard's checks of what a request carries: job ids, filters, queue names.

Each answers a value or raises `BadParameter` with one line for a 400 (or, for a job id in
the path, a 404: no job can have it). Nothing unchecked reaches PostgreSQL, whose bigint
and text would refuse it with a database error.
"""

from __future__ import annotations

from sqla_queue.job.validation import INT8_MAX as MAX_JOB_ID  # jobs.id is a bigint

MAX_ID_DIGITS = len(str(MAX_JOB_ID))


class BadParameter(ValueError):
    """A request parameter the dashboard cannot use; its message says which and why."""


def job_id(value: object, name: str = "job_id") -> int:
    """A job id: ASCII digits, 1 to 2**63 - 1 (not `+1`, ` 1`, `1_0` or other digits that
    `int()` would take)."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit():
        raise BadParameter(f"{name} must be a job id (a positive whole number), got {value!r:.80}")
    if len(value) > MAX_ID_DIGITS or not 0 < int(value) <= MAX_JOB_ID:
        raise BadParameter(f"{name} must be a job id from 1 to {MAX_JOB_ID}, got {value:.80}")
    return int(value)


def text_filter(value: str | None, name: str) -> str | None:
    """A filter's text as given (empty: no filter); refuses what PostgreSQL's text cannot
    hold (NUL, a lone surrogate)."""
    if not value:
        return None
    if "\x00" in value:
        raise BadParameter(f"{name} must not contain a NUL character")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise BadParameter(f"{name} is not valid Unicode text (a lone surrogate)") from None
    return value
