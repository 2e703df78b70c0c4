"""The table of feature pairs (tests/system/pairs.toml) is complete and names only tests that exist:
every unordered pair of its features has one cell, and each cell names tests (the pair
together), a refusal and its test, or why the pair cannot occur.
No database: the test files are read with `ast`, not collected."""

from __future__ import annotations

import ast
import itertools
from functools import cache
from pathlib import Path
from typing import Any

import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
TABLE = Path(__file__).with_name("pairs.toml")
KINDS = {"test", "refused", "cannot"}
MATRIX = (
    "tests/system/test_features_meet.py"
    "::test_each_kind_of_job_keeps_its_rule_through_each_run_feature"
)
"""Its cases are `KIND-OTHER` (test_features_meet.CASES), checked by name too."""


def load_table() -> dict[str, Any]:
    with TABLE.open("rb") as f:
        return tomllib.load(f)


@cache
def names_of_tests(path: Path) -> frozenset[str]:
    """`name` and `Class::name` of every test function in the file at `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}::")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                found.add(prefix + node.name)

    visit(tree.body, "")
    return frozenset(found)


def missing_test(test_id: str) -> str | None:
    """Why `tests/<folder>/test_x.py::[Class::]name[params]` names no test (None: it names one)."""
    path, _, name = test_id.partition("::")
    if not name:
        return f"{test_id!r} is not file::test"
    file = REPO_ROOT / path
    if not (path.startswith("tests/") and file.is_file()):
        return f"{test_id!r}: no file {path}"
    function, _, case = name.partition("[")
    if function not in names_of_tests(file):
        return f"{test_id!r}: no test {function} in {path}"
    if case and function == MATRIX.split("::")[1]:
        from system.test_features_meet import CASES

        if case.rstrip("]") not in {f"{a}-{b}" for a, b in CASES}:
            return f"{test_id!r}: no case {case.rstrip(']')} in {path}"
    return None


def cell_problems(pair: str, cell: object) -> list[str]:
    if not isinstance(cell, dict) or not cell:
        return [f"{pair}: an empty cell"]
    unknown = set(cell) - KINDS
    if unknown:
        return [f"{pair}: unknown keys {sorted(unknown)}; a cell has {sorted(KINDS)}"]
    problems = []
    said = [kind for kind in ("refused", "cannot") if kind in cell]
    if len(said) > 1:
        problems.append(f"{pair}: {' and '.join(said)} in one cell")
    for kind in said:
        if not isinstance(cell[kind], str) or not cell[kind].strip():
            problems.append(f"{pair}: {kind} must say why, in words")
    tests = cell.get("test")
    if "cannot" in cell and tests is not None:
        problems.append(f"{pair}: a pair that cannot occur names no test")
    elif "cannot" not in cell:
        if not isinstance(tests, list) or not tests:
            problems.append(f"{pair}: test must be a list of one or more tests")
        else:
            problems += [f"{pair}: {why}" for t in tests if (why := missing_test(t))]
    return problems


def table_problems(table: dict[str, Any]) -> list[str]:
    features = list(table.get("features", {}))
    pairs = table.get("pairs", {})
    problems = []
    for row, cells in pairs.items():
        for column in cells:
            if row not in features or column not in features:
                problems.append(f"{row} x {column}: not two features of [features]")
            elif features.index(row) >= features.index(column):
                problems.append(f"{row} x {column}: write it [pairs.{column}.{row}]")
    for row, column in itertools.combinations(features, 2):
        cell = pairs.get(row, {}).get(column)
        if cell is None:
            problems.append(f"{row} x {column}: no cell [pairs.{row}.{column}]")
        else:
            problems += cell_problems(f"{row} x {column}", cell)
    return problems


def test_every_pair_of_features_has_a_cell_naming_tests_that_exist() -> None:
    table = load_table()
    assert len(table["features"]) >= 20
    assert table_problems(table) == []


def test_the_check_finds_a_missing_cell_an_empty_one_and_a_test_that_does_not_exist() -> None:
    here = (
        "tests/system/test_pairs.py::test_every_pair_of_features_has_a_cell_naming_tests_that_exist"
    )
    table = {
        "features": {"a": "", "b": "", "c": ""},
        "pairs": {
            "a": {"b": {"test": [here, "tests/system/test_pairs.py::test_nothing_of_the_kind[x]"]}},
            "c": {"b": {}},
        },
    }
    assert table_problems(table) == [
        "c x b: write it [pairs.b.c]",
        "a x b: 'tests/system/test_pairs.py::test_nothing_of_the_kind[x]': "
        "no test test_nothing_of_the_kind in tests/system/test_pairs.py",
        "a x c: no cell [pairs.a.c]",
        "b x c: no cell [pairs.b.c]",
    ]
    assert cell_problems("p", {"refused": "x"}) == ["p: test must be a list of one or more tests"]
    assert cell_problems("p", {"cannot": " "}) == ["p: cannot must say why, in words"]
    assert cell_problems("p", {"open": "issue 33 defect 3"}) == [  # a known defect is no cell
        "p: unknown keys ['open']; a cell has ['cannot', 'refused', 'test']"
    ]
    assert cell_problems("p", {"cannot": "x", "test": [here]}) == [
        "p: a pair that cannot occur names no test"
    ]
    assert cell_problems("p", {"todo": "later"}) == [
        "p: unknown keys ['todo']; a cell has ['cannot', 'refused', 'test']"
    ]


def test_a_class_method_and_a_parametrized_case_are_found(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text(
        "class TestA:\n    def test_m(self): ...\n    def helper(self): ...\n"
        "async def test_f(): ...\n"
    )
    assert names_of_tests(module) == {"TestA::test_m", "test_f"}
    assert "no file" in str(missing_test("tests/test_nowhere.py::test_x"))
    assert missing_test(MATRIX + "[unique-retry]") is None
    assert "no case retry-unique" in str(missing_test(MATRIX + "[retry-unique]"))
