"""Checks of a job's fields before they reach the database: names, JSON args and meta, tags.

`validate_job` and `validate_tags_and_meta` are what `Job(...)` and every enqueue path call;
`limits` holds the bounds they enforce (lowered at start-up, never above the schema's).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqla_queue.errors import ConfigurationError, InvalidJobError
from sqla_queue.job.bounds import PRIORITY_MAX as PRIORITY_MAX
from sqla_queue.job.bounds import invalid_job
from sqla_queue.job.options import check_fields

SCHEMA_MAX_ARGS_BYTES = 1_000_000
"""The largest `args` (as jsonb text) the schema admits: the trigger ck_jobs_args_size
(migration sqlaq_0007; a CHECK constraint before it) refuses larger ones."""
SCHEMA_MAX_NAME_LENGTH = 200
"""The longest task or queue name the schema's CHECK constraints admit."""
MAX_INT_DIGITS = 4300
"""Python's default limit on int <-> str conversion: a worker could not decode a longer int."""


@dataclass
class Limits:
    """Bounds that enqueue enforces; change them on `sqla_queue.limits` at start-up.

    They may be lowered freely; the database's CHECK constraints hold the size and name
    limits at their defaults whatever is set here, so they cannot be raised above them.
    """

    max_args_bytes: int = SCHEMA_MAX_ARGS_BYTES
    """The largest `args`, as JSON text, that a job may carry."""
    max_name_length: int = SCHEMA_MAX_NAME_LENGTH
    """The longest task or queue name."""
    max_args_depth: int = 100
    """The deepest nesting of lists and dicts in `args` (a worker decodes them recursively)."""

    def __setattr__(self, name: str, value: Any) -> None:
        ceiling = _LIMIT_CEILINGS.get(name)
        if ceiling is not None and (not isinstance(value, int) or not 0 < value <= ceiling):
            raise ConfigurationError(
                detail=f"limits.{name} must be an int from 1 to {ceiling} (the schema's "
                f"CHECK constraint holds it there), got {value!r}"
            )
        super().__setattr__(name, value)


_LIMIT_CEILINGS = {
    "max_args_bytes": SCHEMA_MAX_ARGS_BYTES,
    "max_name_length": SCHEMA_MAX_NAME_LENGTH,
    "max_args_depth": 500,
}

limits = Limits()

_HUGE_INT = 10**MAX_INT_DIGITS
# Fast pre-checks on the JSON text; only a hit costs a walk of the args.
_LONG_DIGIT_RUN = re.compile(rf"\d{{{MAX_INT_DIGITS + 1}}}")
_EXPONENT = re.compile(r"\de[-+]\d")


# A \u0000 escape in json.dumps output (not an escaped backslash followed by "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A surrogate escape that is not half of a pair (a str from surrogateescape decoding).
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f])"
)


def _reject_non_json(value: object) -> object:
    raise TypeError(f"{type(value).__name__} value {value!r:.80}")


_ENCODER = json.JSONEncoder(allow_nan=False, default=_reject_non_json)
"""Built once: `json.dumps` with options builds an encoder per call (profiled: bulk enqueue)."""


def validate_name(label: str, value: object, task: str) -> None:
    """A task or queue name: a non-empty printable string within `limits.max_name_length`."""
    if not isinstance(value, str) or not value:
        raise InvalidJobError(task=task, detail=f"{label} must be a non-empty string")
    if len(value) > limits.max_name_length:
        raise InvalidJobError(
            task=task[:60],
            detail=f"{label} name is {len(value)} characters; the limit is "
            f"{limits.max_name_length} (sqla_queue.limits.max_name_length)",
        )
    if not value.isprintable():
        raise InvalidJobError(task=task[:60], detail=f"{label} name has control characters")


