"""Every check of what enters sqla-queue, in one place: the bounds of numbers and durations,
names, durations and rates as text, the options of a job, its JSON args and meta, and the
`limits` enqueue enforces. The CLI's parameter types (`sqla_queue.cli.types`) and the Python
API share them, so that a value PostgreSQL cannot hold is refused where it enters, in one
line naming the limit, never as a database error:

    durations   0 to 100 years (`MAX_DURATION`): now() plus 100 years stays far inside
                PostgreSQL's timestamps (to 294276 AD) and Python's (to 9999), the longest
                wait Python's threads take (`threading.TIMEOUT_MAX`, about 292 years) is
                longer, and a stored setting multiplied into an interval cannot overflow
    counts      an int4 column's range (1 to 2147483647) unless an option allows less
    job ids     a positive int8 (1 to 2**63 - 1)
    names       task, queue and tag names: non-empty printable text of at most
                `limits.max_name_length` characters (200, the schema's CHECK constraints)

Each check raises the caller's error: `error(message)`, where `error` is an `ErrorFactory`:
`ConfigurationError` by default (queue settings, admin calls, filters, a worker's options),
`invalid_job(task)` for a job's fields (an `InvalidJobError` naming the task), a click
`BadParameter` on the command line. Every message has one shape, naming the value, what it
must be, and what it was:

    "max_attempts must be a whole number from 1 to 1000000, got 99999999999"
    "queue name must be a non-empty string, got ''"
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy.sql import ClauseElement

from sqla_queue.errors import ConfigurationError, InvalidJobError

# -- whose error a check raises -------------------------------------------------------------

ErrorFactory = Callable[[str], Exception]
"""Makes the error a check raises from its message (e.g. an `InvalidJobError` naming a task)."""


def configuration_error(detail: str) -> Exception:
    """The error factory of settings, admin calls and filters: a `ConfigurationError`."""
    return ConfigurationError(detail=detail)


def invalid_job(task: object) -> ErrorFactory:
    """The error factory of the checks of a job's fields: an `InvalidJobError` naming `task`."""
    return lambda detail: InvalidJobError(task=task, detail=detail)


# -- bounds of numbers and durations --------------------------------------------------------

INT4_MAX = 2**31 - 1
"""The largest value of PostgreSQL's `integer` (int4)."""
INT8_MAX = 2**63 - 1
"""The largest value of PostgreSQL's `bigint` (int8), and so of a job id."""
MAX_DURATION = 100 * 365.25 * 86400
"""The longest duration accepted anywhere, in seconds: 100 years (see the module's text)."""
MAX_ATTEMPTS = 1_000_000
"""The most attempts a job may be given: room below int4 for the attempts a reaper refunds."""
PRIORITY_MAX = 32767
"""The largest priority (a smallint column); 0 runs first."""
MAX_WORKER_CONCURRENCY = 10_000
"""The most handlers one worker runs at once (each is a thread or a task)."""
MAX_BATCH = 10_000
"""The most jobs a worker claims, or the relay moves, in one statement."""
MAX_PROCESSES = 1000
"""The most worker processes `sqla-queue worker --processes` supervises."""
MIN_RATE_WINDOW = 0.001
"""The shortest rate window, in seconds: a shorter one limits nothing."""


def count_range(low: int, high: int) -> str:
    """The accepted range of a count, as messages name it: 'a whole number from 1 to 10'."""
    return f"a whole number from {low} to {high}"


def duration_range(low: float, high: float) -> str:
    """The accepted range of a duration in seconds, as messages name it: 'a number of
    seconds from 0 to 3155760000 s (100 years)' (the Python API takes seconds)."""
    text = f"{high:g} s" if high < 1e6 else f"{high:.0f} s"
    if high == MAX_DURATION:
        text += " (100 years)"
    return f"a number of seconds from {low:g} to {text}"


def check_count(
    name: str,
    value: object,
    low: int = 1,
    high: int = INT4_MAX,
    error: ErrorFactory = configuration_error,
) -> int:
    """`value` if it is an int (not a bool) from `low` to `high`; else `error(message)`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{name} must be {count_range(low, high)}, got {value!r}")
    return value


def check_job_id(name: str, value: object, error: ErrorFactory = configuration_error) -> int:
    """`value` if it can be a job id (a positive int8); else `error(message)`."""
    return check_count(name, value, 1, INT8_MAX, error)


def check_duration(
    name: str,
    value: object,
    low: float = 0.0,
    high: float = MAX_DURATION,
    error: ErrorFactory = configuration_error,
) -> float:
    """`value` (seconds, or a timedelta) as seconds if it is finite and from `low` to
    `high`; else `error(message)`."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not low <= seconds <= high
    ):
        raise error(f"{name} must be {duration_range(low, high)}, got {value!r}")
    return float(seconds)


