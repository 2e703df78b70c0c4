"""Where two features meet (issue 33, section 3; the table is tests/system/pairs.toml).

`test_each_kind_of_job_keeps_its_rule_through_each_run_feature` takes one job J of a *kind*
(an option it is enqueued with, or a setting of its queue, with the companion jobs the kind's
rule is about) through one *run feature* (what happens to a job once a worker has it) or
through a second kind, with a real burst worker, and checks after each step that both hold:
the kind's rule (a duplicate finds J, J's follower in its sequence waits, J's child waits,
no partition or queue runs past its limit, ...) and the run feature's outcome (timed out then
run, retried, snoozed, its result kept, its session's row written once, cancelled, retried by
filter, its durable steps run once and replayed, put to sleep and woken).
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.enqueue_paths import EVERY_PATH
from helpers.statements import claim, finish
from helpers.support import (
    WorkerThread,
    cli,
    end_sleeps,
    jobs_by_id,
    jobs_of_task,
    make_due,
    record_run,
)
from helpers.support import wait_for as wait_until
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

import sqla_queue
from sqla_queue import (
    ConfigurationError,
    DependencyError,
    InvalidJobError,
    JobContext,
    JobFailedError,
    JobLostError,
    Registry,
    ResultMissingError,
    RetryPolicy,
    Snooze,
    Unique,
    WorkerConfig,
    admin,
    enqueue,
    wait_for,
)
from sqla_queue.admin import partitions
from sqla_queue.admin.filters import JobFilter, bulk_cancel, bulk_delete, bulk_retry, search_jobs
from sqla_queue.brokers.worker import _no_session
from sqla_queue.dashboard import create_app
from sqla_queue.db.queries import steps as step_queries
from sqla_queue.job.options import DEFAULT_MAX_ATTEMPTS
from sqla_queue.orm import cancel_jobs_about
from sqla_queue.testing import run_until_empty
from sqla_queue.worker.periodic import Scheduler

RUNS = (
    "timeouts",
    "retry",
    "snooze",
    "results",
    "ctx_session",
    "cancel",
    "bulk",
    "steps",
    "sleep",
    "signals",
    "api",
)
"""What happens to J once a worker has it (`api`: a bulk retry through the HTTP API)."""
KINDS = (
    "unique",
    "debounce",
    "workflows",
    "sequences",
    "fair",
    "aging",
    "limits",
    "about",
    "retention",
    "periodic",
)
"""What J is: an option it is enqueued with, or its queue's setting."""
CASES = [(kind, run) for kind in KINDS for run in RUNS] + list(itertools.combinations(KINDS, 2))

QUEUE = "meet"
ABOUT = "orders:7"
SEQUENCE = "s-1"
KEY = "meet-key"
TIMEOUT = 0.3
OVERRUN_TIMEOUT = 3.0
"""The timeout of a handler the test cancels while it runs, then lets overrun."""
DEADLINE = 120.0
"""Seconds after which a wait fails the test instead of hanging it (generous: a loaded machine)."""
LATER = RetryPolicy(base=600, jitter=0)
"""A retry far enough ahead that the burst worker leaves it: the test makes it due."""


