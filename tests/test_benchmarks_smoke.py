"""The benchmark harness runs end to end at tiny sizes and writes every scenario."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(240)
def test_harness_writes_every_scenario_at_tiny_sizes(admin_url: str, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "benchmarks",
        "--database-url", admin_url,
        "--quick", "--skip-ceiling",
        "--seconds", "0.2", "--repeat", "1",
        "--drain-jobs", "500", "--health-jobs", "2000", "--multixact-jobs", "80",
        "--latency-jobs", "5", "--concurrency", "1", "4", "--batch", "1", "50",
        "--output-dir", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]

    results = json.loads((tmp_path / "latest.json").read_text())
    assert sorted(results["scenarios"]) == [
        "bulk_enqueue", "ceiling", "drain", "enqueue_single", "latency", "multixacts", "table_size",
    ]  # fmt: skip
    assert results["scenarios"]["ceiling"]["available"] is False
    assert {(r["concurrency"], r["batch"]) for r in results["scenarios"]["drain"]["grid"]} == {
        (1, 1), (4, 1), (1, 50), (4, 50),
    }  # fmt: skip
    assert all(r["median"] > 0 for r in results["scenarios"]["drain"]["grid"])
    assert results["scenarios"]["table_size"]["processed"] == 2000
    assert results["meta"]["server"]["synchronous_commit"] in {
        "on",
        "off",
        "local",
        "remote_write",
        "remote_apply",
    }
    assert {t["name"] for t in results["targets"]} >= {"bulk_enqueue", "latency_idle"}
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Targets" in markdown
    if importlib.util.find_spec("matplotlib") is None:
        assert "skipping the chart" in done.stderr
    else:
        assert (tmp_path / "drain_concurrency.png").stat().st_size > 0
