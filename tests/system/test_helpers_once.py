"""A helper lives in one file: no top-level function of tests/ (other than a test, a fixture,
a pytest hook or a task handler of a test app) is defined in two files. Shared helpers go to
tests/helpers/ (or tests/conftest.py when they are fixtures), where every test file imports
them. No database: the files are read with `ast`."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]


def _is_exempt(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A test, a pytest hook, a fixture, or a task handler (`@registry.task(...)`): the name is
    the framework's or the task's, not a helper's."""
    if node.name.startswith(("test", "pytest_")):
        return True
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("fixture", "task"):
            return True
    return False


def defined_twice(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """{helper name: the files defining it} for each top-level helper defined in two or more
    of `sources` ({file: its text})."""
    where: dict[str, list[str]] = defaultdict(list)
    for path, text in sorted(sources.items()):
        for node in ast.parse(text, filename=path).body:
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and not _is_exempt(node):
                where[node.name].append(path)
    return {name: files for name, files in sorted(where.items()) if len(files) > 1}


def test_no_helper_is_defined_in_two_test_files() -> None:
    sources = {
        str(path.relative_to(TESTS_DIR.parent)): path.read_text()
        for path in TESTS_DIR.rglob("*.py")
    }
    assert len(sources) > 100  # the whole of tests/, not an empty glob
    twice = defined_twice(sources)
    assert not twice, "helpers defined in more than one file (move each to tests/helpers/):\n" + (
        "\n".join(f"  {name}: {', '.join(files)}" for name, files in twice.items())
    )


def test_the_check_sees_a_copied_helper_and_passes_tests_fixtures_and_tasks() -> None:
    helper = "def count_jobs(engine):\n    return 0\n"
    exempt = (
        "import pytest\n"
        "def test_x():\n    pass\n"
        "@pytest.fixture\ndef engine():\n    pass\n"
        "@registry.task(name='ok')\ndef ok():\n    pass\n"
        "def pytest_configure(config):\n    pass\n"
    )
    sources = {"tests/a/test_a.py": helper + exempt, "tests/b/test_b.py": helper + exempt}
    assert defined_twice(sources) == {"count_jobs": ["tests/a/test_a.py", "tests/b/test_b.py"]}
    assert defined_twice({"tests/a/test_a.py": helper, "tests/b/test_b.py": exempt}) == {}
