"""The benchmark harness runs end to end at tiny sizes and writes every scenario."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the harness lives in the checkout, not in the package

from benchmarks import optional, report  # noqa: E402
from benchmarks.cluster import ClusterError, PrivateCluster, find_bindir  # noqa: E402

TINY = [
    "--quick", "--skip-ceiling", "--seconds", "0.2", "--repeat", "1",
    "--drain-jobs", "500", "--health-jobs", "2000", "--multixact-jobs", "80",
    "--latency-jobs", "5", "--concurrency", "1", "4", "--batch", "1", "50",
    "--backlog-small", "200", "--backlog-large", "1000", "--deep-seconds", "0.5",
    "--load-rate", "50", "--load-producers", "2",
]  # fmt: skip

SCENARIOS = [
    "backlog", "bulk_enqueue", "ceiling", "drain", "enqueue_paths", "enqueue_single", "hot_path",
    "latency", "limits", "multixacts", "processes", "results_wait", "table_size", "workflows",
]  # fmt: skip


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "benchmarks", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(480)
def test_harness_writes_every_scenario_at_tiny_sizes(admin_url: str, tmp_path: Path) -> None:
    done = _run([*TINY, "--database-url", admin_url, "--peers", "--output-dir", str(tmp_path)], 470)
    assert done.returncode == 0, done.stderr[-3000:]

    results = json.loads((tmp_path / "latest.json").read_text())
    assert sorted(results["scenarios"]) == SCENARIOS
    assert results["meta"]["where"]["kind"] == "url"
    assert results["scenarios"]["ceiling"]["available"] is False
    assert {(r["concurrency"], r["batch"]) for r in results["scenarios"]["drain"]["grid"]} == {
        (1, 1), (4, 1), (1, 50), (4, 50),
    }  # fmt: skip
    assert all(r["median"] > 0 for r in results["scenarios"]["drain"]["grid"])
    assert results["scenarios"]["table_size"]["processed"] == 2000
    limits = results["scenarios"]["limits"]
    assert limits["available"] is True, limits
    assert limits["limit_cost"]["ratio"] > 0
    assert limits["binding_limit"]["share_of_limit"] > 0
    flows = results["scenarios"]["workflows"]
    assert flows["available"] is True, flows
    assert flows["fan"]["width"] == 500
    assert flows["fan"]["fan_in_ms"]["median"] > 0
    assert flows["chain"]["link_p99_ms"]["median"] >= flows["chain"]["link_p50_ms"]["median"] > 0
    assert flows["pairs"]["ratio"]["median"] > 0
    assert flows["finish_cost"]["delete"]["ratio"]["median"] > 0
    wait = results["scenarios"]["results_wait"]
    assert wait["available"] is True, wait
    assert wait["jobs"] == 100
    assert wait["p99"] >= wait["p50"] > 0
    hot = results["scenarios"]["hot_path"]
    assert hot["available"] is True, hot
    assert hot["tax"]["median_rate"]["minimal"]["copy"] > 0
    assert hot["tax"]["features"] == {}  # a tiny plan: the two tables, no feature one by one
    assert [(d["processes"], d["jobs"]) for d in hot["drains"]] == [(1, 500), (2, 500)]
    assert all(d["median"] > 0 and d["worker_cpu_us"] > 0 for d in hot["drains"])
    assert all(d["server_cpu_us"] is None for d in hot["drains"])  # not its own cluster
    rows39 = [t for t in results["targets"] if t["issue"] == 39]
    assert [t["name"] for t in rows39] == [
        "i39_copy", "i39_insert", "i39_drain_one", "i39_drain_two", "i39_enqueue",
        "i39_enqueue_many",
    ]  # fmt: skip
    assert [t["met"] for t in rows39][2:4] == [None, None]  # no ceiling: no ratio
    assert results["meta"]["server"]["synchronous_commit"] in {
        "on",
        "off",
        "local",
        "remote_write",
        "remote_apply",
    }
    backlog = results["scenarios"]["backlog"]
    assert list(backlog["systems"]) == ["sqla_queue"]  # --peers with no names: no peer
    ours = backlog["systems"]["sqla_queue"]
    assert ours["small"]["median"] > 0  # (a floor when a tiny backlog empties between polls)
    # the deep drain ran: a window is measured only once its first jobs are done; its one
    # 0.2 s window can see no job finish on a loaded machine, so the rate is not bounded here
    assert ours["large"]["samples"]
    assert ours["large"]["median"] >= 0
    assert ours["claim_probe_error"] is None
    assert isinstance(ours["autovacuum_runs"], int)
    load = results["scenarios"]["latency"]["load"]
    assert load["background_processes"] == 2
    assert load["background_jobs_per_s"] > 0
    assert {t["name"] for t in results["targets"]} >= {
        "bulk_enqueue", "latency_idle", "t5_c64", "t6_backlog", "t7_latency_load", "t8_bulk",
    }  # fmt: skip
    rows13 = [t for t in results["targets"] if t["issue"] == 13]
    assert [t["name"] for t in rows13][: len(report.ISSUE13)] == [n for n, _ in report.ISSUE13]
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Targets" in markdown
    assert "### Issue 13" in markdown
    assert "### Issue 39: pay only for what you use" in markdown
    assert "## Deep backlog" in markdown
    assert "## Peers in the same run" in markdown
    assert "the server given by `--database-url`" in markdown
    for section in optional.SECTIONS:
        if not section.present():
            assert f"## {section.title}\n\nNot measured in this run" in markdown
    if importlib.util.find_spec("matplotlib") is None:
        assert "skipping the chart" in done.stderr
    else:
        assert (tmp_path / "drain_concurrency.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_harness_on_its_private_cluster_with_peers(tmp_path: Path) -> None:
    """The default: a private cluster of its own, removed afterwards; peers that are not
    installed are reported with the reason, never dropped."""
    before = {p.name for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("sqlaq_bench_pg_*")}
    done = _run([*TINY, "--output-dir", str(tmp_path)], 590)
    assert done.returncode == 0, done.stderr[-3000:]
    after = {p.name for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("sqlaq_bench_pg_*")}
    assert after <= before  # the cluster's folder is gone

    results = json.loads((tmp_path / "latest.json").read_text())
    assert results["meta"]["where"]["kind"] == "private"
    assert results["meta"]["server"]["autovacuum"] == "on"
    systems = results["scenarios"]["backlog"]["systems"]
    bulk_peers = results["scenarios"]["bulk_enqueue"]["peers"]
    for peer in ("pgqueuer", "procrastinate"):
        for res in (systems[peer], bulk_peers[peer]):
            if importlib.util.find_spec(peer) is None:
                assert "not installed" in res["error"]
            else:
                assert "error" not in res, res
        if "error" not in systems[peer]:
            assert systems[peer]["small"]["median"] > 0
            assert systems[peer]["large"]["samples"]
            assert systems[peer]["large"]["median"] >= 0
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert "a private PostgreSQL cluster the harness started" in markdown
    assert "**Quick run: the deep backlog is 1,000 jobs" in markdown


@pytest.mark.timeout(120)
def test_private_cluster_starts_stock_and_is_removed() -> None:
    cluster = PrivateCluster()
    url = cluster.start()
    folder = cluster.folder
    try:
        assert folder is not None
        assert folder.exists()
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SHOW autovacuum").fetchone() == ("on",)
            assert conn.execute("SHOW port").fetchone() == (str(cluster.port),)
    finally:
        cluster.stop()
    assert not folder.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)


def test_private_cluster_refuses_a_port_in_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ClusterError, match=f"port {port} is in use"):
            PrivateCluster(port=port).start()


def test_missing_postgres_binaries_name_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no pg_config
    monkeypatch.setenv("SQLA_QUEUE_PG_BINDIR", str(tmp_path))
    monkeypatch.setattr("benchmarks.cluster.glob.glob", lambda pattern: [])
    with pytest.raises(ClusterError, match="--database-url"):
        find_bindir()


def test_an_absent_or_failing_optional_section_is_reported_not_measured() -> None:
    absent = optional.Section("x", "benchmarks.no_such_module", "X", "x things")
    assert absent.run(None, None, print) == {
        "available": False,
        "reason": "benchmarks.no_such_module is not in this tree",
    }
    failing = optional.Section("x", "benchmarks.stats", "X", "x things")  # stats has no run()
    result = failing.run(None, None, print)
    assert result["available"] is False
    assert result["reason"].startswith("failed: AttributeError")


def test_enqueue_paths_figures_fill_the_issue13_rows() -> None:
    """The enqueue helper's documented keys become target rows 1 and 2."""
    side = {"median": 100.0, "runs": [100.0]}
    result = {
        "available": True,
        "business_tx": {"without": side, "with": {"median": 90.0}, "ratio": 0.9,
                        "job_cost": 0.1, "ratio_range": [0.85, 0.95]},
        "core_enqueue": {"raw": side, "core": {"median": 70.0}, "ratio": 0.7},
        "bulk_fk": {"raw_copy": side, "enqueue_many": {"median": 85.0}, "ratio": 0.85},
        "bulk_no_fk": {"raw_copy": side, "enqueue_many": {"median": 50.0}, "ratio": 0.5},
    }  # fmt: skip
    results = {
        "meta": {"plan": {}, "quick": False},
        "scenarios": {"enqueue_paths": result},
    }
    rows = {t["name"]: t for t in report.targets13(results)}
    assert rows["t1_business_tx"]["met"] is True
    assert "the job costs 10%" in rows["t1_business_tx"]["measured"]
    assert rows["t1_core"]["met"] is False
    assert rows["t1_core"]["limited_by"]
    assert rows["t2_bulk_fk"]["met"] is True
    assert rows["t2_bulk_nofk"]["met"] is False
    assert rows["t5_c64"]["met"] is None  # nothing measured for it here


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fairness_benchmark_runs_at_tiny_sizes(admin_url: str) -> None:
    """`python -m benchmarks.fairness` (issue 24's noisy neighbour and paired claim cost)
    end to end: every mode drains, the fair queue serves B..K before A's backlog. One worker
    process: with two, one's finishes of A's jobs could be written after the other's last
    B..K job finished (a job's `finished_at` is its write's time), by up to a claim of A's
    jobs (claims grow with the backlog), which counted 335-356 of A's 400 as not done
    before B..K in the FIFO queue (CI, and 1 run in 4 on a quiet machine): the order of
    writes across workers, not the claims' order this checks."""
    args = ["--database-url", admin_url, "--big", "400", "--small", "5", "--job-ms", "1"]
    args += ["--workers", "1", "--concurrency", "4", "--cost-jobs", "200", "--repeat", "1"]
    command = [sys.executable, "-m", "benchmarks.fairness", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("\n{") + 1 :])
    modes = {run["mode"]: run for run in report["noisy_neighbour"]}
    assert set(modes) == {"fifo", "fair", "alone"}
    assert modes["fifo"]["a_done_when_small_finished"] >= 360  # B..K waited behind A
    assert modes["fair"]["a_done_when_small_finished"] < 80  # B..K took turns with A
    assert all(run["multixacts"] == 0 for run in modes.values())
    for feature in ("fair", "limited", "sequences"):
        assert report["claim_cost"][feature]["ratio"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_stalls_benchmark_runs_at_tiny_sizes(admin_url: str) -> None:
    """`python -m benchmarks.stalls` (issue 40: gaps between job starts at a sustained rate,
    two checkouts side by side) end to end, with this checkout as both trees."""
    args = ["--database-url", admin_url, "--tree", f"a={ROOT}", "--tree", f"b={ROOT}"]
    args += ["--rate", "100", "--seconds", "3", "--warmup", "0.5", "--drain-timeout", "30"]
    command = [sys.executable, "-m", "benchmarks.stalls", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    runs = [line for line in lines if "tree" in line]
    (summary,) = [line["summary"] for line in lines if "summary" in line]
    assert [run["tree"] for run in runs] == ["a", "b"]
    for run in runs:
        assert run["never_started"] == 0, run
        assert run["started"] > 100, run
        assert 0 < run["longest_gap_s"] < 3, run
        assert run["worst_second_ratio"] > 0, run
    assert [row["tree"] for row in summary] == ["a", "b"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_durable_benchmark_runs_at_tiny_sizes(admin_url: str, tmp_path: Path) -> None:
    """`python -m benchmarks.durable` (issue 36: step cost, signal latency, parked jobs and
    the claim) end to end: every side measured in both halves of its A B .. B A round, the
    parked jobs made as asked, the figures' verdicts drawn from their own ratios."""
    output = tmp_path / "durable.json"
    args = ["--database-url", admin_url, "--output", str(output), "--repeat", "1"]
    args += ["--steps", "3", "--step-jobs", "30", "--idle-probes", "6", "--load-probes", "6"]
    args += ["--load-rate", "40", "--load-producers", "2", "--parked", "400", "--seed", "40"]
    args += ["--backlog", "120", "--claims", "4"]
    command = [sys.executable, "-m", "benchmarks.durable", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=410)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(output.read_text())

    steps = result["steps"]
    assert set(steps["seconds"]) == {"noop", "direct", "steps", "session_steps"}
    assert all(len(side["samples"]) == 2 for side in steps["seconds"].values())
    assert steps["step_rows_left_after_drains"] == 0  # a job's steps went with it
    assert steps["step"]["of_noop_job"] == pytest.approx(
        steps["step"]["us"] / steps["noop_job_us"], rel=0.01, abs=0.001
    )

    for load in ("idle", "load"):
        pair = result["signals"][load]
        assert pair["plain_ms"]["count"] == pair["signal_ms"]["count"] == 6
        assert pair["signal_ms"]["p50"] > 0  # each woken run started after its signal
        assert pair["target_met"] is (pair["p99_ratio"] <= 2.0)
    assert result["signals"]["load"]["background_processes"] == 2

    sides = result["parked"]["sides"]
    assert sides["none"]["parked"] == 0
    for kind in ("sleeping", "waiting"):
        side = sides[kind]
        assert (side["parked"], side["by_worker"], side["copied"]) == (400, 40, 360)
        assert side["target_met"] is (
            side["drain_ratio"] >= 0.95 and side["claim_p99_ratio"] >= 0.95
        )
    for side in sides.values():
        assert len(side["drain"]["samples"]) == 2
        assert side["claimed"] == [50, 50]  # a batch out of the backlog, rolled back
        assert side["idle_claimed"] == 0  # the parked jobs are never claimed
        assert side["claim"]["count"] == side["idle_claim"]["count"] == 8
        # the claim's plan is captured (at these tiny sizes the planner may scan the table:
        # which index the claim takes is the full-size run's finding, not this smoke's)
        assert any(" on jobs " in f"{line} " for line in side["claim_plan"]), side["claim_plan"]
