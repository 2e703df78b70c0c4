"""CONTRIBUTING.md's layout table is the tree: every package and module of `sqla_queue/` has a
row (the Alembic revisions aside, listed as their folders), every row names a path that
exists, and its list of layers is the import-linter contract's. A module added, moved or
deleted without its row fails here, naming the row to write or remove. No database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "sqla_queue"
CONTRIBUTING = REPO_ROOT / "CONTRIBUTING.md"
REVISION_FOLDERS = ("sqla_queue/migrations/versions", "sqla_queue/migrations/optional")
"""Folders of Alembic revisions: each has one row, not one per revision."""

_FIRST_CELL = re.compile(r"^\|\s*(?P<cell>[^|]*?)\s*\|")
_PATH = re.compile(r"`([^`]+)`")


def layout_section() -> str:
    """CONTRIBUTING.md's `## Layout` section, up to the next `## ` heading."""
    text = CONTRIBUTING.read_text()
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def table_paths() -> list[str]:
    """The paths the layout tables' rows name: each backticked name of a row's first cell
    (`sqla_queue/job/` for a folder, `sqla_queue/job/run.py` for a module)."""
    paths = []
    for line in layout_section().splitlines():
        row = _FIRST_CELL.match(line)
        if row:
            paths += _PATH.findall(row["cell"])
    return paths


def _relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix() + ("/" if path.is_dir() else "")


def _skipped(path: Path) -> bool:
    name = path.relative_to(REPO_ROOT).as_posix()
    return "__pycache__" in path.parts or any(name.startswith(f"{f}/") for f in REVISION_FOLDERS)


def required_paths() -> set[str]:
    """What must have a row: every top-level entry of the package; every package (a folder
    with `__init__.py`, whose row stands for it) and every other module below."""
    wanted = {_relative(entry) for entry in PACKAGE.iterdir() if entry.name != "__pycache__"}
    for init in PACKAGE.rglob("__init__.py"):
        if not _skipped(init) and init.parent != PACKAGE:
            wanted.add(_relative(init.parent))
    for module in PACKAGE.rglob("*.py"):
        if not _skipped(module) and module.name != "__init__.py" and module.parent != PACKAGE:
            wanted.add(_relative(module))
    return wanted


def test_every_package_and_module_has_a_row() -> None:
    missing = sorted(required_paths() - set(table_paths()))
    assert not missing, (
        "CONTRIBUTING.md's layout table has no row for "
        + ", ".join(missing)
        + ": add one per path (`| `path` | its role, in one line |`) under its layer"
    )


def test_every_row_names_a_path_that_exists() -> None:
    gone = [
        path
        for path in table_paths()
        if not (REPO_ROOT / path).exists() or path.endswith("/") != (REPO_ROOT / path).is_dir()
    ]
    assert not gone, (
        "CONTRIBUTING.md's layout table names "
        + ", ".join(gone)
        + ", which the tree does not have (moved or deleted?): update or remove the row"
    )


def test_no_path_has_two_rows() -> None:
    paths = table_paths()
    assert len(paths) == len(set(paths)), sorted({p for p in paths if paths.count(p) > 1})


def test_the_layers_listed_are_the_import_linter_contracts() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is new in Python 3.11")
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    block = re.search(r"### Layers\n.*?```text\n(?P<body>.*?)```", layout_section(), re.DOTALL)
    assert block, "CONTRIBUTING.md's layout section has no ```text block of the layers"
    assert block["body"].splitlines() == layers, (
        "CONTRIBUTING.md lists the layers as\n"
        + block["body"]
        + "but pyproject.toml's layers contract says\n"
        + "\n".join(layers)
    )
