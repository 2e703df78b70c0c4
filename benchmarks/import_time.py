"""What importing sqla-queue costs, side by side with another checkout (issue 34).

    python -m benchmarks.import_time --base /path/to/other/checkout [--runs 21]

Times two commands as whole processes, each run once with this checkout's code and once
with `--base`'s (PYTHONPATH set to each checkout's root, the same interpreter), in turn
(A B, B A, A B, ...) after one warm-up each: `from sqla_queue import Registry, enqueue` (an
enqueue-only process) and `python -m sqla_queue --help` (the `sqla-queue --help` command).
Prints each side's median CPU time (user + system) and wall time, the ratio of the medians
and the median of the pair-by-pair ratios (this checkout / base), and how many modules
each side imports.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
"""This checkout's root."""

COMMANDS = {
    "from sqla_queue import Registry, enqueue": ["-c", "from sqla_queue import Registry, enqueue"],
    "sqla-queue --help": ["-m", "sqla_queue", "--help"],
}
"""Each timed command: its name, the interpreter's arguments."""
LOADED = {
    "from sqla_queue import Registry, enqueue": "from sqla_queue import Registry, enqueue",
    "sqla-queue --help": "from click.testing import CliRunner\n"
    "from sqla_queue.cli import main\n"
    "CliRunner().invoke(main, ['--help'])",
}
"""The same, as statements whose imported modules are counted."""


def environment(root: Path) -> dict[str, str]:
    """The children's environment: `root`'s sqla_queue first on the path, and bytecode
    written (the warm-up writes it), as an installed package has it: without it every
    import compiles its module's source, which is not what a process pays."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(python: str, root: Path, args: list[str]) -> tuple[float, float]:
    """One process's wall time and CPU time (user + system) in seconds, with `root`'s
    sqla_queue. On a shared, loaded machine the CPU time is the steadier figure."""
    env = environment(root)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([python, *args], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def modules(python: str, root: Path, statement: str) -> tuple[int, int]:
    """How many modules, and how many of sqla_queue's, `statement` leaves imported."""
    code = (
        f"import sys\n{statement}\n"
        "print(len(sys.modules), sum(m.startswith('sqla_queue') for m in sys.modules))"
    )
    env = environment(root)
    out = subprocess.run([python, "-c", code], env=env, check=True, capture_output=True).stdout
    total, ours = out.split()
    return int(total), int(ours)


def origin(python: str, root: Path) -> str:
    code = "import sqla_queue; print(sqla_queue.__file__)"
    env = environment(root)
    return subprocess.run(
        [python, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout's root")
    parser.add_argument("--head", type=Path, default=HERE, help="this checkout (default: here)")
    parser.add_argument("--runs", type=int, default=21, help="counted runs of each side")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to time")
    options = parser.parse_args()
    head, base = options.head.resolve(), options.base.resolve()
    for root in (head, base):
        found = origin(options.python, root)
        if not found.startswith(str(root)):
            sys.exit(f"{root}: sqla_queue is imported from {found}, not from the checkout")
    print(f"head: {head}\nbase: {base}\npython: {options.python}, {options.runs} runs a side\n")
    print(
        "| command | figure | head median | base median | head / base: ratio of medians "
        "| pairwise ratios: median (min-max) |"
    )
    print("|---|---|---|---|---|---|")
    counts = []
    for name, args in COMMANDS.items():
        run(options.python, head, args)  # warm-up: bytecode written, files cached
        run(options.python, base, args)
        heads: list[tuple[float, float]] = []
        bases: list[tuple[float, float]] = []
        for i in range(options.runs):
            order = [(head, heads), (base, bases)]
            for root, times in order if i % 2 == 0 else order[::-1]:
                times.append(run(options.python, root, args))
        for figure, index in (("cpu", 1), ("wall", 0)):
            h = [t[index] for t in heads]
            b = [t[index] for t in bases]
            ratios = [x / y for x, y in zip(h, b, strict=True)]
            print(
                f"| `{name}` | {figure} | {statistics.median(h):.3f} s "
                f"| {statistics.median(b):.3f} s "
                f"| {statistics.median(h) / statistics.median(b):.2f} "
                f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
            )
        loaded = LOADED[name]
        counts.append(
            (name, modules(options.python, head, loaded), modules(options.python, base, loaded))
        )
    print("\n| command | modules imported, head (sqla_queue's) | base (sqla_queue's) |")
    print("|---|---|---|")
    for name, (head_total, head_ours), (base_total, base_ours) in counts:
        print(f"| `{name}` | {head_total} ({head_ours}) | {base_total} ({base_ours}) |")


if __name__ == "__main__":
    main()
