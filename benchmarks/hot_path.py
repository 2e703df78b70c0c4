"""The harness's section for issue 39, "pay only for what you use": its figures in the same
run as the ceiling and the peers.

- **Feature tax** (`benchmarks.feature_tax`): plain-job `COPY` and single `INSERT` + `COMMIT`
  into the jobs table against a table of the same columns with only the primary key and one
  claim index, and what each index and trigger of the jobs table costs a plain row.
- **Enqueue** (the same module): `enqueue()` in an ORM transaction against the same
  transaction with a hand-written job INSERT, and `enqueue_many` against a raw COPY of the
  same rows, alternated.
- **Drain of jobs enqueued just before** (`benchmarks/before_after.py --drain-only`, a
  process of its own each time): one worker process (c=16, batch 50) and two forked burst
  workers (c=4 each, as `worker --processes 2` runs them), `plan.drain_jobs` no-op jobs
  enqueued by `enqueue_many` and drained cold, timed from the workers' start to an empty
  queue, with the worker's CPU per job (`process_time`, or the children's) and, on the
  harness's own cluster, the server's (the postmaster and its children, from /proc).
  Alternated one and two processes, `plan.repeat` times each.

The ratios to the ceiling are to the run's best batch-50 line (`plan.ceiling_best`, set by
the harness once the ceiling has run).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import enqueue_paths, feature_tax

Say = Callable[[str], None]
BEFORE_AFTER = Path(__file__).with_name("before_after.py")
DRAINS = (("one process, c=16, batch 50", 1, 16), ("`--processes 2`, c=4 each, batch 50", 2, 4))
"""(label, processes, concurrency of each) of the drain lines."""
CPUS = os.cpu_count() or 1
TINY_DRAIN = 10_000
"""Below this many drain jobs, a plan is a smoke test's: the feature tax measures the jobs
and minimal tables once, not each feature."""

# What limits each target that this machine does not meet, from this section's own figures
# (the CPU per job columns) and the profiles of BENCHMARKS.md's issue 39 sections.
LIMITS = {
    "i39_drain_one": (
        "CPU: a job costs the worker's Python (claimed rows made into jobs, the hand-off to a "
        "handler thread, the outcome folded into the next claim) and the server's claim and "
        'finish; at the measured costs the machine\'s CPUs complete at most the "at most" '
        "figure, however the two overlap, below the target; pgbench's C client spends almost "
        "no CPU of its own. One process also stays under that bound: one connection carries "
        "its claims and finishes one statement at a time (a second connection for the "
        "finishes, tried in round 6 on a loaded machine: 0.81-1.26x paired and more server "
        "CPU per job; reverted)."
    ),
    "i39_drain_two": (
        "the same CPU sum: two worker processes and PostgreSQL share the machine's CPUs, and "
        'at the measured costs per job they complete at most the "at most" figure, below '
        "the target, whatever the number of processes."
    ),
    "i39_copy": (
        "the server's CPU per row (in the figure): the jobs table's indexes, CHECKs and "
        "triggers beyond the minimal table's, each a fraction of a microsecond per COPYed row "
        "(the shares above, most within the noise one by one), the claim indexes over every "
        "queued job among the largest. A partial claim index per feature made a fair claim "
        "64 ms slower, a LATERAL claim per queue locked N x limit rows (BENCHMARKS.md, issue "
        "39's feature tax)."
    ),
    "i39_insert": (
        "the same per row, and the queue check's statement trigger, one look-up per statement, "
        "that a single-row INSERT pays whole."
    ),
    "i39_enqueue": (
        "enqueue()'s Python per call (validation, JSON, the ORM unit of work) on a CPU "
        "shared with the server."
    ),
    "i39_enqueue_many": (
        "the per-row Python before the COPY (validation and serialisation) against a raw "
        "COPY that only writes."
    ),
}


def cpu_bound(line: dict[str, Any]) -> float | None:
    """The most jobs/s this machine's CPUs could complete at the drain's measured CPU per job
    (the worker's and the server's together, whatever overlaps), or None without the
    server's figure."""
    if not line["worker_cpu_us"] or not line["server_cpu_us"]:
        return None
    return float(CPUS * 1e6 / (line["worker_cpu_us"] + line["server_cpu_us"]))