@dataclass
class Meeting:
    """One case: J's kinds, its run feature (None: it just succeeds), and what the handlers
    saw."""

    engine: Engine
    kinds: tuple[str, ...]
    run: str | None
    j: int = 0
    companions: dict[str, int] = field(default_factory=dict)
    runs: list[tuple[int, str, int]] = field(default_factory=list)
    """(job id, role, args' v) of every handler run, in the order they started."""
    running: list[tuple[int, int]] = field(default_factory=list)
    """(running jobs of the handler's partition, running jobs of the queue) at each start."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    step_calls: list[int] = field(default_factory=list)
    """The job ids of every run of an outside-effect durable step (`steps`, `sleep`)."""

    def has(self, kind: str) -> bool:
        return kind in self.kinds

    # -- J and its companions ----------------------------------------------------------------

    def j_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"queue": QUEUE}
        if self.has("unique"):
            options["unique"] = Unique(key=KEY, args=[])
        if self.has("debounce"):
            options["unique"] = Unique(key=KEY, args=[], on_conflict="replace")
        if self.has("sequences"):
            options["sequence"] = SEQUENCE
        if self.has("fair"):
            options["partition"] = "a"
        if self.has("aging"):
            options["priority"] = 9
        if self.has("about"):
            options["about"] = ABOUT
        if self.run in ("bulk", "api"):
            options["max_attempts"] = 1
        return options

    def handler(self, ctx: JobContext, role: str, v: int = 1) -> dict[str, int]:
        with self.engine.connect() as conn:
            counts = conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE partition IS NOT DISTINCT FROM "
                    "(SELECT partition FROM sqla_queue.jobs WHERE id = :id)), count(*) "
                    "FROM sqla_queue.jobs WHERE queue = :q AND status = 'running'"
                ),
                {"id": ctx.job_id, "q": QUEUE},
            ).one()
        with self.lock:
            first = all(job_id != ctx.job_id for job_id, _, _ in self.runs)
            self.runs.append((ctx.job_id, role, v))
            self.running.append((counts[0], counts[1]))
        if role != "j":
            return {"v": v}
        if self.run == "timeouts" and first:
            time.sleep(TIMEOUT * 4)
        if self.run in ("retry", "bulk", "api") and first:
            raise RuntimeError("the first attempt fails")
        if self.run == "snooze" and first:
            raise Snooze(3600, reason="not now")
        if self.run in ("steps", "sleep"):
            ctx.step("outside", self.step_calls.append, ctx.job_id)
        if self.run == "steps":  # a database-only step, then a failure: the retry replays both
            ctx.step("db", _log_job, ctx.job_id, session=True)
            if first:
                raise RuntimeError("the first attempt fails after its steps")
        if self.run == "sleep":
            ctx.sleep(dt.timedelta(hours=1))
        if self.run == "signals":  # parks on its first run; the test sends the signal
            assert ctx.wait_for_signal(f"meet:{ctx.job_id}", timeout=3600) == {"go": True}
        if self.run == "ctx_session":
            with ctx.session() as session:
                session.execute(
                    text("INSERT INTO public.meet_log (job_id) VALUES (:j)"), {"j": ctx.job_id}
                )
                session.commit()
        return {"v": v}

    def registry(self) -> Registry:
        registry = Registry()
        options: dict[str, Any] = {"pass_context": True, "retry": LATER}
        if self.run == "timeouts":
            options["timeout"] = TIMEOUT
        if self.run == "results":
            options["keep_result"] = True
        if self.has("periodic"):
            defaults = self.j_options()
            registry.periodic(
                every=dt.timedelta(hours=1), args={"role": "j"}, name="meet", **options, **defaults
            )(self.handler)
        else:
            registry.task(name="meet", **options)(self.handler)
        registry.task(name="companion", queue=QUEUE, pass_context=True)(self.handler)
        return registry

    def set_up(self) -> Registry:
        retention = "archive" if self.has("retention") else "keep"
        with self.engine.begin() as conn:
            admin.create_queue(conn, QUEUE, retention=retention)
            if self.has("fair"):
                partitions.set_fair(conn, QUEUE, True)
                partitions.set_partition_limit(conn, QUEUE, 1)
            if self.has("aging"):
                partitions.set_aging(conn, QUEUE, 60)
            if self.has("limits"):
                admin.set_max_running(conn, QUEUE, 1)
            conn.execute(text("CREATE TABLE public.meet_log (job_id bigint NOT NULL)"))
        registry = self.registry()
        if self.has("periodic"):
            last = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
            with self.engine.begin() as conn:
                conn.execute(
                    text("INSERT INTO sqla_queue.periodic_slots (task, slot) VALUES ('meet', :s)"),
                    {"s": last - dt.timedelta(hours=3)},
                )
            assert len(Scheduler(registry, self.engine, "test").tick()) == 1
            self.j = self.slot_jobs()[0]
        with Session(self.engine) as session, session.begin():
            if not self.has("periodic"):
                self.j = enqueue(session, "meet", {"role": "j"}, flush=True, **self.j_options()).id
            companion = self.companion(session)
            if self.has("workflows"):
                self.companions["child"] = companion(depends_on=[self.j])
            if self.has("sequences"):
                self.companions["follower"] = companion(sequence=SEQUENCE)
            if self.has("fair"):
                self.companions["same_partition"] = companion(partition="a")
                self.companions["other_partition"] = companion(partition="b")
            if self.has("limits"):
                self.companions["same_queue"] = companion()
            if self.has("aging"):
                for n in range(3):
                    self.companions[f"new_{n}"] = companion(priority=0)
        return registry

    def companion(self, session: Session) -> Callable[..., int]:
        def write(**options: Any) -> int:
            return enqueue(
                session, "companion", {"role": "c"}, queue=QUEUE, flush=True, **options
            ).id

        return write

    # -- reading -------------------------------------------------------------------------------

    def slot_jobs(self) -> list[int]:
        with self.engine.connect() as conn:
            return list(
                conn.execute(
                    text(
                        "SELECT job_id FROM sqla_queue.periodic_slots "
                        "WHERE task = 'meet' AND job_id IS NOT NULL"
                    )
                ).scalars()
            )

    def row(self, job_id: int) -> dict[str, Any]:
        """The job's row in the table, else in the archive (with `archived` set)."""
        with self.engine.connect() as conn:
            for table in ("jobs", "jobs_history"):
                found = (
                    conn.execute(
                        text(f"SELECT * FROM sqla_queue.{table} WHERE id = :i"), {"i": job_id}
                    )
                    .mappings()
                    .first()
                )
                if found is not None:
                    return {**found, "archived": table == "jobs_history"}
        raise AssertionError(f"job {job_id} is in neither the table nor the archive")

    def runs_of(self, job_id: int) -> list[int]:
        """The positions in `runs` of the job's runs."""
        return [n for n, (ran, _, _) in enumerate(self.runs) if ran == job_id]

    def move_run_at(self, job_id: int, when: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text(f"UPDATE sqla_queue.jobs SET run_at = {when} WHERE id = :i"), {"i": job_id}
            )

    def enqueue_again(self, v: int) -> tuple[int, bool]:
        with Session(self.engine) as session, session.begin():
            job = enqueue(session, "meet", {"role": "j", "v": v}, flush=True, **self.j_options())
            return job.id, bool(job.duplicate)

    # -- the kinds' rules ----------------------------------------------------------------------

    def check_while_unfinished(self, step: str) -> None:
        """J has not ended (before its first run, or queued again after it): each kind's
        rule while it waits."""
        status = self.row(self.j)["status"]
        assert status in ("queued", "waiting"), (step, status)
        if self.has("unique") or self.has("debounce"):
            assert self.enqueue_again(v=2) == (self.j, True), step  # J holds its key
        if self.has("debounce"):
            assert self.row(self.j)["args"]["v"] == 2, step  # and took the last call's args
        if self.has("workflows"):
            assert self.row(self.companions["child"])["status"] == "waiting", step
        if self.has("sequences"):  # the follower never starts before J has ended
            follower = self.companions["follower"]
            assert self.runs_of(follower) == [], step
        if self.has("about"):
            with self.engine.connect() as conn:
                found = search_jobs(conn, JobFilter(about=ABOUT))
            assert [job.id for job in found] == [self.j], step

    def check_ended(self, status: str) -> None:
        """J has ended in `status`: each kind's rule after its end."""
        j = self.row(self.j)
        assert j["status"] == status
        if self.has("unique") or self.has("debounce"):
            again, duplicate = self.enqueue_again(v=3)
            assert (again != self.j, duplicate) == (True, False)  # an ended J holds no key
            with self.engine.begin() as conn:  # the new job is the test's, not the worker's
                admin.cancel_jobs(conn, [again])
        if self.has("debounce"):
            assert j["args"]["v"] == 2
            if status == "done":
                assert self.runs[self.runs_of(self.j)[-1]][2] == 2  # J ran with the last args
        if self.has("workflows"):
            child = self.companions["child"]
            if status == "done":
                assert self.row(child)["status"] == "done"
                assert min(self.runs_of(child)) > max(self.runs_of(self.j))
            else:
                assert self.row(child)["status"] == "cancelled"
                assert self.runs_of(child) == []
        if self.has("sequences"):
            follower = self.companions["follower"]
            assert self.row(follower)["status"] == "done"
            if self.runs_of(self.j):
                assert min(self.runs_of(follower)) > max(self.runs_of(self.j))
        if self.has("fair"):  # a partition limited to 1 never had two running
            assert [partition for partition, _ in self.running] == [1] * len(self.running)
            assert all(self.row(c)["status"] == "done" for c in self.companions.values())
        if self.has("limits"):  # a queue limited to 1 never had two running
            assert [queue for _, queue in self.running] == [1] * len(self.running)
        # the aged job went before the new ones (in a fair queue aging orders the partitions'
        # turns, not the jobs of one partition: test_in_a_fair_aging_queue_...)
        if self.has("aging") and not self.has("fair") and self.runs_of(self.j):
            assert self.runs_of(self.j)[0] == 0
        if self.has("about"):
            assert j["about"] == ABOUT
        if self.has("retention"):  # archived in the finishing statement; cancelled ones stay
            assert j["archived"] == (status == "done")
        if self.has("periodic"):  # one job for the slot, and a second look adds none
            assert self.slot_jobs() == [self.j]
            assert Scheduler(self.registry(), self.engine, "again").tick() == []

    # -- the run features' outcomes --------------------------------------------------------------

    def run_worker(self, registry: Registry) -> None:
        concurrency = 1 if self.has("aging") else 2
        run_until_empty(
            self.engine, registry, WorkerConfig(concurrency=concurrency, batch=1, poll_only=True)
        )

    def play(self) -> None:
        registry = self.set_up()
        before = self.row(self.j)
        self.check_while_unfinished("before its first run")
        if self.has("aging"):  # J has waited ten intervals: at priority 0 now, and older
            self.move_run_at(self.j, "now() - interval '10 minutes'")
        if self.run == "cancel":
            with self.engine.begin() as conn:
                assert admin.cancel_jobs(conn, [self.j]) == {self.j: "queued"}
            self.run_worker(registry)
            assert self.runs_of(self.j) == []
            self.check_ended("cancelled")
            return
        self.run_worker(registry)
        if self.run == "signals":
            j = self.row(self.j)
            assert (j["status"], j["signal_key"]) == ("waiting", f"meet:{self.j}")
            self.check_while_unfinished("while it waits for its signal")
            with Session(self.engine) as session, session.begin():
                assert sqla_queue.signal(session, f"meet:{self.j}", {"go": True}) == 1
            self.check_while_unfinished("woken, before it runs again")
            self.run_worker(registry)
            assert len(self.runs_of(self.j)) == 2
        elif self.run in ("timeouts", "retry", "snooze", "bulk", "steps", "sleep", "api"):
            j = self.row(self.j)
            if self.run == "bulk":
                assert j["status"] == "failed"
                retried = bulk_retry(self.engine, JobFilter(task="meet", status="failed"))
                assert (retried.acted, retried.skipped) == (1, 0)
            elif self.run == "api":
                assert j["status"] == "failed"
                api = TestClient(create_app(self.engine, api_tokens="meet:admin"))
                answer = api.post(
                    "/api/jobs/retry",
                    json={"task": "meet", "status": ["failed"]},
                    headers={"Authorization": "Bearer meet"},
                ).json()
                assert (answer["acted"], answer["skipped"]) == (1, 0), answer
            else:  # a sleeper is parked (waiting), a snoozed job queued, both not due yet
                assert j["status"] == ("waiting" if self.run == "sleep" else "queued")
                assert j["run_at"] > dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)
            if self.run == "timeouts":
                assert "JobTimeoutError" in j["last_error"]
            if self.run in ("snooze", "sleep"):
                budget = before["max_attempts"] or DEFAULT_MAX_ATTEMPTS
                assert j["max_attempts"] == budget + 1  # the attempt it took is given back
            if self.run == "sleep":
                assert (j["last_error"], j["signal_key"], j["deps_left"]) == (None, None, None)
            self.check_while_unfinished(f"after a {self.run}")
            if self.run == "sleep":  # its end has come
                end_sleeps(self.engine)
            self.move_run_at(self.j, "now()")
            if self.run == "sleep":  # the keeper's look queues it
                with self.engine.begin() as conn:
                    conn.execute(step_queries.wake_sleeping_jobs(), {"ahead": 0.0})
            self.run_worker(registry)
            assert len(self.runs_of(self.j)) == 2
        else:
            assert len(self.runs_of(self.j)) == 1
        self.check_ended("done")
        if self.run == "results":
            assert wait_for(self.engine, self.j, timeout=0) == {
                "v": self.runs[self.runs_of(self.j)[-1]][2]
            }
        if self.run in ("ctx_session", "steps"):
            with self.engine.connect() as conn:
                logged = conn.execute(text("SELECT job_id FROM public.meet_log")).scalars().all()
            assert logged == [self.j]
        if self.run in ("steps", "sleep"):  # J's outside step ran once, replayed after
            assert self.step_calls == [self.j]


