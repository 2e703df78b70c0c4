"""`python -m benchmarks [--quick] [--database-url URL] [--seconds N] [--repeat N] ...`.

By default the harness starts a private PostgreSQL cluster of its own (initdb into a
temporary folder, stock settings, a free port) and removes it at the end; `--database-url`
measures on a server of your choice instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from . import optional, peers, report, scenarios
from .cluster import ClusterError, PrivateCluster
from .database import BenchDatabase

ROOT = Path(__file__).resolve().parent.parent


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument(
        "--database-url",
        default=os.environ.get("SQLA_QUEUE_BENCH_URL"),
        help="measure on this server (the harness creates and drops a database of its own "
        "there) instead of a private cluster it starts and removes",
    )
    p.add_argument(
        "--cluster-port", type=int, default=0, help="port of the private cluster (default: free)"
    )
    p.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes)")
    p.add_argument("--seconds", type=float, help="seconds per measured repetition")
    p.add_argument("--repeat", type=int, help="measured repetitions (default 3)")
    p.add_argument("--skip-ceiling", action="store_true", help="do not run the pgbench ceiling")
    p.add_argument(
        "--warm",
        action="store_true",
        help="ANALYZE each backlog between its insert and its drain (the old way; default cold)",
    )
    p.add_argument("--drain-jobs", type=int, help="jobs pre-inserted per drain repetition")
    p.add_argument("--health-jobs", type=int, help="jobs processed for the table-size check")
    p.add_argument("--multixact-jobs", type=int, help="jobs per MultiXact measurement")
    p.add_argument("--latency-jobs", type=int, help="idle latency probes per repetition")
    p.add_argument("--concurrency", type=int, nargs="+", help="drain concurrencies")
    p.add_argument("--batch", type=int, nargs="+", help="drain batch sizes")
    p.add_argument("--backlog-small", type=int, help="small backlog (default 10,000)")
    p.add_argument("--backlog-large", type=int, help="deep backlog (default 1,000,000)")
    p.add_argument("--deep-seconds", type=float, help="seconds of our deep-backlog drain")
    p.add_argument("--backlog-concurrency", type=int, help="worker concurrency, backlog/peers")
    p.add_argument("--backlog-batch", type=int, help="worker batch, backlog/peers")
    p.add_argument("--load-rate", type=float, help="background jobs/s in latency under load")
    p.add_argument("--load-producers", type=int, help="processes enqueuing that load")
    p.add_argument("--processes", type=int, help="N of the `worker --processes N` line")
    p.add_argument(
        "--peers",
        nargs="*",
        choices=peers.NAMES,
        help=f"peers to measure (default: {' '.join(peers.NAMES)}; none with --peers alone)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite BENCHMARKS.md and the chart from the existing latest.json; measure nothing",
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        help="write latest.json, BENCHMARKS.md and the chart here instead of the repo",
    )
    return p.parse_args(argv)


def plan_from(args: argparse.Namespace) -> scenarios.Plan:
    plan = scenarios.Plan.quick() if args.quick else scenarios.Plan()
    overrides = {
        "seconds": args.seconds,
        "repeat": args.repeat,
        "drain_jobs": args.drain_jobs,
        "health_jobs": args.health_jobs,
        "multixact_jobs": args.multixact_jobs,
        "latency_jobs": args.latency_jobs,
        "concurrencies": tuple(args.concurrency) if args.concurrency else None,
        "batches": tuple(args.batch) if args.batch else None,
        "backlog_small": args.backlog_small,
        "backlog_large": args.backlog_large,
        "deep_seconds": args.deep_seconds,
        "backlog_concurrency": args.backlog_concurrency,
        "backlog_batch": args.backlog_batch,
        "load_rate": args.load_rate,
        "load_producers": args.load_producers,
        "processes": args.processes,
        "peers": tuple(args.peers) if args.peers is not None else None,
    }
    for key, value in overrides.items():
        if value is not None:
            setattr(plan, key, value)
    if args.seconds is not None:
        plan.warmup = min(plan.warmup, args.seconds)
        plan.latency_load_probes = min(plan.latency_load_probes, max(20, int(args.seconds * 50)))
    plan.skip_ceiling = args.skip_ceiling
    plan.warm = args.warm
    if plan.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    return plan


def write_reports(
    results: dict[str, Any], json_path: Path, md_path: Path, chart_path: Path, console: Console
) -> None:
    """Targets, chart, JSON and markdown from the results of a run."""
    results["targets"] = report.targets(results)
    chart = report.write_chart(results, chart_path)
    if chart is None:
        console.print("matplotlib is not installed: skipping the chart (pip install '.[bench]')")
    results["meta"]["chart"] = chart
    report.write_json(results, json_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(report.markdown(results, chart, md_path.parent))
    for t in results["targets"]:
        mark = {True: "[green]met[/]", False: "[red]missed[/]", None: "n/a"}[t["met"]]
        console.print(f"{mark}  {t['target']}: {t['measured']}")
    console.print(f"wrote {json_path}, {md_path}" + (f", {chart}" if chart else ""))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    plan = plan_from(args)
    console = Console(stderr=True)
    out_dir: Path | None = args.output_dir
    json_path = (out_dir or ROOT / "benchmarks" / "results") / "latest.json"
    md_path = (out_dir or ROOT) / "BENCHMARKS.md"
    chart_path = (out_dir or ROOT / "benchmarks" / "results") / "drain_concurrency.png"

    if args.report_only:
        write_reports(json.loads(json_path.read_text()), json_path, md_path, chart_path, console)
        return 0

    cluster: PrivateCluster | None = None
    if args.database_url:
        server_url = args.database_url
        where = {"kind": "url", "description": "a server given by --database-url"}
    else:
        try:
            cluster = PrivateCluster(port=args.cluster_port)
            console.print(f"starting a private PostgreSQL cluster ({cluster.bindir}) ...")
            server_url = cluster.start()
            plan.server_data = str(cluster.data)
        except ClusterError as exc:
            console.print(f"[red]{exc}[/]")
            return 2
        # The ceiling's psql and pgbench: the same version as the server's.
        os.environ["PATH"] = f"{cluster.bindir}{os.pathsep}{os.environ.get('PATH', '')}"
        where = {
            "kind": "private",
            "description": f"a private cluster started for this run (initdb of {cluster.bindir}, "
            f"stock settings, port {cluster.port}), removed afterwards",
        }
    try:
        results = measure(server_url, args, plan, console)
    finally:
        if cluster is not None:
            cluster.stop()
    results["meta"]["where"] = where
    write_reports(results, json_path, md_path, chart_path, console)
    return 0


def measure(
    server_url: str, args: argparse.Namespace, plan: scenarios.Plan, console: Console
) -> dict[str, Any]:
    db = BenchDatabase(server_url)
    started = time.monotonic()
    results: dict[str, Any] = {
        "meta": {
            "started_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "quick": args.quick,
            "warm": args.warm,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlalchemy": sqlalchemy.__version__,
            "psycopg": psycopg.__version__,
            "database": db.name,
            "plan": plan.as_dict(),
            "peers": {name: peers.version(name) for name in plan.peers},
        },
        "scenarios": {},
        "notes": [],
    }
    drain_steps = len(plan.concurrencies) * len(plan.batches) + 2
    total = len(scenarios.NAMES) + drain_steps + len(optional.SECTIONS)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        overall = progress.add_task("creating the benchmark database", total=total)

        def say(line: str) -> None:
            progress.console.print(f"  {line}")

        def step() -> None:
            progress.advance(overall)

        db.create()
        try:
            results["meta"]["server"] = db.server_settings()
            sc = results["scenarios"]
            for name in scenarios.NAMES:
                progress.update(overall, description=f"[bold]{name}[/]")
                if name == "drain":
                    sc[name] = scenarios.drain(db, plan, say, step)
                else:
                    sc[name] = getattr(scenarios, name)(db, plan, say)
                step()
                if name == "ceiling" and sc[name]["available"]:
                    plan.ceiling_best = sc[name]["best"].get("50")
                if name == "ceiling" and not sc[name]["available"]:
                    say(f"[yellow]no ceiling: {sc[name]['reason']}; absolute figures only[/]")
            for section in optional.SECTIONS:
                progress.update(overall, description=f"[bold]{section.name}[/]")
                sc[section.name] = section.run(db, plan, say)
                if not sc[section.name]["available"]:
                    say(f"[yellow]{section.name}: not measured ({sc[section.name]['reason']})[/]")
                step()
        finally:
            db.drop()
    results["meta"]["duration_s"] = time.monotonic() - started
    if not results["scenarios"]["table_size"]["complete"]:
        results["notes"].append("the table-size run was cut short by its time bound")
    return results


if __name__ == "__main__":
    sys.exit(main())
