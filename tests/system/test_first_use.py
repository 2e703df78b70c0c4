"""What a new user trips on first (issue 33: defect 15, traps 2 to 6, 8 and 9): repeated
`-q`, args that can never fit their handler, a worker without the task, `Task.enqueue_async`,
an enqueue without a session, an `--app` that raises on import, the text log and doctor off
a terminal, claimed jobs apart from running ones, and what a `--burst` worker leaves."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest
from click.testing import Result
from helpers.apps import first_use
from helpers.dashboard_kit import client
from helpers.support import (
    WorkerThread,
    cli,
    count_where,
    create_task_log,
    enqueue_jobs,
    jobs_by_id,
    restored_logging_and_engines,
    task_log,
    wait_for,
)
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from sqla_queue import Registry, admin, enqueue, set_default_registry
from sqla_queue.admin import workers as admin_workers
from sqla_queue.cli.worker import worker as worker_command
from sqla_queue.dashboard.reads import bounded_rows
from sqla_queue.db.database import normalize_url
from sqla_queue.doctor import DoctorOptions, Severity, diagnose
from sqla_queue.enqueue import enqueue_async
from sqla_queue.worker import Worker, WorkerConfig
from sqla_queue.worker.supervisor import _option_arguments

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _restore_logging_and_engines() -> Iterator[None]:
    yield from restored_logging_and_engines()


def one_error_line(result: Result) -> str:
    """The one line a failed command printed on stderr (no traceback)."""
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def run_burst(engine: Engine, registry: Registry) -> None:
    Worker(engine, registry, WorkerConfig(burst=True, poll_only=True)).run(
        install_signal_handlers=False
    )


def in_async_session(database_url: str, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """`await work(session)` in an AsyncSession on the test's database, then commit."""

    async def scenario() -> T:
        async_engine = create_async_engine(normalize_url(database_url))
        try:
            async with async_sessionmaker(async_engine)() as session:
                done = await work(session)
                await session.commit()
                return done
        finally:
            await async_engine.dispose()

    return asyncio.run(scenario())


# -- defect 15: -q given more than once ----------------------------------------------------------


@pytest.mark.parametrize(
    "queue_options",
    [
        ("-q", "default", "-q", "emails"),
        ("-q", "default,emails"),
        ("--queues", "default", "-q", "emails,"),
    ],
)
def test_every_queue_given_to_the_worker_is_served(
    database_url: str, engine: Engine, queue_options: tuple[str, ...]
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, "emails")
        admin.create_queue(conn, "reports")
    create_task_log(engine)
    served = enqueue_jobs(engine, "record", 1) + enqueue_jobs(engine, "record", 1, queue="emails")
    (unserved,) = enqueue_jobs(engine, "record", 1, queue="reports")
    result = cli(
        "worker",
        "--app",
        "helpers.apps.tasks:registry",
        "--burst",
        *queue_options,
        url=database_url,
        catch=True,
    )
    assert result.exit_code == 0, result.output
    assert sorted(job_id for job_id, _ in task_log(engine)) == sorted(served)
    assert jobs_by_id(engine, [unserved])[unserved].status == "queued"


def test_processes_hand_every_repeated_queue_to_their_children() -> None:
    (queues,) = [p for p in worker_command.params if p.name == "queues"]
    assert queues.multiple
    given = ("default", "emails,reports")
    assert _option_arguments(queues, given) == ["-q", "default", "-q", "emails,reports"]


# -- trap 2: args that can never fit; a task the worker does not have ----------------------------


def test_args_that_cannot_fit_the_handler_fail_at_once_naming_its_signature(
    database_url: str, engine: Engine
) -> None:
    result = cli("enqueue", "first_use.pick", "--args", '{"b": 1}', url=database_url, catch=True)
    assert result.exit_code == 0, result.output
    job_id = int(result.stdout.strip())
    run_burst(engine, first_use.registry)
    job = jobs_by_id(engine, [job_id])[job_id]
    assert (job.status, job.attempts) == ("failed", 1)  # no retry: the args never fit
    assert job.last_error is not None
    assert "the handler pick(a: 'int') -> 'int'" in job.last_error
    assert "missing a required argument: 'a'" in job.last_error
    assert "args given: b" in job.last_error