def _log_job(session: Session, job_id: int) -> None:
    session.execute(text("INSERT INTO public.meet_log (job_id) VALUES (:j)"), {"j": job_id})


@pytest.mark.slow  # 115 cases, each a burst worker: minutes; in .ci/run (tests/run.sh --slow)
@pytest.mark.parametrize(("kind", "other"), CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_each_kind_of_job_keeps_its_rule_through_each_run_feature(
    engine: Engine, kind: str, other: str
) -> None:
    kinds = (kind, other) if other in KINDS else (kind,)
    Meeting(engine, kinds, None if other in KINDS else other).play()


# -- the enqueue paths meet the options other features read -------------------------------------

CLI_PATH = "sqla-queue enqueue"


def write_on(path: str, engine: Engine, row: dict[str, Any]) -> None:
    """Write `row` by `path` (one of EVERY_PATH, or the CLI), in a transaction of its own."""
    if path != CLI_PATH:
        EVERY_PATH[path](engine, row)
        return
    options = ["--queue", row["queue"]]
    for parent in row.get("depends_on", []):
        options += ["--after", str(parent)]
    for option in ("partition", "sequence", "about"):
        if option in row:
            options += [f"--{option}", row[option]]
    if row.get("unique"):
        options.append("--unique")
    url = engine.url.render_as_string(hide_password=False)
    result = cli("enqueue", row["task"], *options, url=url, catch=True)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("path", [*sorted(EVERY_PATH), CLI_PATH])
def test_every_path_writes_the_options_features_read(engine: Engine, path: str) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE)
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t", {}, flush=True).id
    row = {
        "task": "child",
        "queue": QUEUE,
        "depends_on": [parent],
        "partition": "tenant-1",
        "sequence": SEQUENCE,
        "about": ABOUT,
        "unique": True,
    }
    write_on(path, engine, row)
    (job,) = jobs_of_task(engine, "child")
    job_id = job.id
    assert (job.status, job.partition, job.sequence, job.about) == (
        "waiting",
        "tenant-1",
        SEQUENCE,
        ABOUT,
    )
    assert job.unique_key is not None
    with engine.connect() as conn:
        parents = conn.execute(
            text("SELECT parent_id FROM sqla_queue.job_deps WHERE child_id = :c"), {"c": job_id}
        ).scalars()
        assert list(parents) == [parent]
    write_on(path, engine, row)
    assert [j.id for j in jobs_of_task(engine, "child")] == [job_id]  # the duplicate found it


