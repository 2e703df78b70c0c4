"""A claimed row's args are decoded by the JSON decoder's C scanner for the text PostgreSQL
writes, and by `json.loads` otherwise: every text decodes, or is refused, as `json.loads`
would (the same args, the same reason)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sqla_queue.worker.jobs import decode_args


@pytest.mark.parametrize(
    "args_json",
    [
        "{}",
        '{"n": 1, "s": "x", "l": [1, 2.5, null, true], "d": {"a": {}}}',
        ' {"n": 1} ',  # whitespace around: json.loads skips it
        '\t{"n": 1}\n',
        '{"n": 1} trailing',
        '{"n": 1}{"m": 2}',
        '{"n": 1, "n": 2}',  # the last of a duplicated key, as json.loads
        '{"n": NaN, "i": Infinity}',
        '{"big": 1e400}',
        '{"s": "\\ud800"}',
        "[1, 2]",
        "1",
        "null",
        '"text"',
        "",
        "{",
        '{"n": }',
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 5_000 + "1" + "}" * 5_000,
        b'{"n": 1}',
    ],
)
def test_decode_args_decodes_and_refuses_as_json_loads(args_json: Any) -> None:
    decoded = repr(decode_args(args_json))  # repr: NaN equals itself there
    try:
        loaded = json.loads(args_json)
    except (RecursionError, ValueError) as exc:
        why = f"args cannot be decoded ({type(exc).__name__}: {exc})"[:500]
        assert decoded == repr(({}, why))
    else:
        kind = type(loaded).__name__
        expected = (
            (loaded, None) if kind == "dict" else ({}, f"args must be a JSON object, got {kind}")
        )
        assert decoded == repr(expected)


def test_the_decoded_args_are_a_fresh_dict_per_row() -> None:
    """The scanner's key memo does not make rows share their dicts."""
    first, _ = decode_args('{"n": 1}')
    second, _ = decode_args('{"n": 1}')
    first["n"] = 2
    assert second == {"n": 1}