def test_a_type_error_raised_inside_the_handler_is_retried_as_any_error(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="inner")
    def inner(a: int) -> None:
        raise TypeError("raised by the handler itself")

    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "inner", {"a": 1}, flush=True).id
    run_burst(engine, registry)
    job = jobs_by_id(engine, [job_id])[job_id]
    assert (job.status, job.attempts) == ("queued", 1)  # retried later, as any error
    assert "raised by the handler itself" in (job.last_error or "")


def test_a_worker_without_the_task_names_the_closest_and_the_include_fix(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.task(name="shop.emails.send_receipt")
    def send_receipt() -> None: ...

    (job_id,) = enqueue_jobs(engine, "shop.emails.send_reciept", 1)
    caplog.set_level(logging.ERROR, "sqla_queue")
    run_burst(engine, registry)
    (message,) = [r.getMessage() for r in caplog.records if "unknown task" in r.getMessage()]
    assert "did you mean 'shop.emails.send_receipt'?" in message
    assert "Registry(include=['shop.emails'])" in message
    assert jobs_by_id(engine, [job_id])[job_id].status == "queued"  # left for one that knows it


# -- trap 3: an AsyncSession ---------------------------------------------------------------------


def test_task_enqueue_async_takes_the_task_queue_and_its_unique_default(
    database_url: str, engine: Engine, emails_queue: str
) -> None:
    registry = Registry()

    @registry.task(name="receipt", queue="emails", unique=True)
    def receipt(order: int) -> None: ...

    async def twice(session: AsyncSession) -> tuple[int, int, bool, str]:
        first = await receipt.enqueue_async(session, {"order": 1})
        again = await receipt.enqueue_async(session, {"order": 1})
        return await session.run_sync(lambda _: (first.id, again.id, again.duplicate, first.queue))

    first_id, again_id, duplicate, queue = in_async_session(database_url, twice)
    assert (again_id, duplicate, queue) == (first_id, True, "emails")
    assert count_where(engine, "queue = 'emails'") == 1


def test_task_enqueue_async_with_a_sync_session_names_the_mistake(engine: Engine) -> None:
    registry = Registry()
    task = registry.task(name="t")(lambda: None)
    with Session(engine) as session, pytest.raises(TypeError, match="needs an AsyncSession"):
        asyncio.run(task.enqueue_async(session))  # type: ignore[arg-type]


def test_enqueue_async_by_name_takes_the_task_queue_as_enqueue_does(
    database_url: str, engine: Engine, emails_queue: str
) -> None:
    registry = Registry()
    registry.task(name="receipt", queue="emails")(lambda: None)

    async def by_name(session: AsyncSession) -> str:
        return (await enqueue_async(session, "receipt")).queue

    set_default_registry(registry)
    try:
        with Session(engine) as session, session.begin():
            sync_queue = enqueue(session, "receipt").queue
        assert (sync_queue, in_async_session(database_url, by_name)) == ("emails", "emails")
    finally:
        set_default_registry(None)


# -- trap 4: no session --------------------------------------------------------------------------


def test_task_enqueue_without_a_session_names_the_mistake(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="receipt")
    def receipt(order: int) -> None: ...

    with pytest.raises(TypeError, match="as the first argument") as args_first:
        receipt.enqueue({"order": 1})  # type: ignore[arg-type]
    assert "got a dict: the args go second" in str(args_first.value)
    with pytest.raises(TypeError, match="as the first argument") as an_engine:
        receipt.enqueue(engine, {"order": 1})  # type: ignore[arg-type]
    assert "got an Engine: open a Session or a Connection on it" in str(an_engine.value)
    with pytest.raises(TypeError, match=r"enqueue\(\) writes the job in your transaction"):
        enqueue(engine, "receipt")  # type: ignore[call-overload]
    for error in (args_first.value, an_engine.value):
        assert "\n" not in str(error)
    assert count_where(engine, "true") == 0
    scoped = scoped_session(sessionmaker(engine))  # Flask-SQLAlchemy's db.session is one
    try:
        receipt.enqueue(scoped, {"order": 1})
        scoped.commit()
    finally:
        scoped.remove()
    assert count_where(engine, "true") == 1


# -- trap 5: an --app that raises on import ------------------------------------------------------


@pytest.mark.parametrize("level", [(), ("--log-level", "debug")])
def test_an_app_that_raises_on_import_says_where_with_its_traceback(
    database_url: str, level: tuple[str, ...]
) -> None:
    app = ("--app", "helpers.apps.raises_on_import:registry", "--burst", *level)
    result = cli("worker", *app, url=database_url, catch=True)
    assert result.exit_code != 0
    *traceback, line = result.stderr.strip().splitlines()
    assert line.startswith("Error: Cannot load the task registry")
    assert "KeyError('DATABASE')" in line
    assert re.search(r"apps/raises_on_import\.py:10\b", line), line
    # the traceback, always (not only at --log-level debug): file, line and source
    assert traceback[:2] == [
        "Importing --app helpers.apps.raises_on_import:registry raised:",
        "Traceback (most recent call last):",
    ]
    assert re.search(r'apps/raises_on_import\.py", line 10, in <module>', traceback[2])
    assert 'DATABASE = SETTINGS["DATABASE"]' in "\n".join(traceback)
    assert traceback[-1] == "KeyError: 'DATABASE'"
    assert "importlib" not in result.stderr  # from the application's module on


# -- trap 6: off a terminal ----------------------------------------------------------------------


def test_the_text_log_off_a_terminal_is_one_line_per_record() -> None:
    message = "job 7 (shop.emails.send_receipt) failed: " + "x" * 300
    code = (
        "import logging; from sqla_queue.contrib.logs import configure_logging; "
        "configure_logging('info', 'text'); "
        f"logging.getLogger('sqla_queue.worker').error({message!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    (line,) = done.stderr.splitlines()
    assert "ERROR" in line
    assert line.endswith(message)


def test_every_table_the_cli_prints_off_a_terminal_keeps_each_record_on_one_line(
    database_url: str, engine: Engine
) -> None:
    # names as long as the schema takes: on an 80-column terminal each would wrap
    queue = "q" + "_long_queue_name" * 12
    task = "shop.tasks" + ".a_very_long_task_name" * 8
    host = "host-" + "x" * 150
    with engine.begin() as conn:
        admin.create_queue(conn, queue)
        conn.execute(
            text(
                "INSERT INTO sqla_queue.workers (id, hostname, pid, queues, concurrency, "
                "expires_at) VALUES ('w-long', :host, 42, ARRAY[:queue], 3, "
                "now() + interval '1 minute')"
            ),
            {"host": host, "queue": queue},
        )
    ids = enqueue_jobs(engine, task, 2, queue=queue, tags=["tag-" + "t" * 60])
    tables = [
        (("jobs", "list", "--queue", queue), [[str(i), task, queue, "queued"] for i in ids]),
        (("stats",), [[queue, "2"]]),
        (("workers", "list"), [["w-long", host, "42", queue]]),
    ]
    for args, records in tables:
        printed = cli(*args, url=database_url, catch=True)
        assert printed.exit_code == 0, printed.output
        lines = printed.stdout.splitlines()
        for record in records:
            assert any(all(cell in line for cell in record) for line in lines), (args, lines)


FAIL_EVERY_JOB = text(
    "UPDATE sqla_queue.jobs SET status = 'failed', last_error = 'boom', finished_at = now(), "
    "attempts = 1"
)


def test_doctor_in_a_file_wraps_its_findings_and_keeps_commands_whole(
    database_url: str, engine: Engine
) -> None:
    enqueue_jobs(engine, "t", 3)
    with engine.begin() as conn:
        conn.execute(FAIL_EVERY_JOB)
    result = cli("doctor", "--sample", "0", url=database_url, catch=True)
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100
    assert any(re.match(r"warn +failed_jobs: 3 failed", line) for line in lines), lines
    findings = diagnose(engine, DoctorOptions(sample=0))
    for finding in findings:
        assert any(line.split()[1:2] == [f"{finding.name}:"] for line in lines), finding.name
        if finding.severity is not Severity.ok:
            for command in re.findall(r"`[^`]*`", finding.fix):
                assert any(command in line for line in lines), command


# -- trap 8: claimed is not running --------------------------------------------------------------


def test_a_worker_shows_its_claimed_jobs_apart_from_the_running_ones(
    database_url: str, engine: Engine
) -> None:
    registry = Registry()
    release = threading.Event()

    @registry.task(name="hold")
    def hold() -> None:
        release.wait(30)  # bounded: the test sets it

    enqueue_jobs(engine, "hold", 10)
    runner = WorkerThread(engine, registry, concurrency=1, batch=10, max_batch=10)
    with runner:
        try:

            def held() -> list[tuple[int, int]]:
                with engine.connect() as conn:
                    return [(w.running, w.claimed) for w in admin_workers.live_workers(conn)]

            wait_for(lambda: held() == [(1, 9)], timeout=60)
            (listed,) = json.loads(
                cli("workers", "list", "--json", url=database_url, catch=True).stdout
            )
            assert (listed["running"], listed["claimed"]) == (1, 9)
            table = cli("workers", "list", url=database_url, catch=True).stdout
            assert "claimed" in table
            (workers,) = [
                f for f in diagnose(engine, DoctorOptions(sample=0)) if f.name == "workers"
            ]
            assert "1 job(s) running, 9 claimed and not started" in workers.value
        finally:
            release.set()


@contextmanager
def one_running_nine_claimed(engine: Engine) -> Iterator[None]:
    """A worker at concurrency 1 that has claimed 10 jobs of queue `default`: one handler at
    work (its start reported), nine held in its buffer; released on leaving."""
    registry = Registry()
    release = threading.Event()

    @registry.task(name="hold")
    def hold() -> None:
        release.wait(30)  # bounded: the context sets it

    enqueue_jobs(engine, "hold", 10)
    with WorkerThread(engine, registry, concurrency=1, batch=10, max_batch=10):
        try:

            def held() -> list[tuple[int, int]]:
                with engine.connect() as conn:
                    return [(w.running, w.claimed) for w in admin_workers.live_workers(conn)]

            wait_for(lambda: held() == [(1, 9)], timeout=60)
            yield
        finally:
            release.set()


def test_stats_counts_claimed_jobs_apart_from_the_running_ones(
    database_url: str, engine: Engine
) -> None:
    with one_running_nine_claimed(engine):
        listed = json.loads(cli("stats", "--json", url=database_url, catch=True).stdout)
        (default,) = [q for q in listed if q["queue"] == "default"]
        assert (default["running"], default["claimed"]) == (1, 9)
        table = cli("stats", url=database_url, catch=True).stdout
    assert "claimed" in table


def test_the_queues_page_counts_claimed_jobs_apart_from_the_running_ones(
    engine: Engine,
) -> None:
    with one_running_nine_claimed(engine):
        page = client(engine).get("/").text
        with engine.begin() as conn:
            bounded = {row.name: row.counts for row in bounded_rows(conn)}  # a big table's
    assert 'data-queue="default"' in page, page
    row = page[page.index('data-queue="default"') :]
    row = row[: row.index("</tr>")]
    assert re.search(r'count-running"[^>]*>.*?>1</a>', row), row
    assert re.search(r'count-claimed"[^>]*>.*?>9</a>', row), row
    assert (bounded["default"]["running"], bounded["default"]["claimed"]) == (1, 9)


def test_the_api_and_the_scaling_signal_count_claimed_jobs_apart_from_the_running_ones(
    engine: Engine,
) -> None:
    api = client(engine, api_tokens="r3ad:read")
    token = {"Authorization": "Bearer r3ad"}
    with one_running_nine_claimed(engine):
        queues = api.get("/api/queues", headers=token).json()["queues"]
        scaling = api.get("/api/queues/default/scaling", headers=token).json()
        with engine.begin() as conn:
            (signal,) = admin.scaling_signal(conn, "default")
    (default,) = [q for q in queues if q["name"] == "default"]
    assert (default["counts"]["running"], default["counts"]["claimed"]) == (1, 9)
    assert (default["scaling"]["running"], default["scaling"]["claimed"]) == (1, 9)
    assert (scaling["running"], scaling["claimed"]) == (1, 9)
    # the held jobs take the worker's one slot: none is free
    assert (signal.running, signal.claimed, signal.workers, signal.free_slots) == (1, 9, 1, 0)


# -- trap 9: what a --burst worker leaves --------------------------------------------------------


def test_a_burst_worker_says_which_retry_it_left_and_when_it_is_due(
    database_url: str, engine: Engine
) -> None:
    (job_id,) = enqueue_jobs(engine, "first_use.fail_once", 1)
    result = cli(
        "worker",
        "--app",
        "helpers.apps.first_use:registry",
        "--burst",
        url=database_url,
        catch=True,
    )
    assert result.exit_code == 0, result.output
    job = jobs_by_id(engine, [job_id])[job_id]
    assert (job.status, job.attempts) == ("queued", 1)
    due = job.run_at.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
    assert f"1 retried, 0 failed; left 1 job not yet due, the earliest due at {due}" in (
        result.stderr
    )
    assert "--burst-wait" in result.stderr
    # the bound it waits within, said as it starts
    assert "waits for those due within 0s (--burst-wait), then exits" in result.stderr


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (("--until-empty",), "burst_until_empty waits until a burst worker's queues are empty"),
        (
            ("--burst", "--until-empty", "--burst-wait", "10"),
            "burst_until_empty already waits for every job due later: drop burst_wait",
        ),
    ],
)
def test_until_empty_without_burst_or_beside_burst_wait_is_refused(
    database_url: str, given: tuple[str, ...], says: str
) -> None:
    result = cli(
        "worker", "--app", "helpers.apps.first_use:registry", *given, url=database_url, catch=True
    )
    line = one_error_line(result)
    assert says in line