def _args_problem(args: object, max_depth: int, label: str = "args") -> str | None:
    """Why decoding `args` would fail in a worker (too deep, too long an int), or None."""
    stack: list[tuple[object, int]] = [(args, 0)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children: Iterable[object] = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            if isinstance(value, int) and abs(value) >= _HUGE_INT:
                return (
                    f"{label} hold an integer of more than {MAX_INT_DIGITS} digits, which a "
                    "worker cannot decode (Python's int max str digits); pass it as a string"
                )
            continue
        if level >= max_depth:
            return (
                f"{label} are nested more than {max_depth} levels deep (sqla_queue.limits."
                "max_args_depth); a worker decodes them recursively: flatten them"
            )
        stack.extend((child, level + 1) for child in children)
    return None


def encode_json_object(
    label: str, value: object, name: str, max_bytes: int, limit_name: str, what: str
) -> str:
    """`value` (a dict with str keys) as JSON text PostgreSQL's jsonb can store and a worker
    can decode; `InvalidJobError` or `TypeError` naming `label`, the task and the fix."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidJobError(
            task=name,
            detail=f"{label} must be a dict of {what} with str keys, got {type(value).__name__}",
        )
    try:
        encoded = _ENCODER.encode(value)
    except (RecursionError, ValueError) as exc:
        problem = _args_problem(value, limits.max_args_depth, label)
        if problem is None and isinstance(exc, RecursionError):
            problem = f"{label} are nested too deeply (or refer to themselves) to encode as JSON"
        if problem is None:
            raise TypeError(
                f"{label} of task {name!r} are not JSON-serialisable: {exc}. "
                "Pass only dicts, lists, str, int, float, bool and None (e.g. ids, not objects)."
            ) from None
        raise InvalidJobError(task=name, detail=problem) from None
    except TypeError as exc:
        raise TypeError(
            f"{label} of task {name!r} are not JSON-serialisable: {exc}. "
            "Pass only dicts, lists, str, int, float, bool and None (e.g. ids, not objects)."
        ) from None
    # Each scan of the text below runs only when a cheap test says it may find something:
    # the text is ASCII (ensure_ascii), so a NUL or a surrogate can only be a \u escape.
    size = len(encoded)
    if (size > MAX_INT_DIGITS and _LONG_DIGIT_RUN.search(encoded)) or encoded.count(
        "["
    ) + encoded.count("{") > limits.max_args_depth:
        problem = _args_problem(value, limits.max_args_depth, label)
        if problem is not None:
            raise InvalidJobError(task=name, detail=problem)
    if ("e+" in encoded or "e-" in encoded) and _EXPONENT.search(encoded):
        size += _jsonb_growth(value)  # a float in exponent form, perhaps: see _jsonb_growth
    if size > max_bytes:
        stored = f" as jsonb ({len(encoded)} as JSON text)" if size != len(encoded) else " as JSON"
        raise InvalidJobError(
            task=name,
            detail=f"{label} are {size} bytes{stored}; the limit is {max_bytes} "
            f"({limit_name}). Store large payloads elsewhere and pass a key.",
        )
    if "\\u" not in encoded:
        return encoded
    if _NUL_ESCAPE.search(encoded):
        raise InvalidJobError(
            task=name,
            detail=f"{label} contain a NUL character (\\u0000), which PostgreSQL's jsonb cannot "
            "store; encode binary data, e.g. as base64",
        )
    if _LONE_SURROGATE.search(encoded):
        raise InvalidJobError(
            task=name,
            detail=f"{label} contain a lone surrogate (a str that is not valid Unicode, e.g. "
            "decoded with surrogateescape), which PostgreSQL's jsonb cannot store",
        )
    return encoded


def _jsonb_growth(args: object) -> int:
    """How much longer `args` are as jsonb text than as JSON text: floats in exponent form.

    jsonb stores numbers as `numeric`, which writes them out in full: `1e+300` (6 characters)
    is 301 digits as jsonb text, which the schema's size CHECK measures. Nothing else grows.
    """
    growth = 0
    stack = [args]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, float) and "e" in (short := repr(value)):
            growth += len(format(Decimal(short), "f")) - len(short)
    return growth


def validate_job(
    task: object,
    args: object,
    queue: object,
    priority: object,
    run_at: object,
    columns: Mapping[str, object],
    names_checked: bool = False,
) -> str:
    """Check a job's fields before it reaches the database; returns `args` as JSON text.

    Raises `InvalidJobError` (a ValueError) for a bad field and `TypeError` for args that
    are not JSON-serialisable, each naming the task and the fix. `columns`: the values of
    the column options (`sqla_queue.job.options.COLUMN_OPTIONS`, e.g. max_attempts) by name.
    `names_checked`: the task and queue names passed this check already (bulk enqueue checks
    each pair once).
    """
    name = task if isinstance(task, str) else repr(task)
    if not names_checked:
        validate_name("task", task, name)
        validate_name("queue", queue, name)
    encoded = encode_json_object(
        "args",
        args,
        name,
        limits.max_args_bytes,
        "sqla_queue.limits.max_args_bytes",
        "keyword arguments",
    )
    check_fields(priority, run_at, columns, invalid_job(name))
    return encoded


MAX_META_BYTES = 100_000
"""The largest `meta` (as JSON text) a job may carry: context for tracing and tools, not data."""
MAX_TAGS = 50
"""The most tags one job may carry."""


def validate_tags_and_meta(task: object, tags: object, meta: object) -> tuple[list[str], str]:
    """A job's `tags` (a list of names; None is none) and `meta` (a dict; None is empty):
    returns the tags without repeats, in order, and meta as JSON text."""
    if (
        not tags
        and not meta
        and (tags is None or type(tags) is list)
        and (meta is None or type(meta) is dict)
    ):
        return [], "{}"  # the common case, nothing to check: skip the encoder (bulk enqueue)
    name = task if isinstance(task, str) else repr(task)
    if tags is None:
        tags = []
    if isinstance(tags, str) or not isinstance(tags, (list, tuple, set, frozenset)):
        raise InvalidJobError(
            task=name, detail=f"tags must be a list of str (tags=['billing']), got {tags!r:.60}"
        )
    for tag in tags:
        validate_name("tag", tag, name)
    unique = list(dict.fromkeys(tags))
    if len(unique) > MAX_TAGS:
        raise InvalidJobError(
            task=name, detail=f"a job has at most {MAX_TAGS} tags, got {len(unique)}"
        )
    encoded = encode_json_object(
        "meta",
        {} if meta is None else meta,
        name,
        MAX_META_BYTES,
        "sqla_queue.job.validation.MAX_META_BYTES",
        "JSON values",
    )
    return unique, encoded
