"""benchmarks/typed_calls.py runs at tiny sizes and returns the documented figures."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import typed_calls


def test_typed_calls_benchmark_measures_both_sides(database_url: str) -> None:
    result = typed_calls.typed_calls(database_url, transactions=3, repeats=2)
    assert len(result["dict"]["runs"]) == len(result["typed"]["runs"]) == 2
    assert result["ratio"] > 0
    assert result["transactions"] == 3
    assert result["converters"] in ("pydantic", "builtin")
