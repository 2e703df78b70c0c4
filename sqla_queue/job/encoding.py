"""A handler's return value as the JSON text a job keeps, and the placeholder kept meanwhile."""

from __future__ import annotations

import json
from typing import Any

PENDING_RESULT = '{"sqla_queue_result": "pending"}'
"""The `result` a job's own `ctx.session()` commit keeps when its task keeps results: the
handler has not returned yet. The worker replaces it with the return value once it does;
`wait_for` keeps waiting while it is there."""

_PENDING = json.loads(PENDING_RESULT)


def encode_result(task: str, value: Any) -> tuple[str | None, str | None]:
    """A handler's return value as the JSON text `result` keeps: (text, None), or (None, why
    it cannot be kept: not JSON-serialisable, or holding what jsonb refuses: NaN or an
    infinity, a NUL character, a lone surrogate). What only the server can tell (a value
    nested past its stack depth) is refused by the finishing statement, and the worker
    then fails the job with PostgreSQL's reason."""
    cannot = f"the result of task {task!r} cannot be kept:"
    try:
        encoded = json.dumps(value, allow_nan=False)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            return None, (
                f"{cannot} it holds NaN or infinity, which JSON (and PostgreSQL's jsonb) "
                "cannot hold; return None or a string for such values"
            )
        return None, _not_serialisable(cannot, exc)
    except (TypeError, RecursionError) as exc:
        return None, _not_serialisable(cannot, exc)
    if isinstance(value, dict) and value == _PENDING:
        return None, f"{cannot} it is the value sqla-queue keeps while a result is pending"
    if "\\u0000" in encoded:
        return None, (
            f"{cannot} it holds a NUL character (\\u0000), which PostgreSQL's jsonb refuses"
        )
    # A lone surrogate ("caf\\udce9", an os.fsdecode of a Latin-1 file name) is escaped as
    # \\udXXX, which jsonb refuses; only text holding such an escape is looked at again.
    if "\\ud" in encoded:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            return None, (
                f"{cannot} it holds a lone surrogate ({bad!r}, text that is not valid "
                "Unicode, e.g. an os.fsdecode of a non-UTF-8 file name), which PostgreSQL "
                "cannot store; return bytes decoded as UTF-8 (errors='replace') instead"
            )
    return encoded, None


def _not_serialisable(cannot: str, exc: BaseException) -> str:
    return (
        f"{cannot} it is not JSON-serialisable ({exc}); "
        "return only dicts, lists, str, int, float, bool and None (e.g. ids, not objects)"
    )
