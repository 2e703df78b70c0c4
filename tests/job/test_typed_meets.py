"""Where typed tasks and start deadlines meet the other features (tests/system/pairs.toml):
unique keys over converted args, retries and snoozes rebuilding the values, a deadline
checked by every kind of claim (limited, fair, aging queues), sequences going on past an
expired job, a deadline refused on a routed queue."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from helpers.support import record_run
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import (
    ConfigurationError,
    InvalidJobError,
    JobContext,
    JobFailedError,
    Registry,
    RetryPolicy,
    Snooze,
    Unique,
    Worker,
    WorkerConfig,
    admin,
    enqueue,
    wait_for,
)
from sqla_queue.admin import partitions
from sqla_queue.testing import DrainResult, drain, run_until_empty

WHEN = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone.utc)
KEY = uuid.UUID("12345678-1234-5678-1234-567812345678")
PAST = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
NO_WAIT = RetryPolicy(base=0.0, jitter=0.0)
BURST = WorkerConfig(concurrency=1, batch=1, poll_only=True)


def query_rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


# -- typed arguments --------------------------------------------------------------------------


def test_a_unique_key_is_the_same_for_a_value_and_its_json(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="once", unique=True)
    def once(when: dt.datetime, key: uuid.UUID) -> None: ...

    with Session(engine) as session, session.begin():
        first = once.defer(session, when=WHEN, key=KEY)
        by_json = enqueue(
            session, "once", {"when": WHEN.isoformat(), "key": str(KEY)}, registry=registry
        )
        other = once.defer(session, when=WHEN + dt.timedelta(seconds=1), key=KEY)
        assert by_json.duplicate
        assert by_json.id == first.id
        assert not other.duplicate


def test_debounce_replaces_the_args_with_the_converted_values(engine: Engine) -> None:
    registry = Registry()
    seen: list[dt.datetime] = []

    @registry.task(name="settle", unique=Unique(args=["account"], on_conflict="replace_args"))
    def settle(account: int, when: dt.datetime) -> None:
        seen.append(when)

    with Session(engine) as session, session.begin():
        settle.defer(session, account=1, when=PAST)
        settle.defer(session, account=1, when=WHEN)
    assert drain(engine, registry) == DrainResult(succeeded=1)
    assert seen == [WHEN]


def test_a_retried_or_snoozed_attempt_gets_the_values_rebuilt_again(engine: Engine) -> None:
    registry = Registry()
    seen: list[tuple[int, object]] = []

    @registry.task(name="flaky", retry=NO_WAIT, max_attempts=3, pass_context=True)
    def flaky(ctx: JobContext, when: dt.datetime) -> None:
        seen.append((ctx.attempt, when))
        if ctx.attempt == 1:
            raise RuntimeError("once")
        if ctx.attempt == 2 and len(seen) == 2:
            raise Snooze(0)

    with Session(engine) as session, session.begin():
        flaky.defer(session, when=WHEN)
    for _ in range(4):
        drain(engine, registry, include_scheduled=True)
    assert [w for _, w in seen] == [WHEN] * len(seen)
    assert len(seen) == 3


def test_a_kept_result_and_ctx_session_work_with_typed_arguments(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="typed_result", keep_result=True, pass_context=True)
    def typed_result(ctx: JobContext, when: dt.datetime, key: uuid.UUID) -> str:
        with ctx.session() as session:
            session.execute(text("SELECT 1"))
        return f"{when.year}-{key.hex[:4]}"

    with Session(engine) as session, session.begin():
        job = typed_result.defer(session, when=WHEN, key=KEY)
        session.flush()
        job_id = job.id
    assert run_until_empty(engine, registry, BURST).succeeded == 1
    assert wait_for(engine, job_id, timeout=10) == "2026-1234"


def test_a_workflow_signature_takes_typed_values(engine: Engine) -> None:
    registry = Registry()
    seen: list[dt.datetime] = []

    @registry.task(name="step")
    def step(when: dt.datetime) -> None:
        seen.append(when)

    from sqla_queue.enqueue.workflows import chain

    with Session(engine) as session, session.begin():
        chain(step.s(when=WHEN), step.s(when=PAST)).enqueue(session, registry=registry)
    assert drain(engine, registry) == DrainResult(succeeded=2)
    assert seen == [WHEN, PAST]


# -- start deadlines --------------------------------------------------------------------------


def test_an_expired_unique_job_frees_its_key(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="one", unique=True)
    def one(n: int) -> None: ...

    with Session(engine) as session, session.begin():
        one.using(expires_at=PAST).defer(session, n=1)
    assert drain(engine, registry) == DrainResult()
    with Session(engine) as session, session.begin():
        again = one.defer(session, n=1)
    assert not again.duplicate


def test_a_retry_due_after_the_deadline_runs_the_deadline_is_for_the_first_start(
    engine: Engine,
) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task(name="late", retry=NO_WAIT, max_attempts=5, pass_context=True)
    def late(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        raise RuntimeError("fails")

    with Session(engine) as session, session.begin():
        late.using(expires_in=3600).defer(session)
    drain(engine, registry, max_jobs=1)
    with engine.begin() as conn:  # the deadline passes while the retry waits
        conn.execute(text("UPDATE sqla_queue.jobs SET expires_at = now() - interval '1 s'"))
    drain(engine, registry, include_scheduled=True, max_jobs=1)
    assert runs == [1, 2]
    ((status, attempts, error),) = query_rows(
        engine, "SELECT status, attempts, last_error FROM sqla_queue.jobs"
    )
    assert (status, attempts) == ("queued", 2)
    assert "RuntimeError" in error


def test_a_snoozed_job_past_its_deadline_runs_on(engine: Engine) -> None:
    registry = Registry()
    runs: list[int] = []

    @registry.task(name="sleepy")
    def sleepy() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise Snooze(0)

    with Session(engine) as session, session.begin():
        sleepy.using(expires_in=3600).defer(session)
    drain(engine, registry, max_jobs=1)
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET expires_at = now() - interval '1 s'"))
    drain(engine, registry, include_scheduled=True)
    assert runs == [1, 1]
    assert query_rows(engine, "SELECT status FROM sqla_queue.jobs") == []  # done, deleted


@pytest.mark.parametrize("setting", ["max_running", "fair", "aging"])
def test_every_kind_of_claim_cancels_an_expired_job(engine: Engine, setting: str) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="limited", queue="lim")
    def limited(n: int) -> None:
        ran.append(n)

    with engine.begin() as conn:
        admin.create_queue(conn, "lim")
        if setting == "max_running":
            admin.set_max_running(conn, "lim", 2)
        elif setting == "fair":
            partitions.set_fair(conn, "lim")
        else:
            partitions.set_aging(conn, "lim", 60)
    with Session(engine) as session, session.begin():
        limited.using(expires_at=PAST, partition="a").defer(session, n=1)
        limited.using(expires_in=3600, partition="a").defer(session, n=2)
    assert drain(engine, registry) == DrainResult(succeeded=1)
    assert ran == [2]
    assert query_rows(engine, "SELECT args->>'n', status, last_error FROM sqla_queue.jobs") == [
        ("1", "cancelled", "expired")
    ]


def test_a_sequence_goes_on_past_an_expired_job(engine: Engine) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="ordered")
    def ordered(n: int) -> None:
        ran.append(n)

    with Session(engine) as session, session.begin():
        ordered.using(sequence="s", expires_at=PAST).defer(session, n=1)
        ordered.using(sequence="s").defer(session, n=2)
    assert drain(engine, registry) == DrainResult(succeeded=1)
    assert ran == [2]


def test_a_job_waiting_on_an_expired_job_is_cancelled_with_it(engine: Engine) -> None:
    registry = Registry()
    ran: list[str] = []

    @registry.task(name="parent")
    def parent() -> None:
        ran.append("parent")

    @registry.task(name="child")
    def child() -> None:
        ran.append("child")

    with Session(engine) as session, session.begin():
        first = parent.using(expires_at=PAST).defer(session)
        child.using(depends_on=[first]).defer(session)
    drain(engine, registry)
    assert ran == []
    assert query_rows(engine, "SELECT task, status FROM sqla_queue.jobs ORDER BY id") == [
        ("parent", "cancelled"),
        ("child", "cancelled"),
    ]


def test_a_deadline_is_refused_on_a_routed_queue_and_the_transaction_goes_on(
    engine: Engine,
) -> None:
    registry = Registry()

    @registry.task(name="relayed", queue="out")
    def relayed(n: int) -> None: ...

    with engine.begin() as conn:
        admin.create_queue(conn, "out")
        admin.set_route(conn, "out", "nats:jobs.out")
    with Session(engine) as session:
        relayed.defer(session, n=1)
        with pytest.raises(InvalidJobError) as raised:
            relayed.using(expires_in=60).defer(session, n=2)
        with engine.connect() as conn, pytest.raises(InvalidJobError):
            relayed.using(expires_in=60).defer(conn, n=3)
        session.commit()
    assert "a start deadline is not kept" in str(raised.value)
    assert query_rows(engine, "SELECT args->>'n' FROM sqla_queue.jobs") == [("1",)]


def test_cancelling_or_retrying_a_job_with_a_deadline_keeps_the_deadline(engine: Engine) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.task(name="kept")
    def kept(n: int) -> None:
        ran.append(n)

    with Session(engine) as session, session.begin():
        job = kept.using(expires_at=PAST).defer(session, n=1)
        session.flush()
        job_id = job.id
    drain(engine, registry)
    with engine.begin() as conn:
        assert admin.retry_jobs(conn, [job_id])
    drain(engine, registry)  # still past its deadline: cancelled again, never run
    assert ran == []
    assert query_rows(engine, "SELECT status, last_error FROM sqla_queue.jobs") == [
        ("cancelled", "expired")
    ]


def test_the_typed_call_takes_about_and_jobs_show_it(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="about_order")
    def about_order(when: dt.datetime) -> None: ...

    with Session(engine) as session, session.begin():
        about_order.using(about="orders:42").defer(session, when=WHEN)
    assert query_rows(engine, "SELECT about, args->>'when' FROM sqla_queue.jobs") == [
        ("orders:42", "2026-03-01T12:30:00Z")
    ]


def test_a_periodic_task_takes_typed_args_and_a_default_deadline(engine: Engine) -> None:
    registry = Registry()
    seen: list[object] = []

    @registry.periodic(
        every=dt.timedelta(hours=1),
        name="typed_hourly",
        args={"on": dt.date(2026, 1, 2)},
        expires_in=3600,
    )
    def typed_hourly(on: dt.date) -> None:
        seen.append(on)

    with pytest.raises(ConfigurationError, match="argument 'on'"):
        registry.periodic(every=60, name="bad_hourly", args={"on": "someday"})(typed_hourly.func)
    last = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    record_run(engine, "typed_hourly", last - dt.timedelta(hours=2))
    stats = Worker(engine, registry, WorkerConfig(burst=True, poll_only=True)).run()
    assert stats.succeeded == 1
    assert seen == [dt.date(2026, 1, 2)]


def test_a_debounced_holder_keeps_its_own_deadline(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="bounce", unique=Unique(args=["account"], on_conflict="replace_args"))
    def bounce(account: int, n: int) -> None: ...

    with Session(engine) as session, session.begin():
        bounce.using(expires_in=3600).defer(session, account=1, n=1)
        bounce.using(expires_at=PAST).defer(session, account=1, n=2)
    assert query_rows(engine, "SELECT args->>'n', expires_at > now() FROM sqla_queue.jobs") == [
        ("2", True)
    ]


def test_waiting_for_an_expired_job_raises_job_failed(engine: Engine) -> None:
    registry = Registry()

    @registry.task(name="awaited", keep_result=True)
    def awaited() -> int:
        return 1

    with Session(engine) as session, session.begin():
        job = awaited.using(expires_at=PAST).defer(session)
        session.flush()
        job_id = job.id
    drain(engine, registry)
    with pytest.raises(JobFailedError, match="expired"):
        wait_for(engine, job_id, timeout=10)