def _drain(server_url: str, data: str | None, jobs: int, processes: int, c: int) -> dict[str, Any]:
    """One drain by `before_after.py` in a process of its own; its JSON line."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
        command = [
            sys.executable,
            str(BEFORE_AFTER),
            "hot_path",
            out.name,
            server_url,
            "--drain-only",
            "--jobs",
            str(jobs),
            "--batch",
            "50",
            "--concurrency",
            str(c),
            "--processes",
            str(processes),
        ]
        if data:
            command += ["--server-data", data]
        root = str(BEFORE_AFTER.parents[1])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run(command, check=True, env=env, cwd=root, capture_output=True, text=True)
        return dict(json.loads(out.read().splitlines()[-1]))


def drains(server_url: str, data: str | None, jobs: int, repeat: int) -> list[dict[str, Any]]:
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in DRAINS}
    for i in range(repeat):
        order = DRAINS if i % 2 == 0 else DRAINS[::-1]
        for label, processes, c in order:
            runs[label].append(_drain(server_url, data, jobs, processes, c))
    lines = []
    for label, processes, c in DRAINS:
        got = runs[label]

        def median(key: str, got: list[dict[str, Any]] = got) -> float | None:
            values = [line[key] for line in got if line.get(key)]
            return statistics.median(values) if values else None

        lines.append(
            {
                "label": label,
                "processes": processes,
                "concurrency": c,
                "jobs": jobs,
                "runs": [line["drain"] for line in got],
                "median": median("drain"),
                "worker_cpu_us": median("drain_cpu_us"),
                "server_cpu_us": median("server_cpu_us") if data else None,
            }
        )
    return lines


def run(db: Any, plan: Any, say: Say) -> dict[str, Any]:
    # a tiny run (the harness's own smoke test) measures the two tables once, no feature
    tiny = plan.drain_jobs < TINY_DRAIN
    rounds = 1 if tiny else 2 if plan.is_quick else 4
    with enqueue_paths.scratch_database(db.server_url) as url:
        result: dict[str, Any] = feature_tax.run(
            url, feature_tax.PARTS, rounds, each_feature=not tiny
        )
    tax = result["tax"]
    say(
        "feature tax: COPY {:.2f}x, INSERT {:.2f}x the minimal table".format(
            tax["rate_vs_minimal"]["copy"], tax["rate_vs_minimal"]["insert"]
        )
    )
    result["drains"] = drains(
        db.server_url, getattr(plan, "server_data", None), plan.drain_jobs, plan.repeat
    )
    for line in result["drains"]:
        say(f"drain {line['label']}: {line['median']:,.0f} jobs/s")
    result["ceiling_best"] = getattr(plan, "ceiling_best", None)
    return result


def _row(name: str, target: str, measured: str, met: bool | None) -> dict[str, Any]:
    return {
        "name": name,
        "issue": 39,
        "target": target,
        "measured": measured,
        "met": met,
        "limited_by": LIMITS.get(name, "") if met is False else "",
    }


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    tax = result["tax"]
    rate = tax["median_rate"]
    for name, workload, what in (
        ("i39_copy", "copy", "plain-job COPY"),
        ("i39_insert", "insert", "plain-job single INSERT + COMMIT"),
    ):
        ratio = tax["rate_vs_minimal"][workload]
        cpu = tax["median_cpu_us"]
        rows.append(
            _row(
                name,
                f"{what} into the jobs table >= 0.9x the minimal table's",
                f"{rate['jobs'][workload]:,.0f} vs {rate['minimal'][workload]:,.0f} rows/s = "
                f"{ratio:.2f}x; server CPU {cpu['jobs'][workload]:.1f} vs "
                f"{cpu['minimal'][workload]:.1f} us a row",
                ratio >= 0.9,
            )
        )
    best = result.get("ceiling_best")
    for line, (name, share) in zip(
        result["drains"], (("i39_drain_one", 0.8), ("i39_drain_two", 1.0)), strict=True
    ):
        cpu = f"; worker {line['worker_cpu_us']:.1f} us/job" if line["worker_cpu_us"] else ""
        bound = cpu_bound(line)
        if bound is not None:
            cpu += f", server {line['server_cpu_us']:.1f} us/job: at most {bound:,.0f} jobs/s"
            cpu += f" on {CPUS} CPUs" + (f" = {bound / best:.2f}x" if best else "")
        ratio = line["median"] / best if best else None
        measured = f"{line['median']:,.0f} jobs/s"
        measured += f" = {ratio:.2f}x of {best:,.0f}" if ratio is not None else " (no ceiling)"
        rows.append(
            _row(
                name,
                f"drain of {line['jobs']:,} jobs enqueued just before, {line['label']}: "
                f">= {share}x the best batch-50 ceiling line",
                measured + cpu,
                None if ratio is None else ratio >= share,
            )
        )
    enqueue = result["enqueue"]
    business, bulk = enqueue["business_tx"], enqueue["bulk"]
    rows.append(
        _row(
            "i39_enqueue",
            "enqueue() in an ORM transaction >= 0.9x the same transaction with a hand-written "
            "INSERT",
            f"{business['with']['median']:,.0f} vs {business['with_sql_insert']['median']:,.0f} "
            f"tx/s = {business['ratio_to_sql']:.2f}x (pairs {business['ratio_to_sql_pairs']:.2f}x)",
            business["ratio_to_sql_pairs"] >= 0.9,
        )
    )
    rows.append(
        _row(
            "i39_enqueue_many",
            "enqueue_many >= 0.9x a raw COPY of the same rows",
            f"{bulk['enqueue_many']['median']:,.0f} vs {bulk['raw_copy']['median']:,.0f} rows/s "
            f"= {bulk['ratio']:.2f}x (pairs {bulk['ratio_of_pairs']:.2f}x)",
            bulk["ratio_of_pairs"] >= 0.9,
        )
    )
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "Plain jobs into the jobs table and into a minimal table (the same columns, the primary "
        f"key and one claim index), {result['tax']['rounds']} rounds alternated after a "
        "warm-up (`benchmarks.feature_tax`):",
        "",
        feature_tax.report({k: result[k] for k in ("tax", "enqueue", "load_before", "load_after")}),
        "",
        "Drains of jobs enqueued just before (`benchmarks/before_after.py --drain-only`, "
        "alternated; worker CPU: the worker processes' own; server CPU: the cluster's "
        "processes', from /proc; at most: the CPUs' time divided by the two together, the rate no "
        "overlap of worker and server can pass at those costs):",
        "",
        "| drain | runs (jobs/s) | median | ratio to the best batch-50 line | worker CPU "
        f"per job | server CPU per job | at most, on {CPUS} CPUs (ratio) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    best = result.get("ceiling_best")
    for line in result["drains"]:
        ratio = f"{line['median'] / best:.2f}x" if best else "no ceiling"
        server = f"{line['server_cpu_us']:.1f} us" if line["server_cpu_us"] else "not read"
        bound = cpu_bound(line)
        most = (
            "-" if bound is None else f"{bound:,.0f}" + (f" ({bound / best:.2f}x)" if best else "")
        )
        lines.append(
            f"| {line['jobs']:,} jobs, {line['label']} | "
            + ", ".join(f"{r:,.0f}" for r in line["runs"])
            + f" | {line['median']:,.0f} | {ratio} | {line['worker_cpu_us']:.1f} us | {server} "
            f"| {most} |"
        )
    return "\n".join(lines)