@pytest.mark.parametrize("path", sorted(EVERY_PATH))
def test_every_path_replaces_the_args_of_a_holder_that_has_not_started(
    engine: Engine, path: str
) -> None:
    unique = Unique(key=KEY, args=[], on_conflict="replace")
    with Session(engine) as session, session.begin():
        holder = enqueue(session, "t", {"v": 1}, unique=unique, delay=3600, flush=True).id
    write_on(path, engine, {"task": "t", "args": {"v": 2}, "unique": unique})
    (job,) = jobs_by_id(engine).values()
    assert (job.id, job.args) == (holder, {"v": 2})
    assert job.run_at < job.created_at + dt.timedelta(minutes=1)  # replace: due now, not later


# -- debounce, unique, workflows and sequences meet each other, fair queues and brokers ----------


def test_a_replacing_call_while_the_holder_runs_waits_in_the_holders_sequence(
    engine: Engine,
) -> None:
    # docs/unique.md: to have the duplicate of a running holder wait for the holder's end,
    # give the job the key as its sequence too
    unique = Unique(key=KEY, args=[], on_conflict="replace")
    with Session(engine) as session, session.begin():
        holder = enqueue(session, "t", {"v": 1}, unique=unique, sequence=KEY, flush=True).id
    with engine.connect() as conn:
        running = claim(conn, 10)
        assert [r["id"] for r in running] == [holder]
        with Session(engine) as session, session.begin():
            later = enqueue(session, "t", {"v": 2}, unique=unique, sequence=KEY, flush=True)
            later_id, duplicate = later.id, later.duplicate
        assert (later_id != holder, duplicate) == (True, False)
        assert jobs_by_id(engine, [holder])[holder].args == {"v": 1}  # the running one untouched
        assert claim(conn, 10) == []  # the new job waits for the holder of its sequence
        finish(conn, running)
        assert [r["id"] for r in claim(conn, 10)] == [later_id]