def check_rate(
    name: str, count: object, window: object, error: ErrorFactory = configuration_error
) -> tuple[int, float]:
    """(count, window seconds) of a rate limit, each within its bounds; else `error`."""
    return (
        check_count(f"{name} count", count, 1, INT4_MAX, error),
        check_duration(f"{name} window", window, MIN_RATE_WINDOW, MAX_DURATION, error),
    )


# -- durations and rates as text --------------------------------------------------------------
#
#     90      90 seconds          15m   15 minutes         7d   7 days
#     90s     90 seconds          12h   12 hours           2w   2 weeks
#     0.5     half a second
#
# A rate is a count per duration (`100/s`, `10/min`, `500/h`, `20/30s`).

UNITS: dict[str, float] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""Seconds per unit letter."""

ACCEPTED = "seconds, or a number with a unit s, m, h, d or w (e.g. 90, 90s, 15m, 12h, 7d)"
"""The accepted forms of a duration, as error messages and help texts name them."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_duration(value: str | float) -> float:
    """'90', '90s', '15m', '12h', '7d', '2w' (or a number) -> seconds.

    Raises `ValueError` naming the accepted forms for anything else (negative, `inf`, `1y`).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration; expected {ACCEPTED}")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration; expected {ACCEPTED}")
    number, unit = match.groups()
    return float(number) * UNITS.get(unit.lower(), 1)


def describe_duration(seconds: float) -> str:
    """300.0 -> '5m', 30.0 -> '30s', 5400.0 -> '90m', 1.5 -> '1.5s': the form `parse_duration`
    reads back, in the largest unit that divides it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def describe_age(seconds: float) -> str:
    """How long something has lasted, for a person: '45 s', '21 min', '3.5 h', '9 d'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"


RATE_ACCEPTED = (
    "COUNT/PER, a whole count per a duration or a unit: 100/s, 10/min, 500/h, 20/30s, 1000/d"
)
"""The accepted forms of a rate, as error messages and help texts name them."""

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\S+)\s*$")
_RATE_WORDS = {"sec": "s", "second": "s", "min": "m", "minute": "m", "hour": "h", "day": "d"}


def parse_rate(value: str) -> tuple[int, float]:
    """'100/s', '10/min', '500/h', '20/30s' -> (count, window in seconds).

    Raises `ValueError` naming the accepted forms for anything else (a zero count or window,
    a fraction of a job, an unknown unit).
    """
    match = _RATE.match(str(value))
    if match:
        count, per = int(match.group(1)), match.group(2).lower()
        per = _RATE_WORDS.get(per.rstrip("s") if len(per) > 3 else per, per)
        try:
            window = parse_duration(per if per[0].isdigit() else f"1{per}")
        except ValueError:
            window = 0.0
        if count > 0 and window > 0:
            return count, window
    raise ValueError(f"{value!r} is not a rate; expected {RATE_ACCEPTED}")


def describe_rate(count: int, window: float) -> str:
    """(100, 1.0) -> '100/s', (10, 60.0) -> '10/min', (20, 30.0) -> '20/30s': the form
    `parse_rate` reads back."""
    for unit, seconds in (("s", 1), ("min", 60), ("h", 3600), ("d", 86400)):
        if window == seconds:
            return f"{count}/{unit}"
    return f"{count}/{window:g}s"


# -- names, and the limits enqueue enforces ------------------------------------------------------

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
"""The process's limits (`sqla_queue.limits`): one for every registry and enqueue path."""


def check_text(
    label: str,
    value: object,
    max_length: int,
    error: ErrorFactory = configuration_error,
    setting: str = "",
    example: str = "",
) -> str:
    """`value` if it is a non-empty str of printable characters, at most `max_length` long;
    else `error(message)`. `setting` names where `max_length` is set, `example` a value to
    pass instead (each added to the message)."""
    hint = f"; e.g. {example}" if example else ""
    if not isinstance(value, str) or not value:
        raise error(f"{label} must be a non-empty string, got {value!r:.60}{hint}")
    if len(value) > max_length:
        where = f" ({setting})" if setting else ""
        raise error(
            f"{label} must be at most {max_length} characters{where}, got {len(value)} "
            f"characters ({value[:40]!r}...){hint}"
        )
    if not value.isprintable():
        raise error(
            f"{label} must be printable text (no tab, newline or other control characters), "
            f"got {value!r:.80}"
        )
    return value