@pytest.mark.parametrize(
    ("flags", "bound"),
    [
        (("--burst-wait", "60"), "waits for those due within 60s (--burst-wait), then exits"),
        (("--until-empty", "--fail-if-left"), "exits once none is left (--until-empty)"),
    ],
)
def test_burst_wait_or_until_empty_runs_a_retry_and_leaves_nothing(
    database_url: str, engine: Engine, flags: tuple[str, ...], bound: str
) -> None:
    (job_id,) = enqueue_jobs(engine, "first_use.fail_once", 1)
    args = ("worker", "--app", "helpers.apps.first_use:registry", "--burst", "--poll-only")
    result = cli(*args, *flags, url=database_url, catch=True)
    assert result.exit_code == 0, result.output
    assert bound in result.stderr  # said as it starts
    assert "done: 1 succeeded, 1 retried, 0 failed" in result.stderr
    assert "not yet due" not in result.stderr
    assert count_where(engine, f"id = {job_id} AND status <> 'done'") == 0


def test_burst_wait_beyond_the_next_due_job_exits_and_says_so(
    database_url: str, engine: Engine
) -> None:
    enqueue_jobs(engine, "first_use.pick", 2, args={"a": 1}, delay=3600)
    result = cli(
        "worker",
        "--app",
        "helpers.apps.first_use:registry",
        "--burst",
        "--burst-wait",
        "60",
        url=database_url,
        catch=True,
    )
    assert result.exit_code == 0, result.output
    assert "done: 0 succeeded, 0 retried, 0 failed; left 2 jobs not yet due" in result.stderr
    assert "(beyond --burst-wait 60s)" in result.stderr