@pytest.mark.parametrize("on_conflict", ["keep", "replace", "replace_args"])
def test_a_unique_job_of_any_on_conflict_is_refused_on_a_routed_queue(
    engine: Engine, on_conflict: str
) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE)
        admin.set_route(conn, QUEUE, "nats:jobs.meet")
    with Session(engine) as session, pytest.raises(InvalidJobError, match="routed to a broker"):
        enqueue(session, "t", {}, queue=QUEUE, unique=Unique(on_conflict=on_conflict))
    assert jobs_by_id(engine) == {}


def test_a_dependency_on_a_job_of_a_routed_queue_is_refused(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE)
        admin.set_route(conn, QUEUE, "nats:jobs.meet")
    with Session(engine) as session, session.begin():
        routed = enqueue(session, "t", {}, queue=QUEUE, flush=True).id
    refused = f"job {routed} is in a queue routed to a broker"
    with Session(engine) as session, pytest.raises(DependencyError, match=refused):
        enqueue(session, "t", {}, depends_on=[routed], flush=True)
    assert list(jobs_by_id(engine)) == [routed]


def test_in_a_fair_aging_queue_the_aged_job_of_a_partition_goes_first(engine: Engine) -> None:
    # docs/fairness.md: in a fair queue aging orders the claim's chosen jobs
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE)
        partitions.set_fair(conn, QUEUE, True)
        partitions.set_aging(conn, QUEUE, 60)
    with Session(engine) as session, session.begin():
        old = enqueue(session, "t", {}, queue=QUEUE, partition="a", priority=9, flush=True).id
        enqueue(session, "t", {}, queue=QUEUE, partition="b", priority=0)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET run_at = now() - interval '10 minutes' WHERE id = :i"),
            {"i": old},
        )
    with engine.connect() as conn:
        (first,) = claim(conn, 1, [QUEUE])
    assert first["id"] == old


