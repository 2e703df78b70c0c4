"""README.md works as written: every code block is marked, and the marked ones run.

The convention (for anyone adding a block): the line above each fenced block (blank lines
between are allowed) is one HTML comment that says what the test does with it:

    <!-- readme: run -->                   run it: ```bash with `bash -euo pipefail`,
                                            ```python as a script in the scratch project
    <!-- readme: run; expect: TEXT -->     run it, and its output must contain TEXT
    <!-- readme: file: shop/tasks.py -->   write it to that path of the scratch project
    <!-- readme: skip: REASON -->          not run; the reason (what tests it instead) is
                                            required

All `file` and `run` blocks act in README order on one scratch project (an empty folder,
the checkout's `sqla-queue` and `python` first on PATH) and one fresh database with no
schema, given as SQLA_QUEUE_DATABASE_URL; a block sees what the blocks above it did.
Afterwards no job may have failed as an unknown task (a README whose task names drift).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from apps.support import REPO_ROOT
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

README = REPO_ROOT / "README.md"
RUNNABLE = {"bash", "python"}

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_DIRECTIVE = re.compile(
    r"^<!--\s*readme:\s*(?P<kind>run|file|skip)\s*(?::\s*(?P<arg>.*?))?"
    r"\s*(?:;\s*expect:\s*(?P<expect>.*?))?\s*-->$"
)


@dataclass
class Block:
    """One fenced block of the README, with its marker."""

    line: int
    lang: str
    text: str
    kind: str | None
    arg: str | None
    expect: str | None

    def where(self) -> str:
        return f"README.md line {self.line} (```{self.lang})"


def readme_blocks(path: Path = README) -> list[Block]:
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


def test_every_readme_block_is_marked_run_file_or_skip_with_a_reason() -> None:
    problems = []
    for block in readme_blocks():
        if block.kind is None:
            problems.append(f"{block.where()}: no <!-- readme: run|file: PATH|skip: REASON -->")
        elif block.kind == "skip" and not block.arg:
            problems.append(f"{block.where()}: skip needs a reason")
        elif block.kind == "file" and not block.arg:
            problems.append(f"{block.where()}: file needs a path")
        elif block.kind == "run" and block.lang not in RUNNABLE:
            problems.append(f"{block.where()}: only {sorted(RUNNABLE)} blocks can run")
    assert problems == []
    assert any(block.kind == "run" for block in readme_blocks())


def test_readme_runs_as_written_from_install_to_worker(
    tmp_path: Path, empty_database_url: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # The URL as a user has it (postgresql://): the README's code must cope with it.
    plain_url = make_url(empty_database_url).set(drivername="postgresql")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SQLA_QUEUE")}
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["SQLA_QUEUE_DATABASE_URL"] = plain_url.render_as_string(hide_password=False)

    ran = 0
    for block in readme_blocks():
        if block.kind == "file":
            assert block.arg
            target = project / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        elif block.kind == "run":
            if block.lang == "python":
                script = project / f"readme_block_line_{block.line}.py"
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
    assert ran >= 3

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