def test_burst_wait_without_burst_is_refused(database_url: str) -> None:
    result = cli(
        "worker",
        "--app",
        "helpers.apps.first_use:registry",
        "--burst-wait",
        "10",
        url=database_url,
        catch=True,
    )
    line = one_error_line(result)
    assert "burst_wait" in line
    assert "(--burst)" in line


def test_burst_fail_if_left_exits_3_when_it_leaves_a_retry_not_yet_due(
    database_url: str, engine: Engine
) -> None:
    # issue 38: CI and cron expect the work done, or a failure that says it is not
    (job_id,) = enqueue_jobs(engine, "first_use.fail_once", 1)
    args = ("worker", "--app", "helpers.apps.first_use:registry", "--burst", "--fail-if-left")
    result = cli(*args, url=database_url, catch=True)
    assert result.exit_code == 3, result.output
    assert "left 1 job not yet due" in result.stderr
    assert count_where(engine, f"id = {job_id} AND status = 'queued'") == 1
    done = cli(*args, "--burst-wait", "60", "--poll-only", url=database_url, catch=True)
    assert done.exit_code == 0, done.output
    assert count_where(engine, f"id = {job_id} AND status <> 'done'") == 0


def test_fail_if_left_without_burst_is_refused(database_url: str) -> None:
    result = cli(
        "worker",
        "--app",
        "helpers.apps.first_use:registry",
        "--fail-if-left",
        url=database_url,
        catch=True,
    )
    line = one_error_line(result)
    assert "--fail-if-left" in line
    assert "add --burst" in line