def test_a_unique_periodic_task_enqueues_no_duplicate_of_a_waiting_slot(engine: Engine) -> None:
    registry = Registry()
    registry.periodic(every=dt.timedelta(hours=1), name="hourly", unique=True)(lambda: None)
    scheduler = Scheduler(registry, engine, "test")
    noon, one = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone.utc), dt.timedelta(hours=1)
    record_run(engine, "hourly", noon - one)
    looked = noon + dt.timedelta(minutes=1)
    assert scheduler.tick(now=looked) == [("hourly", noon)]
    assert scheduler.tick(now=looked + one, current_from=looked) == [("hourly", noon + one)]
    (job_id,) = jobs_by_id(engine)  # the 13:00 slot found 12:00's job still queued
    with engine.connect() as conn:
        slots = conn.execute(
            text(
                "SELECT slot, job_id FROM sqla_queue.periodic_slots "
                "WHERE job_id IS NOT NULL ORDER BY slot"
            )
        ).all()
    assert [tuple(s) for s in slots] == [(noon, job_id), (noon + one, job_id)]


# -- run features meet each other ----------------------------------------------------------------


def run_one(engine: Engine, registry: Registry) -> None:
    run_until_empty(engine, registry, WorkerConfig(concurrency=1, batch=1, poll_only=True))


def test_a_snooze_raised_after_the_timeout_is_a_timeout(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="late", timeout=TIMEOUT, retry=LATER)
    def late() -> None:
        time.sleep(TIMEOUT * 4)
        raise Snooze(60)

    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "late", {}, max_attempts=3, flush=True).id
    run_one(engine, registry)
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 1, 3)  # an attempt spent
    assert "JobTimeoutError" in (job.last_error or "")


def test_bulk_retry_by_error_finds_the_timed_out_jobs(engine: Engine) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="slow", timeout=TIMEOUT, pass_context=True)
    def slow(ctx: JobContext) -> None:
        ran.append(ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(TIMEOUT * 4)

    with Session(engine) as session, session.begin():
        timed_out = enqueue(session, "slow", {}, max_attempts=1, flush=True).id
        other = enqueue(session, "failing", {}, max_attempts=1, flush=True).id
    registry.task(name="failing")(lambda: 1 / 0)
    run_one(engine, registry)
    assert {j.id: j.status for j in jobs_by_id(engine).values()} == {
        timed_out: "failed",
        other: "failed",
    }
    result = bulk_retry(engine, JobFilter(error="JobTimeoutError"))
    assert (result.acted, result.skipped) == (1, 0)
    run_one(engine, registry)
    assert ran == [1, 2]
    assert jobs_by_id(engine, [other])[other].status == "failed"


def test_a_snoozed_job_cancelled_before_it_is_due_never_runs(engine: Engine) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="later", pass_context=True)
    def later(ctx: JobContext) -> None:
        ran.append(ctx.attempt)
        raise Snooze(3600)

    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "later", {}, flush=True).id
    run_one(engine, registry)
    with engine.begin() as conn:
        assert admin.cancel_jobs(conn, [job_id]) == {job_id: "queued"}
    make_due(engine)
    run_one(engine, registry)
    assert ran == [1]
    assert jobs_by_id(engine)[job_id].status == "cancelled"


def test_bulk_cancel_by_filter_takes_a_snoozed_job(engine: Engine) -> None:
    registry = Registry()
    registry.task(name="later")(lambda: (_ for _ in ()).throw(Snooze(3600)))
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "later", {}, flush=True).id
    run_one(engine, registry)
    assert jobs_by_id(engine)[job_id].status == "queued"
    result = bulk_cancel(engine, JobFilter(task="later"))
    assert result.acted == 1
    assert jobs_by_id(engine)[job_id].status == "cancelled"


