"""Median and spread of repeated measurements, and percentiles of latency samples."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """median, min, max and spread ((max - min) / median) of the measured repetitions."""
    if not samples:
        return {"median": None, "min": None, "max": None, "spread": None, "samples": []}
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / median if median else 0.0
    return {
        "median": median,
        "min": min(samples),
        "max": max(samples),
        "spread": spread,
        "samples": list(samples),
    }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(latencies_ms)
    return {
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": ordered[-1] if ordered else float("nan"),
        "count": len(ordered),
    }
