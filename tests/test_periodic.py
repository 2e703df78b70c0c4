"""Periodic jobs without a leader (issue 9): one job per slot whatever the workers; catch-up."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.support import WorkerThread, dispose_engines
from click.testing import CliRunner
from sqlalchemy import Engine, text

from sqla_queue import ConfigurationError, Registry, admin
from sqla_queue.cli import main
from sqla_queue.periodic import LATE_MARGIN, Schedule, Scheduler

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _dispose() -> Iterator[None]:
    yield
    dispose_engines()


def every_second(catch_up: int | dt.timedelta = 1) -> Registry:
    registry = Registry()
    registry.periodic(every=1, name="tick", catch_up=catch_up)(lambda: None)
    return registry


def enqueued_slots(engine: Engine, task: str = "tick") -> list[dt.datetime]:
    """The slots of the jobs enqueued for `task`, one entry per job (from their meta)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT meta->>'periodic_slot' FROM sqla_queue.jobs WHERE task = :t"), {"t": task}
        ).scalars()
        return sorted(dt.datetime.fromisoformat(value) for value in rows)


def record_run(engine: Engine, task: str, slot: dt.datetime) -> None:
    """Test-only: the periodic table as a worker that ran `slot` leaves it."""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO sqla_queue.periodic_slots (task, slot) VALUES (:t, :s)"),
            {"t": task, "s": slot},
        )


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
    time.sleep(10)
    for worker in workers:
        worker.stop()
    slots = enqueued_slots(engine)
    assert max(Counter(slots).values()) == 1, Counter(slots).most_common(3)
    assert len(slots) >= 8  # about ten seconds of one-second slots
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert set(gaps) == {dt.timedelta(seconds=1)}  # none skipped
    # a schedule that never ran starts once a worker runs (give or take the lateness margin)
    assert slots[0] > started - LATE_MARGIN
    with engine.connect() as conn:
        states = conn.execute(
            text("SELECT status, count(*) FROM sqla_queue.jobs GROUP BY status")
        ).all()
    assert dict(states).get("done", 0) >= len(slots) - 2  # the workers ran them too


@pytest.mark.parametrize("catch_up", [1, 3])
def test_a_worker_starting_after_a_window_without_workers_catches_up_as_configured(
    engine: Engine, catch_up: int
) -> None:
    with engine.begin() as conn:
        admin.set_retention(conn, "default", "keep")
    last_run = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(seconds=30)
    record_run(engine, "tick", last_run)
    with WorkerThread(engine, every_second(catch_up), concurrency=1):
        time.sleep(2.5)
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
        ["periodic", "list", "--app", "apps.periodic_app:registry", "--json"],
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
