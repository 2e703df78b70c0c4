"""No module of `sqla_queue` takes an underscore name from another one (issue 34): a name
another module needs is public in the module that owns it.

Counted: `from sqla_queue.x import _name` (absolute or relative, at any depth of the file),
and `x._name` where `x` is a `sqla_queue` module the file imported (`import sqla_queue.x as
x`, `from sqla_queue import x`). Dunder names are fine; so is a module's own underscore names,
and the migrations (package data). Tests may use the code's private names: they test
internals. No database: the files are read with `ast`, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "sqla_queue"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE
LEFT_OUT = ("migrations",)
"""Folders of the package that are not its code."""


def module_name(path: Path) -> str:
    """`sqla_queue.db.queries.claim` of `sqla_queue/db/queries/claim.py` (a package: its
    `__init__.py`'s folder)."""
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` of `module` names, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def borrowed_names(module: str, is_package: bool, source: str) -> list[str]:
    """Each underscore name the module `module` (of text `source`) takes from another module
    of the package, as `module:line: from other import _name` or `module:line: alias._name
    (other)`."""
    tree = ast.parse(source)
    found: list[str] = []
    modules: dict[str, str] = {}
    """Local names bound to a module of the package (or a name imported from one, which
    may be a module: `from sqla_queue.db import queries`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = imported_from(node, module, is_package)
            if not is_ours(origin):
                continue
            for alias in node.names:
                if is_private(alias.name) and origin != module:
                    found.append(f"{module}:{node.lineno}: from {origin} import {alias.name}")
                elif not is_private(alias.name):
                    modules[alias.asname or alias.name] = f"{origin}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if is_ours(alias.name):
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else local
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        chain: list[str] = []
        value = node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in modules:
            used = ".".join([value.id, *reversed(chain), node.attr])
            found.append(f"{module}:{node.lineno}: {used} ({modules[value.id]})")
    return found


def package_files() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE_DIR.rglob("*.py")
        if not set(path.relative_to(PACKAGE_DIR).parts) & set(LEFT_OUT)
    )


def test_no_module_imports_an_underscore_name_of_another() -> None:
    borrowed = [
        line
        for path in package_files()
        for line in borrowed_names(module_name(path), path.name == "__init__.py", path.read_text())
    ]
    assert not borrowed, (
        "underscore names taken from another module (make each public in the module that "
        "owns it, or move it to the module whose role it is):\n" + "\n".join(borrowed)
    )


def test_the_walk_finds_each_kind_of_borrowing() -> None:
    """The check itself: each form it counts is found, and what is allowed is not."""
    source = "\n".join(
        [
            "from sqla_queue.db.queries.common import _is, jobs",
            "from .claim import _text",
            "from . import claim",
            "from sqla_queue.db import queries",
            "import sqla_queue.db.queries.common as common",
            "from sqla_queue.db.queries.common import __all__",
            "from collections import _private_of_stdlib",
            "from .probe import _own",
            "def f():",
            "    from sqla_queue.enqueue.inserts.params import _BIND",
            "    return claim._ONE, queries.claim._alias, common._seconds, common.__name__",
            "_own = 1",
        ]
    )
    assert borrowed_names("sqla_queue.db.queries.probe", False, source) == [
        "sqla_queue.db.queries.probe:1: from sqla_queue.db.queries.common import _is",
        "sqla_queue.db.queries.probe:2: from sqla_queue.db.queries.claim import _text",
        "sqla_queue.db.queries.probe:10: from sqla_queue.enqueue.inserts.params import _BIND",
        "sqla_queue.db.queries.probe:11: claim._ONE (sqla_queue.db.queries.claim)",
        "sqla_queue.db.queries.probe:11: queries.claim._alias (sqla_queue.db.queries)",
        "sqla_queue.db.queries.probe:11: common._seconds (sqla_queue.db.queries.common)",
    ]
    package = "from .queries.claim import _text\nfrom . import _own\n"
    assert borrowed_names("sqla_queue.db", True, package) == [
        "sqla_queue.db:1: from sqla_queue.db.queries.claim import _text",
    ]