def kept_results_registry(ran: list[int], fail_first: bool, snooze_first: bool) -> Registry:
    registry = Registry()

    @registry.task(name="kept", keep_result=True, retry=LATER, pass_context=True)
    def kept(ctx: JobContext) -> dict[str, int]:
        ran.append(ctx.attempt)
        if len(ran) == 1 and fail_first:
            raise RuntimeError("the first attempt fails")
        if len(ran) == 1 and snooze_first:
            raise Snooze(3600)
        return {"attempt": ctx.attempt}

    return registry


@pytest.mark.parametrize("first", ["fails", "snoozes"])
def test_the_result_kept_is_the_one_of_the_run_that_succeeded(engine: Engine, first: str) -> None:
    ran: list[int] = []
    registry = kept_results_registry(ran, first == "fails", first == "snoozes")
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE, retention="keep")
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "kept", {}, queue=QUEUE, flush=True).id
    run_one(engine, registry)
    assert jobs_by_id(engine)[job_id].result is None  # nothing kept before it succeeded
    make_due(engine)
    run_one(engine, registry)
    assert ran == [1, 2]
    assert wait_for(engine, job_id, timeout=0) == {"attempt": 2}


def test_bulk_delete_by_filter_takes_a_kept_result_and_wait_for_says_so(engine: Engine) -> None:
    ran: list[int] = []
    registry = kept_results_registry(ran, fail_first=False, snooze_first=False)
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE, retention="keep")
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "kept", {}, queue=QUEUE, flush=True).id
    run_one(engine, registry)
    assert wait_for(engine, job_id, timeout=0) == {"attempt": 1}
    assert bulk_delete(engine, JobFilter(task="kept", status="done")).acted == 1
    with pytest.raises(ResultMissingError):
        wait_for(engine, job_id, timeout=0)


def meet_log_registry(after_commit: Callable[[], None] | None) -> Registry:
    registry = Registry()

    @registry.task(name="writes", retry=LATER, pass_context=True)
    def writes(ctx: JobContext) -> None:
        with ctx.session() as session:
            session.execute(
                text("INSERT INTO public.meet_log (job_id) VALUES (:j)"), {"j": ctx.job_id}
            )
            session.commit()
        if after_commit is not None:
            after_commit()

    return registry


def meet_log(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT job_id FROM public.meet_log")).scalars())


def raise_snooze() -> None:
    raise Snooze(3600)


def raise_error() -> None:
    raise RuntimeError("after the commit")


@pytest.mark.parametrize("then", [raise_snooze, raise_error], ids=["snooze", "error"])
def test_a_handler_that_snoozes_or_raises_after_its_session_committed_stays_done(
    engine: Engine, then: Callable[[], None]
) -> None:
    # docs: the commit finishes the job; the worker does not finish it again
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE, retention="keep")
        conn.execute(text("CREATE TABLE public.meet_log (job_id bigint NOT NULL)"))
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "writes", {}, queue=QUEUE, flush=True).id
    run_one(engine, meet_log_registry(then))
    make_due(engine)
    run_one(engine, meet_log_registry(then))
    assert jobs_by_id(engine)[job_id].status == "done"
    assert meet_log(engine) == [job_id]  # written once, never run again


def test_a_handler_cancelled_while_it_runs_cannot_commit_its_session(engine: Engine) -> None:
    started, cancelled = threading.Event(), threading.Event()
    lost: list[str] = []
    registry = Registry()

    @registry.task(name="writes", pass_context=True)
    def writes(ctx: JobContext) -> None:
        started.set()
        assert cancelled.wait(DEADLINE)
        try:
            with ctx.session() as session:
                session.execute(
                    text("INSERT INTO public.meet_log (job_id) VALUES (:j)"), {"j": ctx.job_id}
                )
                session.commit()
        except JobLostError as exc:
            lost.append(str(exc))
            raise

    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.meet_log (job_id bigint NOT NULL)"))
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "writes", {}, flush=True).id
    with WorkerThread(engine, registry, concurrency=1):
        assert started.wait(DEADLINE)
        with engine.begin() as conn:
            assert admin.cancel_jobs(conn, [job_id]) == {job_id: "running"}
        cancelled.set()
        wait_until(lambda: lost, timeout=DEADLINE)
    assert len(lost) == 1
    assert meet_log(engine) == []  # the writes rolled back with the refused finish
    assert jobs_by_id(engine)[job_id].status == "cancelled"


