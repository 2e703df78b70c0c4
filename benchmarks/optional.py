"""Sections measured by modules that may or may not be in this tree.

Each entry names a module of `benchmarks/` and its entry point `FUNCTION(db, plan, say) ->
dict` (JSON-ready). When the module is absent, the run records the section as not measured
and BENCHMARKS.md says so; when it is present, its figures are shown. Wiring in a new module
is one entry here (or a changed `function` name).

A module may also define:
- `targets(result) -> list[dict]`: rows of the target table, each with `name`, `target`,
  `measured`, `met` (True/False/None) and `limited_by`; a row whose `name` is one of the
  placeholders in `report.ISSUE13` replaces that placeholder;
- `markdown(result) -> str`: its section of BENCHMARKS.md (else a generic table of figures).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Section:
    name: str
    """Key under results["scenarios"]."""
    module: str
    function: str
    title: str
    what: str
    """What it measures, for the "not measured" line."""

    def present(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:
            return False

    def run(self, db: Any, plan: Any, say: Callable[[str], None]) -> dict[str, Any]:
        if not self.present():
            return {"available": False, "reason": f"{self.module} is not in this tree"}
        try:
            entry = getattr(importlib.import_module(self.module), self.function)
            result = dict(entry(db, plan, say))
        except Exception as exc:  # one section failing must not lose the whole run
            return {"available": False, "reason": f"failed: {type(exc).__name__}: {exc}"}
        result.setdefault("available", True)
        return result

    def hook(self, name: str) -> Callable[..., Any] | None:
        if not self.present():
            return None
        return getattr(importlib.import_module(self.module), name, None)  # type: ignore[no-any-return]


SECTIONS = (
    Section(
        name="enqueue_paths",
        module="benchmarks.enqueue_paths",
        function="run",
        title="Enqueue paths",
        what="an ORM transaction with and without enqueue(), Core enqueue vs a raw INSERT "
        "loop, enqueue_many vs a raw COPY with and without the queue FK",
    ),
    Section(
        name="limits",
        module="benchmarks.limits",
        function="run",
        title="Drain with a concurrency limit",
        what="drain with a queue concurrency limit vs unlimited",
    ),
)
