"""Every command doctor's fixes name runs as printed (issue 33): collected from the fixes
doctor can print (`sqla_queue.doctor.findings.FIX_*`, each finding's `fix`), its
placeholders (ID, NAME, QUEUE, APP) filled with a real job, queue and registry, run through
the CLI against a real database."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess

import pytest
from helpers.support import (
    SQLA_QUEUE_BIN,
    cli,
    create_task_log,
    enqueue_jobs,
    subprocess_env,
    task_log,
    wait_for,
)
from helpers.turns_kit import HELD_SEQUENCE, turns_backlog
from sqlalchemy import Engine, create_engine, text

from sqla_queue import admin
from sqla_queue.db import queries
from sqla_queue.doctor import DoctorOptions, diagnose, findings

FIXES = {
    name: value
    for module in (findings, queries)
    for name, value in vars(module).items()
    if name.startswith("FIX_")
}
"""Every fix doctor can print (the checks' in `doctor.findings`, the claim plan's in
`queries`), by its constant's name."""
COMMAND = re.compile(r"`(sqla-queue [^`]*)`")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b")
QUEUE = "fix-queue"
APP = "helpers.apps.tasks:registry"


def printed_commands() -> list[str]:
    return sorted({command for fix in FIXES.values() for command in COMMAND.findall(fix)})


def test_the_fixes_name_commands_and_doctor_prints_no_other_fix(
    engine: Engine, empty_database_url: str
) -> None:
    assert "sqla-queue prune --status failed --older-than 7d" in printed_commands()
    quick = DoctorOptions(sample=0)
    printed = {finding.name: finding.fix for finding in diagnose(engine, quick)}
    assert len(printed) > 10
    no_schema = create_engine(empty_database_url)
    try:
        printed |= {f"{f.name} (no schema)": f.fix for f in diagnose(no_schema, quick)}
    finally:
        no_schema.dispose()
    unknown = {name: fix for name, fix in printed.items() if fix not in FIXES.values()}
    assert unknown == {}, "a fix outside findings.FIX_*: this test would not run its commands"


def month_old_failed_job(engine: Engine) -> int:
    (job_id,) = enqueue_jobs(engine, "app.fix", 1, queue=QUEUE)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_queue.jobs SET status = 'failed', attempts = 1, "
                "finished_at = now() - interval '30 days', last_error = 'ValueError: x' "
                "WHERE id = :id"
            ),
            {"id": job_id},
        )
    return job_id


def filled(command: str, job_id: int) -> list[str]:
    values = {"ID": str(job_id), "NAME": "fix-new-queue", "QUEUE": QUEUE, "APP": APP}
    words = shlex.split(command)
    unknown = {w for word in words for w in PLACEHOLDER.findall(word)} - set(values)
    assert not unknown, f"{command!r}: placeholders this test cannot fill: {unknown}"
    return [PLACEHOLDER.sub(lambda m: values[m.group()], word) for word in words]


@pytest.mark.parametrize("command", printed_commands())
def test_every_command_a_doctor_fix_prints_runs_as_printed(
    database_url: str, engine: Engine, command: str
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE)
    job_id = month_old_failed_job(engine)
    words = filled(command, job_id)
    assert words[0] == "sqla-queue"
    if words[1] == "worker":  # runs until stopped: it must start, serve, and stop cleanly
        create_task_log(engine)
        enqueue_jobs(engine, "record", 1)
        worker = subprocess.Popen(
            [SQLA_QUEUE_BIN, *words[1:]],
            env=subprocess_env(database_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: task_log(engine), 60)  # it ran the job
        finally:
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        return
    result = cli(*words[1:], url=database_url, catch=True)
    assert result.exit_code == 0, f"{command!r} -> {words}: {result.output}"


def test_a_fix_doctor_fills_in_runs_as_printed_whatever_the_queue_name(
    database_url: str, engine: Engine
) -> None:
    failed_id = turns_backlog(engine, held_minutes=20)
    queue = "it's my queue"
    with engine.begin() as conn:
        admin.create_queue(conn, queue)
        conn.execute(
            text("UPDATE sqla_queue.jobs SET queue = :queue WHERE sequence = :sequence"),
            {"queue": queue, "sequence": HELD_SEQUENCE},
        )
    (held,) = [f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "held_sequences"]
    commands = COMMAND.findall(held.fix)
    assert f"sqla-queue jobs retry {failed_id}" in commands
    # retry, then delete: each runs as printed on the job doctor named
    for command in commands:
        result = cli(*shlex.split(command)[1:], url=database_url, catch=True)
        assert result.exit_code == 0, f"{command!r}: {result.output}"
    with engine.connect() as conn:
        (info,) = [q for q in admin.list_queues(conn) if q.name == queue]
    assert info.sequence_on_failure == "skip"