@pytest.mark.parametrize("via", ["admin", "api"])
def test_bulk_retry_reruns_a_job_whose_session_rolled_back(engine: Engine, via: str) -> None:
    """By `bulk_retry`, or through the HTTP API's `POST /api/jobs/retry`."""
    registry = Registry()

    @registry.task(name="writes", pass_context=True)
    def writes(ctx: JobContext) -> None:
        with ctx.session() as session:
            session.execute(
                text("INSERT INTO public.meet_log (job_id) VALUES (:j)"), {"j": ctx.job_id}
            )
            if ctx.attempt == 1:
                raise RuntimeError("fails before its commit")
            session.commit()

    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.meet_log (job_id bigint NOT NULL)"))
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "writes", {}, max_attempts=1, flush=True).id
    run_one(engine, registry)
    assert (jobs_by_id(engine)[job_id].status, meet_log(engine)) == ("failed", [])
    if via == "admin":
        assert bulk_retry(engine, JobFilter(task="writes", status="failed")).acted == 1
    else:
        answer = TestClient(create_app(engine, api_tokens="meet:admin")).post(
            "/api/jobs/retry",
            json={"task": "writes", "status": ["failed"]},
            headers={"Authorization": "Bearer meet"},
        )
        assert answer.json()["acted"] == 1
    run_one(engine, registry)
    assert meet_log(engine) == [job_id]
    assert job_id not in jobs_by_id(engine)  # done, and deleted by the default retention


def test_a_broker_jobs_context_has_no_session() -> None:
    ctx = JobContext(7, "t", QUEUE, 1, session_factory=_no_session)
    with pytest.raises(ConfigurationError, match="came from a broker: it has no row"):
        ctx.session()


# -- brokers: what stays in the table -----------------------------------------------------------


def routed_queue(engine: Engine) -> None:
    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE)
        admin.set_route(conn, QUEUE, "nats:jobs.meet")


def test_cancel_acts_on_a_routed_queues_jobs_still_in_the_table_only(engine: Engine) -> None:
    routed_queue(engine)
    with Session(engine) as session, session.begin():
        by_id, by_filter, by_row = (
            enqueue(session, "t", {}, queue=QUEUE, flush=True).id,
            enqueue(session, "u", {}, queue=QUEUE, flush=True).id,
            enqueue(session, "t", {}, queue=QUEUE, about=ABOUT, flush=True).id,
        )
    with engine.begin() as conn:
        assert admin.cancel_jobs(conn, [by_id, 10**9]) == {by_id: "queued"}  # not relayed yet
        assert cancel_jobs_about(conn, ABOUT) == [by_row]
    assert bulk_cancel(engine, JobFilter(queue=QUEUE, task="u")).acted == 1
    statuses = {j.id: j.status for j in jobs_by_id(engine).values()}
    assert statuses == {by_id: "cancelled", by_filter: "cancelled", by_row: "cancelled"}


def test_a_periodic_task_of_a_routed_queue_is_enqueued_for_the_relay(engine: Engine) -> None:
    routed_queue(engine)
    ran: list[str] = []
    registry = Registry()
    registry.periodic(every=dt.timedelta(hours=1), name="hourly", queue=QUEUE)(
        lambda: ran.append("table worker")
    )
    noon = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone.utc)
    record_run(engine, "hourly", noon - dt.timedelta(hours=1))
    assert Scheduler(registry, engine, "test").tick(now=noon) == [("hourly", noon)]
    (job,) = jobs_by_id(engine).values()
    assert (job.queue, job.status) == (QUEUE, "queued")
    run_one(engine, Registry())  # a table worker never claims a routed queue's job
    assert jobs_by_id(engine)[job.id].status == "queued"


def test_a_job_cancelled_while_it_runs_past_its_timeout_stays_cancelled(engine: Engine) -> None:
    started = threading.Event()
    registry = Registry()

    cancelled = threading.Event()

    # A timeout the cancel comes well within on a loaded machine (at 0.3 s the timeout's
    # retry came first under load), and a handler that runs past it whatever the load.
    @registry.task(name="slow", timeout=OVERRUN_TIMEOUT, retry=LATER, keep_result=True)
    def slow() -> str:
        started.set()
        cancelled.wait(DEADLINE)
        time.sleep(OVERRUN_TIMEOUT)
        return "late"

    with engine.begin() as conn:
        admin.create_queue(conn, QUEUE, retention="keep")
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "slow", {}, queue=QUEUE, flush=True).id
    with WorkerThread(engine, registry, concurrency=1):  # its stop waits for the handler
        assert started.wait(DEADLINE)
        with engine.begin() as conn:
            assert admin.cancel_jobs(conn, [job_id]) == {job_id: "running"}
        cancelled.set()
    job = jobs_by_id(engine)[job_id]
    assert (job.status, job.result) == ("cancelled", None)  # neither retried nor a result kept
    with pytest.raises(JobFailedError, match="ended cancelled"):
        wait_for(engine, job_id, timeout=0)
