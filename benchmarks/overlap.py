"""Issue 39, item 2: the drain before and after the worker overlapped with the server.

    python -m benchmarks.overlap --tree main=PATH --tree new=PATH [--tree other=PATH ...]
        [--rounds 8] [--shape 1:16 --shape 2:4] [--out FILE]

Starts one private stock cluster (`benchmarks/cluster.py`), runs the pgbench ceiling
(`../shared/bench/ceiling/run`) on it, then, `--rounds` times, drains 100,000 no-op jobs
enqueued just before (cold: no ANALYZE between) with each tree in turn, the order of the
trees swapped every round: one process (c=16, batch 50) and two forked processes (c=4 each,
batch 50). Each drain is one run of `benchmarks/before_after.py --drain-only` with the
tree's folder first on PYTHONPATH (a source tree holding `sqla_queue/`, e.g. a `git archive`
of a commit), so every pair sees the same machine. Lines (JSON, one per drain, with the
load average, the worker's CPU per job and the server's) go to `--out` (the ceiling again
at the end with `--ceiling-at-end`); medians and ratios to the best batch-50 ceiling line
are printed, and each tree's drains against the first tree's, pair by pair (round by round).
`--shape PROCESSES:CONCURRENCY` (repeatable) picks the drains (default 1:16 and 2:4).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from .cluster import PrivateCluster

HERE = Path(__file__).resolve().parent
CEILING = HERE.parent.parent / "shared" / "bench" / "ceiling" / "run"


def ceiling(url: str, seconds: int) -> dict[str, int]:
    """The ceiling's lines, by their text before `jobs_per_s`."""
    done = subprocess.run(
        [str(CEILING), url, str(seconds)], capture_output=True, text=True, check=True
    )
    lines: dict[str, int] = {}
    for line in done.stdout.splitlines():
        head, _, value = line.rpartition(" jobs_per_s=")
        lines[head] = int(value)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--ceiling-seconds", type=int, default=5)
    parser.add_argument(
        "--ceiling-at-end", action="store_true", help="run the ceiling again after the drains"
    )
    parser.add_argument(
        "--shape",
        action="append",
        help="PROCESSES:CONCURRENCY of a drain (repeatable; default 1:16 and 2:4)",
    )
    parser.add_argument("--out", default=str(HERE / "results" / "issue39-overlap.jsonl"))
    opts = parser.parse_args()
    opts.out = os.path.abspath(opts.out)  # the drains run in /tmp
    # stopped by a signal, the private cluster is still stopped and removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    trees = [tuple(t.split("=", 1)) for t in opts.tree]
    shapes = [(1, 16), (2, 4)]  # (processes, concurrency each)
    if opts.shape:
        shapes = [(int(p), int(c)) for p, c in (shape.split(":") for shape in opts.shape)]
    with PrivateCluster() as cluster:
        url = cluster.url
        admin = url.replace("postgresql://", "postgresql+psycopg://")
        first = ceiling(url, opts.ceiling_seconds)
        with open(opts.out, "a") as f:
            f.write(json.dumps({"ceiling": first, "loadavg": os.getloadavg()[0]}) + "\n")
        for round_ in range(opts.rounds):
            order = trees if round_ % 2 == 0 else trees[::-1]
            for processes, concurrency in shapes:
                for label, path in order:
                    env = {**os.environ, "PYTHONPATH": path}
                    subprocess.run(
                        [
                            sys.executable,
                            str(HERE / "before_after.py"),
                            label,
                            opts.out,
                            admin,
                            "--drain-only",
                            "--jobs",
                            str(opts.jobs),
                            "--batch",
                            "50",
                            "--concurrency",
                            str(concurrency),
                            "--processes",
                            str(processes),
                            "--server-data",
                            str(cluster.data),
                        ],
                        env=env,
                        check=True,
                        cwd="/tmp",  # not the checkout: PYTHONPATH says which sqla_queue
                    )
        if opts.ceiling_at_end:
            last = ceiling(url, opts.ceiling_seconds)
            with open(opts.out, "a") as f:
                f.write(json.dumps({"ceiling": last, "loadavg": os.getloadavg()[0]}) + "\n")
    report(opts.out)


def report(path: str) -> None:
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    ceilings = [line["ceiling"] for line in lines if "ceiling" in line]
    best = max(
        value for c in ceilings for key, value in c.items() if key.startswith("ceiling batch=50")
    )
    print(f"best batch-50 ceiling line: {best:,} jobs/s")
    drains = [line for line in lines if "drain" in line]
    # the first --tree is the first drain of the first round: the base of the ratios
    labels = list(dict.fromkeys(d["label"] for d in drains))
    for shape in sorted({(d["processes"], d["concurrency"]) for d in drains}):
        # a round runs each tree once per shape: pair them in order, round by round
        runs = {
            label: [
                d["drain"]
                for d in drains
                if (d["processes"], d["concurrency"]) == shape and d["label"] == label
            ]
            for label in labels
        }
        b = labels[0]
        for a in labels[1:]:
            ratios = [x / y for x, y in zip(runs[a], runs[b], strict=False)]
            if ratios:
                print(
                    f"processes={shape[0]} c={shape[1]}: {a}/{b} pair by pair "
                    + ", ".join(f"{r:.2f}" for r in ratios)
                    + f"; median {statistics.median(ratios):.2f}"
                )
    keys = sorted({(d["processes"], d["concurrency"], d["label"]) for d in drains})
    for processes, concurrency, label in keys:
        runs = [
            d
            for d in drains
            if (d["processes"], d["concurrency"], d["label"]) == (processes, concurrency, label)
        ]
        rate = statistics.median(d["drain"] for d in runs)
        print(
            f"{label:6} processes={processes} c={concurrency}: {rate:,.0f} jobs/s"
            f" ({rate / best:.2f}x) worker {statistics.median(d['drain_cpu_us'] for d in runs):.1f}"
            f" us/job, server {statistics.median(d['server_cpu_us'] for d in runs):.1f} us/job,"
            f" load {statistics.median(d['loadavg'] for d in runs):.1f}, n={len(runs)}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--report"]:
        report(sys.argv[2])
    else:
        main()
