"""The typed call as the type checkers see it: mypy (and pyright) pass the right calls and
name the wrong ones (a misspelt argument, a wrong type, a missing argument, an option passed
as an argument), with the error code each gets."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HEADER = textwrap.dedent(
    """
    import datetime as dt
    from sqlalchemy import Connection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session
    from sqla_queue import Job, JobContext, Registry, enqueue_many

    registry = Registry()

    @registry.task(queue="emails", unique=True)
    def send_receipt(order_id: int, email: str, when: dt.datetime | None = None) -> None: ...

    @registry.task(pass_context=True)
    def with_context(ctx: JobContext, order_id: int) -> None: ...

    @registry.task
    async def plain(n: int) -> str:
        return str(n)
    """
)

GOOD = textwrap.dedent(
    """
    def ok(session: Session, connection: Connection) -> None:
        job: Job = send_receipt.defer(session, order_id=1, email="a@b.c")
        job_id: int = send_receipt.defer(connection, order_id=1, email="a@b.c")
        send_receipt.defer(session, 1, "a@b.c", when=dt.datetime.now(dt.timezone.utc))
        send_receipt.using(delay=60, unique=False, expires_in=300).defer(
            session, order_id=2, email="x"
        )
        with_context.defer(session, order_id=3)
        plain.defer(session, n=4)
        enqueue_many(session, [send_receipt.row(order_id=5, email="y")])

    async def ok_async(session: AsyncSession) -> None:
        job: Job = await send_receipt.defer_async(session, order_id=1, email="a@b.c")
        await send_receipt.using(priority=1).defer_async(session, order_id=1, email="z")
    """
)

# Each bad call on its own line, with the error code mypy must give that line and a piece of
# its message. `defer` is overloaded (a Session gives the Job, a Connection the id), so mypy
# files its argument errors under `call-overload`, still naming the argument.
BAD = [
    ('send_receipt.defer(session, order_id=1, emial="a@b.c")', "call-overload", '"emial"'),
    ('send_receipt.defer(session, order_id="1", email="a@b.c")', "call-overload", '"str"'),
    ("send_receipt.defer(session, order_id=1)", "call-overload", "No overload variant"),
    ('send_receipt.defer(session, order_id=1, email="a", delay=60)', "call-overload", '"delay"'),
    (
        'send_receipt.using(delay=60).defer(session, order_id=1, emial="x")',
        "call-overload",
        '"emial"',
    ),
    ('send_receipt.using(dleay=60).defer(session, order_id=1, email="x")', "call-arg", '"dleay"'),
    ("with_context.defer(session, ctx=None, order_id=1)", "call-overload", '"ctx"'),
    ("send_receipt.row(order_id=1, email=2)", "arg-type", '"email"'),
    ("send_receipt.row(order_id=1)", "call-arg", '"email"'),
]


def _check(tmp_path: Path, body: str) -> tuple[str, int]:
    source = tmp_path / "snippet.py"
    source.write_text(HEADER + body)
    # in a process of its own: mypy raises the interpreter's recursion limit for good, which
    # changes what later tests in this process see (a 5,000-deep JSON then decodes)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.stdout + done.stderr, done.returncode


def test_mypy_passes_typed_calls_and_names_each_wrong_one(tmp_path: Path) -> None:
    bad = "\ndef bad(session: Session) -> None:\n" + "".join(f"    {c}\n" for c, _, _ in BAD)
    output, status = _check(tmp_path, GOOD + bad)
    first_bad = len((HEADER + GOOD).splitlines()) + 3  # the line of BAD[0]
    errors: dict[int, list[tuple[str, str]]] = {}
    for line, message, code in re.findall(r"snippet\.py:(\d+): error: (.*)  \[([a-z-]+)\]", output):
        errors.setdefault(int(line), []).append((code, message))
    good_lines = range(1, first_bad - 1)
    assert not [n for n in errors if n in good_lines], output
    for offset, (call, code, fragment) in enumerate(BAD):
        found = errors.get(first_bad + offset, [])
        assert any(c == code and fragment in m for c, m in found), f"{call}: {found}"
    assert status == 1


def test_pyright_passes_typed_calls_and_flags_each_wrong_one(tmp_path: Path) -> None:
    """The same snippets through pyright (`pip install pyright`; its first run fetches the
    checker through npm): no error on the good calls, one on each bad call's line."""
    pyright = shutil.which("pyright") or str(Path(__file__).parents[2] / ".venv/bin/pyright")
    if not Path(pyright).exists():
        pytest.skip("pyright is not installed (pip install pyright)")
    bad = "\ndef bad(session: Session) -> None:\n" + "".join(f"    {c}\n" for c, _, _ in BAD)
    (tmp_path / "snippet.py").write_text(HEADER + GOOD + bad)
    root = str(Path(__file__).parents[2])
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"extraPaths": [root]}))
    done = subprocess.run(
        [pyright, "--outputjson", "--pythonpath", sys.executable, "snippet.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.skip(f"pyright did not start: {(done.stderr or done.stdout)[-300:]}")
    lines = {d["range"]["start"]["line"] + 1 for d in report["generalDiagnostics"]}
    first_bad = len((HEADER + GOOD).splitlines()) + 3
    assert not [n for n in lines if n < first_bad - 1], report["generalDiagnostics"]
    assert lines == set(range(first_bad, first_bad + len(BAD))), report["generalDiagnostics"]
