"""The package as a user installs it: from a wheel, into a fresh virtual environment."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from sqla_queue.db.migrate import SCHEMA_REVISION

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with sqla-queue installed from a freshly built wheel.

    Built once per run: under pytest-xdist the first worker builds it in the run's shared
    temporary folder while the others wait on a file lock (pip builds in the checkout's
    build/ folder, so two builds at once would share it), then they use it too."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    work = shared / "wheel"
    with open(shared / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = work / "installed"
        if not done.exists():
            _build_and_install(work)
            done.touch()
    return work / "venv"


def _build_and_install(work: Path) -> None:
    work.mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = work.glob("sqla_queue-*.whl")
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    subprocess.run(
        [str(env_dir / "bin" / "pip"), "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
    )


def test_wheel_installs_the_command_and_migrates_without_the_repository(
    installed_wheel: Path, empty_database_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "SQLA_QUEUE_DATABASE_URL": empty_database_url}
    result = subprocess.run(
        [str(installed_wheel / "bin" / "sqla-queue"), "migrate"],
        cwd=tmp_path,  # outside the repository: revisions must come from the wheel
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert SCHEMA_REVISION in result.stdout  # the newest revision, shipped in the wheel
    engine = create_engine(empty_database_url)
    with engine.connect() as conn:
        queues = conn.execute(text("SELECT name FROM sqla_queue.queues")).scalars().all()
    engine.dispose()
    assert queues == ["default"]


def test_wheel_ships_type_information(installed_wheel: Path) -> None:
    result = subprocess.run(
        [
            str(installed_wheel / "bin" / "python"),
            "-c",
            "import importlib.resources as r; "
            "print(r.files('sqla_queue').joinpath('py.typed').is_file())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "True"


def test_wheel_registers_the_pytest_plugin_and_carries_the_license(installed_wheel: Path) -> None:
    result = subprocess.run(
        [
            str(installed_wheel / "bin" / "python"),
            "-c",
            "from importlib.metadata import distribution, entry_points; "
            "(plugin,) = entry_points(group='pytest11', name='sqla_queue.testing.pytest_plugin'); "
            "print(plugin.value); "
            "files = distribution('sqla-queue').files or []; "
            "print(any(f.name == 'LICENSE' for f in files))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == ["sqla_queue.testing.pytest_plugin", "True"]
