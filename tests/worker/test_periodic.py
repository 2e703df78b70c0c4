"""Periodic jobs without a leader (issue 9): one job per slot whatever the workers; catch-up."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import re
import time
from collections import Counter
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from helpers.support import WorkerThread, count_where, record_run, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from sqla_queue import ConfigurationError, Registry, admin
from sqla_queue.cli import main
from sqla_queue.job.schedule import Schedule
from sqla_queue.worker import Worker, WorkerConfig, periodic
from sqla_queue.worker.periodic import LATE_MARGIN, MAX_TICK, MIN_TICK, Scheduler

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def every_second(catch_up: int | dt.timedelta = 1) -> Registry:
    registry = Registry()
    registry.periodic(every=1, name="tick", catch_up=catch_up)(lambda: None)
    return registry


def enqueued_slots(engine: Engine, task: str = "tick") -> list[dt.datetime]:
    """The slots of the jobs enqueued for `task`, one entry per job (from their meta)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT meta->>'periodic_slot' FROM sqla_queue.all_jobs WHERE task = :t"),
            {"t": task},
        ).scalars()
        return sorted(dt.datetime.fromisoformat(value) for value in rows)


def test_every_slot_after_the_last_look_is_due_and_missed_ones_are_capped() -> None:
    schedule = Schedule("t", every=1)
    seconds = [T0 + dt.timedelta(seconds=s) for s in range(11)]
    now = seconds[10] + dt.timedelta(milliseconds=300)
    # looked at 2 s ago, the last run was 10 s ago: 2 current slots and the last missed one
    assert schedule.due(now, seconds[0], seconds[8]) == seconds[8:11]
    assert Schedule("t", every=1, catch_up=3).due(now, seconds[0], seconds[8]) == seconds[6:11]
    assert Schedule("t", every=1, catch_up=0).due(now, seconds[0], seconds[8]) == seconds[9:11]
    window = Schedule("t", every=1, catch_up=dt.timedelta(seconds=4))
    assert window.due(now, seconds[0], now) == seconds[7:11]
    assert schedule.due(now, None, now) == []  # never ran: nothing was missed