def validate_name(label: str, value: object, error: ErrorFactory = configuration_error) -> str:
    """A task, queue or tag name (`label`: "queue name", ...): a non-empty printable string
    within `limits.max_name_length`; else `error(message)`, a `ConfigurationError` unless
    the caller passes its own (`invalid_job(task)` for a job's names)."""
    return check_text(
        label, value, limits.max_name_length, error, "sqla_queue.limits.max_name_length"
    )


# -- a job's options ------------------------------------------------------------------------

ON_FAILURE = ("cancel", "run")
"""What a job does when one it depends on ends failed or cancelled (`models.OnFailure`)."""
MAX_WORKFLOW_ID_LENGTH = 200
"""The longest workflow id."""
MAX_KEY_LENGTH = 200
"""The longest partition or sequence key."""
MAX_ABOUT_LENGTH = 500
"""The longest `about` text (a table name and a primary key)."""


def check_max_attempts(value: object, error: ErrorFactory = configuration_error) -> None:
    """Refuse a `max_attempts` that is not a whole number from 1 to `MAX_ATTEMPTS`."""
    check_count("max_attempts", value, 1, MAX_ATTEMPTS, error)


def check_workflow_id(value: object, error: ErrorFactory = configuration_error) -> None:
    """Refuse a workflow id that is not printable text of 1 to 200 characters."""
    check_text("workflow_id", value, MAX_WORKFLOW_ID_LENGTH, error)


def check_partition(value: object, error: ErrorFactory = configuration_error) -> None:
    """Refuse a partition key (a job's, or one `queues weight` names) that is not printable
    text of 1 to 200 characters."""
    check_text("partition", value, MAX_KEY_LENGTH, error, example='partition=f"customer-{id}"')


def check_sequence(value: object, error: ErrorFactory = configuration_error) -> None:
    """Refuse a sequence key that is not printable text of 1 to 200 characters."""
    check_text("sequence", value, MAX_KEY_LENGTH, error, example='sequence=f"order-{id}"')


def check_expires_at(value: object, error: ErrorFactory = configuration_error) -> None:
    """Refuse a start deadline that is not an aware datetime."""
    if not isinstance(value, dt.datetime):
        raise error(f"expires_at must be a datetime, got {value!r:.80}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(
            "expires_at has no time zone; pass an aware datetime such as "
            "datetime.now(timezone.utc) + timedelta(hours=1), or use expires_in="
        )


def check_about(value: object, error: ErrorFactory = configuration_error) -> None:
    """Refuse an `about` text that is not `<table>:<key>` of printable text, at most
    `MAX_ABOUT_LENGTH` characters."""
    if (
        not isinstance(value, str)
        or not 3 <= len(value) <= MAX_ABOUT_LENGTH
        or ":" not in value[1:-1]
        or not value.isprintable()
    ):
        raise error(
            f"about must be a mapped instance or '<table>:<key>' text (e.g. 'orders:42', at "
            f"most {MAX_ABOUT_LENGTH} printable characters), got {value!r:.80}"
        )


def check_on_failure(value: object, error: ErrorFactory = configuration_error) -> None:
    """Refuse an `on_failure` other than "cancel" or "run"."""
    if value is not None and value not in ON_FAILURE:
        raise error(f"on_failure must be 'cancel' or 'run', got {value!r:.80}")


COLUMN_OPTIONS: dict[str, Callable[[object, ErrorFactory], None]] = {
    "max_attempts": check_max_attempts,
    "workflow_id": check_workflow_id,
    "about": check_about,
    "partition": check_partition,
    "sequence": check_sequence,
    "expires_at": check_expires_at,
}
"""The options of a job (`sqla_queue.job.options.JobOptions`) written as they are into the
jobs column of the same name (NULL when not given), each with the check of a given value
(`error(message)` on a bad one). The insert statements, their `job_<name>` parameters, the
COPY columns, the unique rows' staging table and the ORM's `Job` are built from this table,
in this order."""


def check_fields(
    priority: object, run_at: object, columns: Mapping[str, object], error: ErrorFactory
) -> None:
    """Check the options that are numbers or times, as every path does after the insert
    hooks; `error(message)` names the problem and the fix. `run_at` may be a SQL expression
    (a delayed `Job`'s `func.now() + interval`), which the database computes.

    The names, args, tags and meta are checked with the JSON they are written as
    (`validate_job`, `validate_tags_and_meta`). `columns`: the values of `COLUMN_OPTIONS`
    (a missing or None value is not given, so not checked).
    """
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise error(f"priority must be an int, got {priority!r}")
    if not 0 <= priority <= PRIORITY_MAX:
        raise error(f"priority must be between 0 (first) and {PRIORITY_MAX}, got {priority}")
    for name, check in COLUMN_OPTIONS.items():
        value = columns.get(name)
        if value is not None:
            check(value, error)
    if run_at is not None and not isinstance(run_at, ClauseElement):
        if not isinstance(run_at, dt.datetime):
            raise error(f"run_at must be a datetime, got {run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise error(
                "run_at has no time zone; pass an aware datetime such as "
                "datetime.now(timezone.utc) + timedelta(minutes=5), or use delay="
            )


