"""README.md and the docs site (docs/**/*.md) work as written: every code block is marked,
and the marked ones run.

The convention (for anyone adding a block): the line above each fenced block (blank lines
between are allowed) is one HTML comment that says what the test does with it (`docs:`
may stand for `readme:`, which reads better in a page of docs/):

    <!-- readme: run -->                   run it: ```bash with `bash -euo pipefail`,
                                            ```python as a script in the scratch project
    <!-- readme: run; expect: TEXT -->     run it, and its output must contain TEXT
    <!-- readme: file: shop/tasks.py -->   write it to that path of the scratch project
    <!-- readme: skip: REASON -->          not run; the reason (what tests it instead) is
                                            required: keep these few

Each page is a session of its own: its `file` and `run` blocks act in page order on one
scratch project (an empty folder, the checkout's `sqla-queue`, `python` and `pytest` first
on PATH) and one fresh database with no schema, given as SQLA_QUEUE_DATABASE_URL (and the
suite's server as SQLA_QUEUE_TEST_DATABASE_URL, for the pytest plugin); a block sees what
the blocks above it did. Afterwards no job may have failed as an unknown task (a page
whose task names drift). A docs page that includes a README section (`--8<--`) has its
blocks tested here as the README's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from apps.support import REPO_ROOT
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

README = REPO_ROOT / "README.md"
DOCUMENTS = [README, *sorted((REPO_ROOT / "docs").glob("**/*.md"))]
RUNNABLE = {"bash", "python"}

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_DIRECTIVE = re.compile(
    r"^<!--\s*(?:readme|docs):\s*(?P<kind>run|file|skip)\s*(?::\s*(?P<arg>.*?))?"
    r"\s*(?:;\s*expect:\s*(?P<expect>.*?))?\s*-->$"
)


@dataclass
class Block:
    """One fenced block of a page, with its marker."""

    path: Path
    line: int
    lang: str
    text: str
    kind: str | None
    arg: str | None
    expect: str | None

    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)} line {self.line} (```{self.lang})"


def page_blocks(path: Path) -> list[Block]:
    """Every fenced block, dedented to its fence, with the marker above it (if any)."""
    lines = path.read_text().splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        indent = len(fence["indent"])
        body = "".join(line[indent:] + "\n" for line in lines[index + 1 : end])
        above = index - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        marker = _DIRECTIVE.match(lines[above].strip()) if above >= 0 else None
        blocks.append(
            Block(
                path=path,
                line=index + 1,
                lang=fence["lang"],
                text=body,
                kind=marker["kind"] if marker else None,
                arg=marker["arg"] if marker else None,
                expect=marker["expect"] if marker else None,
            )
        )
        index = end + 1
    return blocks


def _name(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


RUN_PAGES = [path for path in DOCUMENTS if any(b.kind == "run" for b in page_blocks(path))]


@pytest.mark.parametrize("page", DOCUMENTS, ids=_name)
def test_every_block_is_marked_run_file_or_skip_with_a_reason(page: Path) -> None:
    problems = []
    for block in page_blocks(page):
        if block.kind is None:
            problems.append(f"{block.where()}: no <!-- readme: run|file: PATH|skip: REASON -->")
        elif block.kind == "skip" and not block.arg:
            problems.append(f"{block.where()}: skip needs a reason")
        elif block.kind == "file" and not block.arg:
            problems.append(f"{block.where()}: file needs a path")
        elif block.kind == "run" and block.lang not in RUNNABLE:
            problems.append(f"{block.where()}: only {sorted(RUNNABLE)} blocks can run")
    assert problems == []


_INCLUDE = re.compile(r'^--8<-- "README\.md:(?P<section>[\w-]+)"$', re.MULTILINE)


@pytest.mark.parametrize("page", DOCUMENTS[1:], ids=_name)
def test_every_readme_section_a_page_includes_is_marked_in_the_readme(page: Path) -> None:
    readme = README.read_text()
    for section in _INCLUDE.findall(page.read_text()):
        start = readme.find(f"<!-- --8<-- [start:{section}] -->")
        end = readme.find(f"<!-- --8<-- [end:{section}] -->")
        assert 0 <= start < end, f"{_name(page)} includes README.md:{section}, not marked there"


def test_the_readme_and_getting_started_run_their_blocks() -> None:
    assert {README, REPO_ROOT / "docs" / "getting-started.md"} <= set(RUN_PAGES)


@pytest.mark.parametrize("page", RUN_PAGES, ids=_name)
def test_page_runs_as_written(
    page: Path, tmp_path: Path, empty_database_url: str, admin_url: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # The URL as a user has it (postgresql://): the README's code must cope with it.
    plain_url = make_url(empty_database_url).set(drivername="postgresql")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SQLA_QUEUE")}
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["SQLA_QUEUE_DATABASE_URL"] = plain_url.render_as_string(hide_password=False)
    env["SQLA_QUEUE_TEST_DATABASE_URL"] = admin_url

    ran = 0
    for block in page_blocks(page):
        if block.kind == "file":
            assert block.arg
            target = project / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        elif block.kind == "run":
            if block.lang == "python":
                script = project / f"{page.stem}_block_line_{block.line}.py"
                script.write_text(block.text)
                command = [sys.executable, str(script)]
            else:
                command = ["bash", "-euo", "pipefail", "-c", block.text]
            done = subprocess.run(
                command, cwd=project, env=env, capture_output=True, text=True, timeout=180
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"{block.where()} failed:\n{block.text}\n{output}"
            if block.expect:
                assert block.expect in output, f"{block.where()}: no {block.expect!r} in\n{output}"
            ran += 1
    assert ran >= 1

    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            assert inspect(conn).has_table("jobs", "sqla_queue")
            unknown = conn.scalar(
                text("SELECT count(*) FROM sqla_queue.jobs WHERE last_error LIKE '%unknown task%'")
            )
    finally:
        engine.dispose()
    assert unknown == 0