def test_cron_slots_follow_the_time_zone_across_daylight_saving() -> None:
    paris = Schedule("t", cron="0 3 * * *", timezone="Europe/Paris")
    winter = paris.next_after(dt.datetime(2026, 1, 10, tzinfo=UTC))
    summer = paris.next_after(dt.datetime(2026, 7, 10, tzinfo=UTC))
    assert (winter.hour, summer.hour) == (2, 1)  # 03:00 in Paris is 02:00 / 01:00 UTC
    assert next(paris.slots_back(summer)) == summer
    assert next(paris.slots_back(summer - dt.timedelta(seconds=1))) == summer - dt.timedelta(days=1)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({}, "pass cron="),
        ({"cron": "* * * * *", "every": 5}, "pass cron="),
        ({"cron": "61 * * * *"}, "cron '61 * * * *' is not valid"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "no time zone 'Mars/Olympus'"),
        ({"every": 0.5}, "every must be at least 1 second"),
        ({"every": "often"}, "every is seconds or a timedelta"),
        ({"every": 5, "catch_up": -1}, "catch_up is a number of slots"),
    ],
)
def test_bad_schedules_are_refused_by_name_at_registration(
    options: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        Registry().periodic(name="t", **options)(lambda: None)  # type: ignore[arg-type]


def test_schedulers_racing_for_the_same_slots_enqueue_each_once(engine: Engine) -> None:
    registry = every_second()
    record_run(engine, "tick", T0)
    now = T0 + dt.timedelta(seconds=5, milliseconds=500)
    schedulers = [Scheduler(registry, engine, f"w{i}") for i in range(4)]
    won = [s.tick(now, T0 + dt.timedelta(seconds=3)) for s in schedulers]
    assert sorted(slot for mine in won for _, slot in mine) == [
        T0 + dt.timedelta(seconds=s) for s in (3, 4, 5)
    ]
    assert enqueued_slots(engine) == [T0 + dt.timedelta(seconds=s) for s in (3, 4, 5)]


@pytest.mark.parametrize(
    ("catch_up", "caught_up"),
    [(1, [20]), (3, [18, 19, 20]), (0, []), (dt.timedelta(seconds=2.5), [18, 19, 20])],
)
def test_a_scheduler_after_a_window_without_workers_catches_up_as_configured(
    engine: Engine, catch_up: int | dt.timedelta, caught_up: list[int]
) -> None:
    record_run(engine, "tick", T0)  # then no worker for 20 s
    now = T0 + dt.timedelta(seconds=20, milliseconds=400)
    Scheduler(every_second(catch_up), engine, "w").tick(now, now)  # its first look
    assert enqueued_slots(engine) == [T0 + dt.timedelta(seconds=s) for s in caught_up]


def test_four_workers_on_a_one_second_schedule_enqueue_exactly_one_job_per_slot(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    registry = every_second()
    started = dt.datetime.now(UTC)
    workers = [WorkerThread(engine, registry, concurrency=1) for _ in range(4)]
    for worker in workers:
        worker.thread.start()
    # ten one-second slots, eight of them run: waited for, not a sleep (a loaded machine's
    # schedulers and handlers may lag; what they decide is the test, not how soon)
    wait_for(lambda: len(enqueued_slots(engine)) >= 10, timeout=120)
    wait_for(lambda: count_where(engine, "task = 'tick' AND status = 'done'") >= 8)
    for worker in workers:
        worker.stop()
    slots = enqueued_slots(engine)
    assert max(Counter(slots).values()) == 1, Counter(slots).most_common(3)
    assert len(slots) >= 10
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert set(gaps) == {dt.timedelta(seconds=1)}  # none skipped
    # a schedule that never ran starts once a worker runs (give or take the lateness margin)
    assert slots[0] > started - LATE_MARGIN


@pytest.mark.parametrize("catch_up", [1, 3])
def test_a_worker_starting_after_a_window_without_workers_catches_up_as_configured(
    engine: Engine, catch_up: int
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    last_run = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(seconds=30)
    record_run(engine, "tick", last_run)
    with WorkerThread(engine, every_second(catch_up), concurrency=1):
        # the catch-up and the next slot after it: waited for, however late the scheduler
        wait_for(lambda: len(enqueued_slots(engine)) >= catch_up + 1)
    with engine.connect() as conn:
        looks = conn.execute(
            text(
                "SELECT enqueued_at, array_agg(slot ORDER BY slot) FROM sqla_queue.periodic_slots "
                "WHERE slot > :last GROUP BY enqueued_at ORDER BY enqueued_at"
            ),
            {"last": last_run},
        ).all()
    first_look, caught_up = looks[0]
    assert len(caught_up) == catch_up  # the newest missed slots, not the thirty missed
    assert caught_up[-1] <= first_look < caught_up[-1] + dt.timedelta(seconds=1)
    slots = enqueued_slots(engine)
    assert slots[:catch_up] == caught_up
    assert {b - a for a, b in itertools.pairwise(slots)} == {dt.timedelta(seconds=1)}


def test_periodic_list_shows_each_schedule_with_its_next_and_last_run(
    database_url: str, engine: Engine
) -> None:
    record_run(engine, "rates", T0)
    result = CliRunner().invoke(
        main,
        ["periodic", "list", "--app", "helpers.apps.periodic_app:registry", "--json"],
        env={"SQLA_QUEUE_DATABASE_URL": database_url},
    )
    assert result.exit_code == 0, result.output
    rows = {row["task"]: row for row in json.loads(result.stdout)}
    assert rows["nightly"]["schedule"] == "cron '0 3 * * *' Europe/Paris"
    assert rows["nightly"]["last_run"] is None
    assert rows["rates"]["schedule"] == "every 30s"
    assert dt.datetime.fromisoformat(rows["rates"]["last_run"]) == T0
    next_run = dt.datetime.fromisoformat(rows["nightly"]["next_run"])
    assert next_run > dt.datetime.now(UTC)
    assert next_run.astimezone(dt.timezone(dt.timedelta(hours=2))).hour in (3, 4)


def slots_from(schedule: Schedule, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The slots of `schedule` after `start` up to `end`, walked with next_after."""
    found: list[dt.datetime] = []
    at = start
    while (at := schedule.next_after(at)) <= end:
        found.append(at)
    return found


def at_local(zone: str, *fields: int, fold: int = 0) -> dt.datetime:
    """A wall-clock time in `zone` (fold=1: the second pass of a repeated hour), in UTC."""
    return dt.datetime(*fields, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


@pytest.mark.parametrize(
    ("zone", "cron", "day", "expected"),
    [
        # autumn: 02:00-03:00 happens twice in Paris; 02:30 runs once, in the first pass
        ("Europe/Paris", "30 2 * * *", (2026, 10, 25), [(2, 30, 0)]),
        # spring: 02:00-03:00 does not exist; 02:30 runs once, at 03:00 (as cron does)
        ("Europe/Paris", "30 2 * * *", (2026, 3, 29), [(3, 0, 0)]),
        ("Europe/Paris", "0,30 2 * * *", (2026, 3, 29), [(3, 0, 0)]),
        # a schedule on elapsed time (hour `*`) runs every 30 minutes through both passes
        (
            "Europe/Paris",
            "30 * * * *",
            (2026, 10, 25),
            [(h, 30, f) for h, f in [(1, 0), (2, 0), (2, 1), (3, 0)]],
        ),
        # Lord Howe moves its clocks by 30 minutes: 01:30-02:00 twice, 02:00-02:30 skipped
        ("Australia/Lord_Howe", "45 1 * * *", (2026, 4, 5), [(1, 45, 0)]),
        ("Australia/Lord_Howe", "15 2 * * *", (2026, 10, 4), [(2, 30, 0)]),
        (
            "Australia/Lord_Howe",
            "30 * * * *",
            (2026, 4, 5),
            [(h, 30, f) for h, f in [(1, 0), (1, 1), (2, 0), (3, 0)]],
        ),
    ],
)
def test_a_cron_slot_across_a_dst_change_runs_once_and_next_after_never_looks_back(
    zone: str, cron: str, day: tuple[int, int, int], expected: list[tuple[int, int, int]]
) -> None:
    schedule = Schedule("t", cron=cron, timezone=zone)
    start, end = at_local(zone, *day, 1), at_local(zone, *day, 4)
    slots = slots_from(schedule, start, end)
    assert slots == [at_local(zone, *day, h, m, fold=f) for h, m, f in expected]
    for minute in range(0, 3 * 60 * 60, 60):  # each minute of the night, either pass
        at = start + dt.timedelta(seconds=minute, microseconds=700)
        after, before = schedule.next_after(at), next(schedule.slots_back(at))
        assert before <= at < after
        assert schedule.next_after(before) == after  # no slot between the two


def test_during_the_second_pass_of_a_repeated_hour_the_next_slot_is_tomorrows() -> None:
    paris = Schedule("t", cron="30 2 * * *", timezone="Europe/Paris")
    second_pass = at_local("Europe/Paris", 2026, 10, 25, 2, 10, fold=1)
    assert paris.next_after(second_pass) == at_local("Europe/Paris", 2026, 10, 26, 2, 30)
    # the day's slot, run in the first pass, is the latest one: none is missed
    assert next(paris.slots_back(second_pass)) == at_local("Europe/Paris", 2026, 10, 25, 2, 30)
    # a scheduler looking then waits for the longest tick, not a past slot's 50 ms
    registry = Registry()
    registry.periodic(cron="30 2 * * *", timezone="Europe/Paris", name="t")(lambda: None)
    assert Scheduler(registry, None, "w").next_wait(second_pass) == MAX_TICK  # type: ignore[arg-type]


def test_a_scheduler_through_a_repeated_hour_looks_a_bounded_number_of_times(
    engine: Engine,
) -> None:
    registry = Registry()
    registry.periodic(cron="30 2 * * *", timezone="Europe/Paris", name="nightly")(lambda: None)
    record_run(engine, "nightly", at_local("Europe/Paris", 2026, 10, 24, 2, 30))
    scheduler = Scheduler(registry, engine, "w")
    # the loop of Scheduler._run on a simulated clock: each look takes no time
    start, end = (
        at_local("Europe/Paris", 2026, 10, 25, 2, 28),
        at_local("Europe/Paris", 2026, 10, 25, 2, 5, fold=1),
    )
    now, previous, looks, waits = start, None, 0, []
    while now < end:
        scheduler.tick(now, now if previous is None else previous - LATE_MARGIN)
        previous, looks = now, looks + 1
        waits.append(scheduler.next_wait(now))
        now += dt.timedelta(seconds=waits[-1])
    assert min(waits) >= MIN_TICK
    assert looks <= (end - start).total_seconds() // MAX_TICK + 20  # not one per 50 ms
    assert enqueued_slots(engine, "nightly") == [at_local("Europe/Paris", 2026, 10, 25, 2, 30)]


ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
CRON_FIELDS = {
    "minute": ["0", "30", "15,45", "*/20", "*", "0-10/5", "59"],
    "hour": ["2", "1-3", "*", "*/5", "0,2,23", "3", "1"],
    "weekday": ["*", "0", "1-5"],
}


def cron_values(text: str, low: int, high: int) -> set[int]:
    """The values one field of the crons above allows (`*`, `a`, `a-b`, `x/n`, `a,b`)."""
    values: set[int] = set()
    for part in text.split(","):
        span, _, step = part.partition("/")
        first, _, last = span.partition("-")
        start, end = (low, high) if span == "*" else (int(first), int(last or first))
        values.update(range(start, end + 1, int(step or 1)))
    return values


def matches(cron: str, wall: dt.datetime) -> bool:
    minute, hour, _, _, weekday = cron.split()
    return (
        wall.minute in cron_values(minute, 0, 59)
        and wall.hour in cron_values(hour, 0, 23)
        and (wall.weekday() + 1) % 7 in cron_values(weekday, 0, 6)
        and wall.second == wall.microsecond == 0
    )


def transitions(zone: ZoneInfo, year: int) -> list[dt.datetime]:
    """The instants of `year` at which `zone`'s UTC offset changes (to the minute)."""
    found = []
    at = dt.datetime(year, 1, 1, tzinfo=UTC)
    while at.year == year:
        step = at + dt.timedelta(hours=1)
        if at.astimezone(zone).utcoffset() != step.astimezone(zone).utcoffset():
            while step - at > dt.timedelta(minutes=1):  # bisect to the minute
                middle = at + (step - at) / 2
                same = at.astimezone(zone).utcoffset() == middle.astimezone(zone).utcoffset()
                at, step = (middle, step) if same else (at, middle)
            found.append(step.replace(second=0, microsecond=0))
        at = step
    return found


CHANGES = {name: transitions(ZoneInfo(name), 2026) for name in ZONES}


@st.composite
def schedules_and_instants(draw: st.DrawFn) -> tuple[Schedule, dt.datetime]:
    zone = draw(st.sampled_from(ZONES))
    if draw(st.booleans()):
        fields = {name: draw(st.sampled_from(values)) for name, values in CRON_FIELDS.items()}
        cron = f"{fields['minute']} {fields['hour']} * * {fields['weekday']}"
        schedule = Schedule("t", cron=cron, timezone=zone)
    else:
        every = draw(st.floats(1, 3 * 86400, allow_nan=False) | st.integers(1, 86400))
        schedule = Schedule("t", every=float(every))
    near = draw(st.sampled_from(CHANGES[zone] or [dt.datetime(2026, 3, 29, tzinfo=UTC)]))
    offset = draw(st.integers(-4 * 3600 * 10**6, 4 * 3600 * 10**6))
    return schedule, near + dt.timedelta(microseconds=offset)


@settings(max_examples=300, deadline=None)
@given(schedules_and_instants())
def test_slots_are_strictly_increasing_matching_times_and_next_after_is_after(
    case: tuple[Schedule, dt.datetime],
) -> None:
    schedule, at = case
    before = next(schedule.slots_back(at))
    assert before <= at < schedule.next_after(at)
    assert schedule.next_after(before) == schedule.next_after(at)  # none between the two
    slots = [schedule.next_after(at)]
    for _ in range(6):
        slots.append(schedule.next_after(slots[-1]))
    assert all(a < b for a, b in itertools.pairwise(slots))
    assert list(itertools.islice(schedule.slots_back(slots[-1]), 7)) == slots[::-1]
    if schedule.every is not None:
        step = dt.timedelta(seconds=schedule.every)
        assert all(b - a == step for a, b in itertools.pairwise(slots))
        return
    assert schedule.cron is not None
    zone = schedule.zone
    for slot in slots:
        wall = slot.astimezone(zone)
        gap = wall.utcoffset() - (slot - dt.timedelta(microseconds=1)).astimezone(zone).utcoffset()
        # a slot is a matching wall time, or the end of a spring gap holding one
        skipped = (wall.replace(tzinfo=None) - gap * (k / 60) for k in range(1, 61))
        assert matches(schedule.cron, wall) or (
            gap > dt.timedelta(0) and any(matches(schedule.cron, w) for w in skipped)
        ), (slot, wall)
    minute, hour = schedule.cron.split()[:2]
    if not minute.startswith("*") and not hour.startswith("*"):  # a time of day: once a day
        walls = [slot.astimezone(zone).replace(tzinfo=None) for slot in slots]
        assert all(a < b for a, b in itertools.pairwise(walls)), walls


def test_a_worker_whose_clock_is_ahead_enqueues_no_slot_before_its_time_by_the_database(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def ahead() -> dt.datetime:
        return dt.datetime.now(UTC) + dt.timedelta(seconds=1.5)

    monkeypatch.setattr(periodic, "_now", ahead)  # this worker's clock, 1.5 s fast
    record_run(engine, "tick", dt.datetime.now(UTC).replace(microsecond=0))
    log_level = caplog.at_level(logging.WARNING, "sqla_queue.periodic")
    began = time.monotonic()
    with log_level, WorkerThread(engine, every_second(), concurrency=1):
        wait_for(lambda: len(enqueued_slots(engine)) >= 2)  # two slots, however late
    took = time.monotonic() - began
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT slot, enqueued_at FROM sqla_queue.periodic_slots WHERE job_id IS NOT NULL")
        ).all()
    assert len(rows) >= 2
    early = [(slot, enqueued) for slot, enqueued in rows if enqueued < slot]
    assert early == []  # by the database's clock, never before its slot
    # the skew it measured: 1.5 s, plus at most the latency of its look (under load, 1.9 s)
    (ahead,) = re.findall(r"clock is ([0-9.]+) s ahead of the database's", caplog.text)
    assert 1.45 <= float(ahead) <= 1.55 + took


def test_a_burst_worker_runs_the_periodic_job_its_own_scheduler_found_due(engine: Engine) -> None:
    ran: list[str] = []
    registry = Registry()
    registry.periodic(every=dt.timedelta(hours=1), name="hourly")(lambda: ran.append("hourly"))
    last = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    record_run(engine, "hourly", last - dt.timedelta(hours=3))  # the last two hours missed
    stats = Worker(engine, registry, WorkerConfig(burst=True, poll_only=True)).run()
    assert ran == ["hourly"]  # the last missed slot, enqueued at the worker's start and run
    assert (stats.claimed, stats.succeeded) == (1, 1)
    with engine.connect() as conn:
        slots = conn.execute(
            text("SELECT slot FROM sqla_queue.periodic_slots WHERE job_id IS NOT NULL")
        ).scalars()
        assert list(slots) == [last]


def test_periodic_tasks_of_a_registrys_included_modules_are_listed_and_run(
    database_url: str, engine: Engine
) -> None:
    env = {"SQLA_QUEUE_DATABASE_URL": database_url}
    listed = CliRunner().invoke(
        main, ["periodic", "list", "--app", "helpers.apps.included_app:registry", "--json"], env=env
    )
    assert listed.exit_code == 0, listed.output
    assert [row["task"] for row in json.loads(listed.stdout)] == ["hourly_report"]
    last = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    record_run(engine, "hourly_report", last - dt.timedelta(hours=2))
    worked = CliRunner().invoke(
        main,
        ["worker", "--app", "helpers.apps.included_app:registry", "--burst", "--poll-only"],
        env=env,
    )
    assert worked.exit_code == 0, worked.output
    assert "done: 1 succeeded, 0 retried, 0 failed" in worked.stderr


def test_an_included_module_that_cannot_be_imported_is_named_in_one_line(
    database_url: str,
) -> None:
    result = CliRunner().invoke(
        main,
        ["periodic", "list", "--app", "helpers.apps.included_app:broken"],
        env={"SQLA_QUEUE_DATABASE_URL": database_url},
    )
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: Cannot load the task registry 'helpers.apps.included_app:broken': its include "
        "'helpers.apps.no_such_reports': no module named 'helpers.apps.no_such_reports' "
        "(is it on PYTHONPATH? run from its folder)"
    ]


@pytest.mark.parametrize("include", ["shop.emails", ["shop.emails", ""], [None]])
def test_a_registry_include_that_is_not_a_list_of_module_names_is_refused(
    include: object,
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape("include is a list of module names")):
        Registry(include=include)  # type: ignore[arg-type]


def test_periodic_list_piped_prints_every_task_name_whole(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "reports.nightly." + "long_segment_" * 10  # 146 characters
    (tmp_path / "long_names_app.py").write_text(
        "from sqla_queue import Registry\n"
        "registry = Registry()\n"
        f"registry.periodic(cron='0 3 * * *', name={name!r})(lambda: None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        main,
        ["periodic", "list", "--app", "long_names_app:registry"],
        env={"SQLA_QUEUE_DATABASE_URL": database_url},
    )
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if name in line]
    assert "cron '0 3 * * *'" in row


def test_a_periodic_task_whose_args_do_not_fit_its_handler_is_refused_at_registration() -> None:
    registry = Registry()
    with pytest.raises(ConfigurationError, match=r"periodic task 'nightly'.*unexpected argument x"):
        registry.periodic(every=60, args={"x": 1}, name="nightly")(lambda: None)
    registry.periodic(every=60, args={"x": 1}, name="fits")(lambda x: None)
    assert list(registry.schedules) == ["fits"]


def test_a_six_field_cron_is_refused_naming_the_five_field_form() -> None:
    # cronsim reads a sixth field as seconds, with other DST rules than the five-field form
    with pytest.raises(ConfigurationError, match="has six fields"):
        Schedule("t", cron="0 30 2 * * *", timezone="Europe/Paris")