# -- a job's args, tags and meta: JSON that jsonb stores and a worker decodes ----------------------

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


def _one_encoder() -> Callable[[object], str]:
    """`_ENCODER.encode` of a dict, without the C encoder it builds per call (a third of
    its cost, profiled: bulk enqueue); the same text. Without a circular-reference check: a
    cycle raises RecursionError, which `encode_json_object` explains as `_args_problem`."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - an interpreter without the C accelerator
        return _ENCODER.encode
    chunks = make(
        None, _reject_non_json, json.encoder.encode_basestring_ascii, None, ": ", ", ",
        False, False, False,
    )  # fmt: skip

    def encode(value: object) -> str:
        return "".join(chunks(value, 0))

    return encode


encode_json = _one_encoder()
"""A dict as JSON text, as `_ENCODER.encode` writes it (no NaN, nothing but JSON types)."""


def encodes_as(value: object, encoded: str) -> bool:
    """Whether `value` is still the JSON `encoded` (what `encode_json_object` gave for it
    once): True lets a flush write a job checked at its enqueue without checking it again,
    and is False for anything changed since, in place or not (it is then checked again)."""
    try:
        return type(value) is dict and encode_json(value) == encoded
    except (TypeError, ValueError, RecursionError):
        return False


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
        encoded = encode_json(value)
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


def plain_args_json(args: object) -> str | None:
    """`args` as the JSON text `encode_json_object` would return for them, when nothing in
    that text asks for a closer look (no `\\u` escape, exponent, long digit run or deep
    nesting, within the size limit): bulk enqueue's common case, checked by cheap tests
    only. None for anything else, which `encode_json_object` then checks (and refuses or not)."""
    if type(args) is not dict:
        return None
    for key in args:
        if type(key) is not str:
            return None
    try:
        encoded = encode_json(args)
    except (RecursionError, ValueError, TypeError):
        return None
    size = len(encoded)
    if (
        size > limits.max_args_bytes
        or size > MAX_INT_DIGITS
        or "\\u" in encoded
        or (("e+" in encoded or "e-" in encoded) and _EXPONENT.search(encoded))
        or encoded.count("[") + encoded.count("{") > limits.max_args_depth
    ):
        return None
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
    the column options (`COLUMN_OPTIONS`, e.g. max_attempts) by name. `names_checked`: the
    task and queue names passed this check already (bulk enqueue checks each pair once).
    """
    name = task if isinstance(task, str) else repr(task)
    if not names_checked:
        refuse = invalid_job(name[:60])
        validate_name("task name", task, refuse)
        validate_name("queue name", queue, refuse)
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
    refuse = invalid_job(name[:60])
    for tag in tags:
        validate_name("tag", tag, refuse)
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


MAX_SIGNAL_KEY_LENGTH = 200
"""A signal key's length at most (the SQL function `sqla_queue.signal` refuses longer ones)."""
MAX_SIGNAL_SECONDS = 3650 * 86400.0
"""A signal's expiry and a wait's timeout at most: ten years, in seconds."""


def check_signal_key(key: object, call: str) -> str:
    """A signal key (`sqla_queue.signal`, `ctx.wait_for_signal`), or a `ValueError` in one
    line naming what is wrong with it."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_SIGNAL_KEY_LENGTH:
        got = f"a {type(key).__name__}" if not isinstance(key, str) else f"{len(key)} characters"
        raise ValueError(
            f"{call}: a signal key is a string of 1 to {MAX_SIGNAL_KEY_LENGTH} characters "
            f"(got {got}); name what the signal is about, e.g. 'payment:42'"
        )
    return key


def signal_seconds(value: object, what: str, call: str) -> float:
    """A signal's `expires_in` or a wait's `timeout` (a timedelta or seconds) in seconds, or
    a `ValueError` in one line."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 < seconds <= MAX_SIGNAL_SECONDS
    ):
        raise ValueError(
            f"{call}: {what} must be a positive timedelta or number of seconds, at most "
            f"10 years (got {value!r})"
        )
    return float(seconds)
