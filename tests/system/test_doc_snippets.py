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
the blocks above it did. A page that builds on another's project says so on a line of its
own, anywhere in the page:

    <!-- docs: after: getting-started.md -->   that page's blocks act first (its own
                                                `after` first), then this page's

Those pages are run once per module and their project and database copied for each page
that builds on them. Afterwards no job may have failed as an unknown task (a page whose
task names drift).
docs/ is the manual's single source: no page includes README.md (`--8<--`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from helpers.support import REPO_ROOT
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from sqla_queue import normalize_url
from sqla_queue.cli import main as cli_main
from sqla_queue.testing import TemplateDatabases

README = REPO_ROOT / "README.md"
DOCUMENTS = [README, *sorted((REPO_ROOT / "docs").glob("**/*.md"))]
RUNNABLE = {"bash", "python"}

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_AFTER = re.compile(r"^<!--\s*(?:readme|docs):\s*after:\s*(?P<page>\S+?)\s*-->$", re.MULTILINE)
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


def prerequisites(path: Path) -> list[Path]:
    """The pages whose blocks act before this page's, in order (theirs first)."""
    found: list[Path] = []
    for name in _AFTER.findall(path.read_text()):
        page = (path.parent / name).resolve()
        assert page.is_file(), f"{_name(path)}: after: {name} is no page"
        assert page != path.resolve(), f"{_name(path)}: after: names the page itself"
        for earlier in [*prerequisites(page), page]:
            if earlier not in found:
                found.append(earlier)
    return found


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


@pytest.mark.parametrize("page", DOCUMENTS[1:], ids=_name)
def test_no_page_includes_the_readme(page: Path) -> None:
    assert "--8<--" not in page.read_text(), f"{_name(page)}: the docs are the single source"


def test_the_readme_stays_a_front_page() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_and_getting_started_run_their_blocks() -> None:
    assert {README, REPO_ROOT / "docs" / "getting-started.md"} <= set(RUN_PAGES)


@pytest.mark.parametrize("page", DOCUMENTS, ids=_name)
def test_every_page_with_blocks_to_run_or_build_on_runs_them(page: Path) -> None:
    """A page whose blocks are all `file`, or that only builds on another, is run too."""
    acts = any(b.kind in ("run", "file") for b in page_blocks(page))
    assert not acts or page in RUN_PAGES, f"{_name(page)} writes files but runs nothing"
    for earlier in prerequisites(page):
        assert earlier in RUN_PAGES, f"{_name(page)} builds on {_name(earlier)}, which runs nothing"


def _page_env(database_url: str, admin_url: str) -> dict[str, str]:
    """The scratch project's environment: the checkout's commands first on PATH."""
    # The URL as a user has it (postgresql://): the pages' code must cope with it.
    plain_url = make_url(database_url).set(drivername="postgresql")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SQLA_QUEUE")}
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["SQLA_QUEUE_DATABASE_URL"] = plain_url.render_as_string(hide_password=False)
    env["SQLA_QUEUE_TEST_DATABASE_URL"] = admin_url
    return env


class BuiltPages:
    """The project and database a page's `after:` pages leave, built once per module and
    copied for each page that builds on them (a page's own blocks never see another's)."""

    def __init__(self, databases: TemplateDatabases, admin_url: str, folders: Path) -> None:
        self.databases = databases
        self.admin_url = admin_url
        self.folders = folders
        self.built: dict[tuple[Path, ...], tuple[str, Path]] = {}

    def copy_into(self, pages: list[Path], database_url: str, project: Path) -> None:
        source_url, source_project = self.built.get(tuple(pages)) or self._build(pages)
        shutil.copytree(source_project, project, dirs_exist_ok=True)
        target, source = make_url(database_url).database, make_url(source_url).database
        admin = create_engine(normalize_url(self.admin_url), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE "{target}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{target}" TEMPLATE "{source}"'))
        finally:
            admin.dispose()

    def _build(self, pages: list[Path]) -> tuple[str, Path]:
        url = self.databases.create_empty()
        project = self.folders / f"built_{len(self.built)}"
        project.mkdir()
        env = _page_env(url, self.admin_url)
        for block in [block for page in pages for block in page_blocks(page)]:
            _act(block, project, env)
        self.built[tuple(pages)] = (url, project)
        return url, project

    def drop(self) -> None:
        for url, _ in self.built.values():
            self.databases.drop(url)


@pytest.fixture(scope="module")
def built_pages(
    databases: TemplateDatabases, admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BuiltPages]:
    built = BuiltPages(databases, admin_url, tmp_path_factory.mktemp("built_pages"))
    yield built
    built.drop()


@pytest.mark.parametrize("page", RUN_PAGES, ids=_name)
def test_page_runs_as_written(
    page: Path, tmp_path: Path, empty_database_url: str, admin_url: str, built_pages: BuiltPages
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    earlier = prerequisites(page)
    if earlier:
        built_pages.copy_into(earlier, empty_database_url, project)
    env = _page_env(empty_database_url, admin_url)

    ran = sum(_act(block, project, env) for block in page_blocks(page))
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


def _act(block: Block, project: Path, env: dict[str, str]) -> int:
    """Do what the block's marker says in the scratch project; 1 if it ran."""
    if block.kind == "file":
        assert block.arg
        target = project / block.arg
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text)
        return 0
    if block.kind != "run":
        return 0
    if block.lang == "python":
        script = project / f"{block.path.stem}_block_line_{block.line}.py"
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
    return 1


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    found = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
        elif not command.hidden:
            found.append((" ".join(("sqla-queue", *path, name)), command))
    return found


def test_the_cli_reference_names_every_command_and_option() -> None:
    """docs/cli.md has a section per command, naming each of its options (hidden ones,
    such as an old spelling kept for a release, aside)."""
    reference = (REPO_ROOT / "docs" / "cli.md").read_text()
    sections = dict(
        re.findall(r"^## `(sqla-queue[^`]*)`\n(.*?)(?=^## |\Z)", reference, re.M | re.S)
    )
    missing = []
    for name, command in _commands(cli_main):
        if name not in sections:
            missing.append(f"{name}: no section")
            continue
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for option in param.opts + param.secondary_opts:
                    if option != "--database-url" and f"`{option}`" not in sections[name]:
                        missing.append(f"{name}: {option}")
    assert missing == []
    assert set(sections) == {name for name, _ in _commands(cli_main)}
