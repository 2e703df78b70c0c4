"""What importing sqla-queue costs and changes (issue 34): `import sqla_queue` installs no
listener on SQLAlchemy's `Session` or `Engine` (the first enqueue, `Registry()` or `Job(...)`
does), an enqueue-only process imports no runner, dashboard, CLI, Alembic or click, and
`sqla-queue --help` imports no command's module. Each in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import click
import pytest

import sqla_queue
from sqla_queue.cli import COMMANDS, main

LISTENERS = """
import json, sys, types
from sqlalchemy import Engine, event
from sqlalchemy.events import ConnectionEvents, DialectEvents
from sqlalchemy.orm import Session, SessionEvents

def events(cls):
    names = [name for name in vars(cls) if not name.startswith("_")]
    return [name for name in names if isinstance(vars(cls)[name], types.FunctionType)]

def ours():
    found = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("sqla_queue"):
            continue
        for value in list(vars(module).values()):
            if not isinstance(value, types.FunctionType):
                continue
            for target, names in (
                (Session, events(SessionEvents)),
                (Engine, events(ConnectionEvents) + events(DialectEvents)),
            ):
                for name in names:
                    if event.contains(target, name, value):
                        found.append(f"{target.__name__}.{name}: {module_name}.{value.__name__}")
    return sorted(found)
"""


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_the_package_installs_no_session_or_engine_listener() -> None:
    out = run_python(
        LISTENERS
        + """
import sqla_queue
at_import = ours()
sqla_queue.Registry()
print(json.dumps([at_import, ours()]))
"""
    )
    at_import, after_a_registry = json.loads(out)
    assert at_import == []
    # the probe sees them once something asks for them: the enqueue paths' five
    assert len(after_a_registry) == 5, after_a_registry
    assert "Engine.handle_error: sqla_queue.enqueue.inserts.refusals._explain_refusal" in (
        after_a_registry
    )


@pytest.mark.parametrize(
    "first_use",
    [
        "sqla_queue.Job(task='t')",
        "from sqla_queue.enqueue import install_listeners; install_listeners()",
    ],
)
def test_the_first_job_made_installs_them(first_use: str) -> None:
    out = run_python(LISTENERS + f"import sqla_queue\n{first_use}\nprint(len(ours()))")
    assert out.split() == ["5"]


ENQUEUE_ONLY_SKIPS = (
    "sqla_queue.worker",
    "sqla_queue.brokers",
    "sqla_queue.dashboard",
    "sqla_queue.cli",
    "alembic",
    "click",
)
"""What `from sqla_queue import Registry, enqueue` must not import (nor any module under it)."""


def imported_after(statement: str) -> list[str]:
    out = run_python(f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))")
    modules: list[str] = json.loads(out)
    return modules


def under(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules that are one of `packages` or inside one."""
    inside = tuple(f"{package}." for package in packages)
    return [m for m in modules if m in packages or m.startswith(inside)]


def test_an_enqueue_only_process_imports_no_runner_dashboard_cli_alembic_or_click() -> None:
    modules = imported_after("from sqla_queue import Registry, enqueue")
    assert "sqla_queue.enqueue" in modules
    assert "sqla_queue.registry" in modules
    assert under(modules, ENQUEUE_ONLY_SKIPS) == []


def test_the_worker_names_are_imported_on_first_use() -> None:
    out = run_python(
        """
import sys
import sqla_queue
before = "sqla_queue.worker" in sys.modules
from sqla_queue import Worker, WorkerConfig, WorkerStats
from sqla_queue.worker import Worker as W
print(before, "sqla_queue.worker" in sys.modules, Worker is W, WorkerConfig().concurrency > 0)
"""
    )
    assert out.split() == ["False", "True", "True", "True"]
    assert set(sqla_queue.__all__) <= set(dir(sqla_queue))
    assert all(getattr(sqla_queue, name) is not None for name in sqla_queue.__all__)
    with pytest.raises(AttributeError):
        sqla_queue.NoSuchName  # noqa: B018


def test_help_imports_no_command_module_and_reads_as_with_every_command_loaded() -> None:
    out = run_python(
        """
import json, sys
from click.testing import CliRunner
from sqla_queue.cli import COMMANDS, main
lazy = CliRunner().invoke(main, ["--help"], terminal_width=80)
modules = sorted(sys.modules)
for name in COMMANDS:
    main.commands[name]  # every command's module imported: the list from their own help
eager = CliRunner().invoke(main, ["--help"], terminal_width=80)
print(json.dumps([lazy.output, eager.output, modules]))
"""
    )
    lazy, eager, modules = json.loads(out)
    assert lazy == eager
    assert "Commands:\n  alembic " in lazy
    assert "\n  workers " in lazy
    runners = ("sqla_queue.worker", "sqla_queue.brokers", "sqla_queue.dashboard", "alembic")
    assert under(modules, runners) == []
    assert not any(m.startswith("sqla_queue.cli.") and m != "sqla_queue.cli.base" for m in modules)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_summary_is_its_command_s_own(name: str) -> None:
    command = main.commands[name]
    stand_in = click.Command(name, help=COMMANDS[name][1])
    for limit in (20, 45, 60, 200, 1000):
        assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_a_command_is_imported_when_used() -> None:
    out = run_python(
        """
import sys
from sqla_queue.cli import main
print("sqla_queue.cli.worker" in sys.modules)
print(main.get_command(None, "worker").name, "sqla_queue.cli.worker" in sys.modules)
print(main.get_command(None, "nope"))
"""
    )
    assert out.split() == ["False", "worker", "True", "None"]
