"""Sections measured by modules that may or may not be in this tree.

Each entry names a module of `benchmarks/` and how to call it (`call(module, db, plan, say)
-> dict`, JSON-ready). When the module is absent, the run records the section as not measured
and BENCHMARKS.md says so; when it is present, its figures are shown. Wiring in a new module
is one entry here.

An entry may also give `targets(result) -> list[dict]`: rows of the target table, each with
`name`, `target`, `measured`, `met` (True/False/None) and `limited_by`; a row whose `name` is
one of the placeholders in `report.ISSUE13` replaces that placeholder. Without it, a module's
own `targets(result)` is used if it has one; likewise `markdown(result) -> str` for its section
of BENCHMARKS.md (else a generic table of its figures).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

Say = Callable[[str], None]


def _call_run(module: ModuleType, db: Any, plan: Any, say: Say) -> dict[str, Any]:
    return dict(module.run(db, plan, say))


@dataclass(frozen=True)
class Section:
    name: str
    """Key under results["scenarios"]."""
    module: str
    title: str
    what: str
    """What it measures, for the "not measured" line."""
    call: Callable[[ModuleType, Any, Any, Say], dict[str, Any]] = _call_run
    targets: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None

    def present(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:
            return False

    def run(self, db: Any, plan: Any, say: Say) -> dict[str, Any]:
        if not self.present():
            return {"available": False, "reason": f"{self.module} is not in this tree"}
        try:
            result = dict(self.call(importlib.import_module(self.module), db, plan, say))
        except Exception as exc:  # one section failing must not lose the whole run
            return {"available": False, "reason": f"failed: {type(exc).__name__}: {exc}"}
        result.setdefault("available", True)
        return result

    def hook(self, name: str) -> Callable[..., Any] | None:
        if name == "targets" and self.targets is not None:
            return self.targets
        if not self.present():
            return None
        return getattr(importlib.import_module(self.module), name, None)


# -- enqueue_paths (helper "enqueue"): run(url, only, repeats, quick) -> dict ---------------


def _enqueue_paths(module: ModuleType, db: Any, plan: Any, say: Say) -> dict[str, Any]:
    result = dict(module.run(db.url, repeats=max(3, plan.repeat), quick=plan.is_quick))
    for key in ("business_tx", "core_enqueue", "bulk_fk", "bulk_no_fk"):
        if key in result:
            say(f"enqueue_paths {key}: ratio {result[key]['ratio']:.2f}x")
    db.reset_jobs()
    return result


def _pair(res: dict[str, Any], ours: str, base: str, unit: str) -> str:
    low, high = res.get("ratio_range", [None, None])
    spread = f", pairs {low:.2f}-{high:.2f}x" if low is not None else ""
    return (
        f"{res[ours]['median']:,.0f} vs {res[base]['median']:,.0f} {unit} = "
        f"{res['ratio']:.2f}x{spread}"
    )


def _enqueue_paths_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    if "business_tx" in result:
        r = result["business_tx"]
        rows.append(
            {
                "name": "t1_business_tx",
                "measured": _pair(r, "with", "without", "tx/s")
                + f"; the job costs {r['job_cost']:.0%}",
                "met": r["job_cost"] <= 0.15,
            }
        )
    for key, name in (
        ("core_enqueue", "t1_core"),
        ("bulk_fk", "t2_bulk_fk"),
        ("bulk_no_fk", "t2_bulk_nofk"),
    ):
        if key in result:
            r = result[key]
            ours, base = ("core", "raw") if key == "core_enqueue" else ("enqueue_many", "raw_copy")
            rows.append(
                {
                    "name": name,
                    "measured": _pair(r, ours, base, "jobs/s"),
                    "met": r["ratio"] >= 0.8,
                }
            )
    return rows


# -- limits and results_wait (helper "flow"): functions of (db, ...) -> dict -----------------


def _limits(module: ModuleType, db: Any, plan: Any, say: Say) -> dict[str, Any]:
    cost = dict(module.limit_cost(db, jobs=plan.drain_jobs, repeat=max(2, plan.repeat)))
    say(f"limits: a limit that never binds costs {1 - cost['ratio']:.0%} of the drain")
    bound = dict(module.binding_limit(db))
    say(f"limits: a binding limit of {bound['limit']} drains at {bound['share_of_limit']:.2f}x")
    db.reset_jobs()
    return {"limit_cost": cost, "binding_limit": bound}


def _results_wait(module: ModuleType, db: Any, plan: Any, say: Say) -> dict[str, Any]:
    result = dict(module.measure(db))
    say(f"wait_for: p50 {result['p50']:.1f} ms, p99 {result['p99']:.1f} ms")
    db.reset_jobs()
    return result


SECTIONS = (
    Section(
        name="enqueue_paths",
        module="benchmarks.enqueue_paths",
        title="Enqueue paths",
        what="an ORM transaction with and without enqueue(), Core enqueue vs a raw INSERT "
        "loop, enqueue_many vs a raw COPY with and without the queue FK",
        call=_enqueue_paths,
        targets=_enqueue_paths_targets,
    ),
    Section(
        name="limits",
        module="benchmarks.limits",
        title="Drain with a concurrency limit (issue 10)",
        what="drain with a queue concurrency limit vs unlimited",
        call=_limits,
    ),
    Section(
        name="workflows",
        module="benchmarks.workflows",
        title="Workflows (issue 23)",
        what="a fan-out/fan-in and a chain of dependent jobs drained by real worker processes, "
        "dependent pairs against independent jobs, and the triggers' cost for plain jobs",
    ),
    Section(
        name="results_wait",
        module="benchmarks.results_wait",
        title="wait_for: finish to wake-up (issue 10)",
        what="wait_for's latency from a finishing commit to its return, 100 jobs, 10 threads",
        call=_results_wait,
    ),
    Section(
        name="hot_path",
        module="benchmarks.hot_path",
        title="Issue 39: what a plain job pays, the drain's CPU per job, enqueue's price",
        what="plain-job COPY and INSERT against a minimal table with each index's and "
        "trigger's share, drains of jobs enqueued just before by one and two worker processes "
        "with the worker's and the server's CPU per job, enqueue() against a hand-written "
        "INSERT and enqueue_many against a raw COPY",
    ),
)
