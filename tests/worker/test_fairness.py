"""Fair queues, partition limits, priority aging and sequences (issue 24): enforced inside the
claim statement (`claim_jobs` and `sqla_queue.claim_turns`)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest
from helpers.statements import claim, finish, mark_failed
from helpers.support import make_queue, seq_jobs
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue import Job, admin, enqueue, enqueue_many
from sqla_queue.admin import partitions
from sqla_queue.errors import ConfigurationError, InvalidJobError, UnknownQueueError


def partitions_of(engine: Engine, rows: list[Any]) -> list[str | None]:
    ids = [r["id"] for r in rows]
    with engine.connect() as conn:
        found = dict(
            conn.execute(
                text("SELECT id, partition FROM sqla_queue.jobs WHERE id = ANY(:ids)"), {"ids": ids}
            ).all()
        )
    return [found[i] for i in ids]


def backlog(engine: Engine, counts: dict[str, int], queue: str = "tenants", **extra: Any) -> None:
    rows = [
        {"task": "export", "args": {"n": n}, "queue": queue, "partition": tenant, **extra}
        for tenant, count in counts.items()
        for n in range(count)
    ]
    with Session(engine) as session, session.begin():
        enqueue_many(session, rows)


# -- options on every path --------------------------------------------------------------------


def test_partition_and_sequence_are_written_by_every_enqueue_path(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        enqueue(session, "t", {}, partition="a", sequence="s1")
        session.add(Job(task="t", args={}, partition="b", sequence="s2"))
        enqueue_many(session, [{"task": "t", "partition": "c", "sequence": "s3"}])
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT partition, sequence FROM sqla_queue.jobs ORDER BY id")
        ).all()
    assert [tuple(r) for r in rows] == [("a", "s1"), ("b", "s2"), ("c", "s3")]


@pytest.mark.parametrize("bad", ["", "x" * 201, "a\nb", 42])
def test_a_bad_partition_or_sequence_is_refused_and_names_the_fix(
    engine: Engine, bad: object
) -> None:
    for option in ("partition", "sequence"):
        with Session(engine) as session, pytest.raises(InvalidJobError, match=option):
            enqueue(session, "t", {}, **{option: bad})


def test_queue_settings_are_checked_and_listed(engine: Engine) -> None:
    make_queue(engine, fair=True, partition_limit=2, aging=300, sequence_on_failure="skip")
    with engine.begin() as conn:
        (info,) = [q for q in admin.list_queues(conn) if q.name == "tenants"]
        assert (info.fair, info.partition_limit, info.aging, info.sequence_on_failure) == (
            True,
            2,
            300.0,
            "skip",
        )
        with pytest.raises(ConfigurationError, match="hold' or 'skip"):
            partitions.set_sequence_on_failure(conn, "tenants", "drop")
        with pytest.raises(ConfigurationError, match="partition_limit"):
            partitions.set_partition_limit(conn, "tenants", 0)
        with pytest.raises(ConfigurationError, match="aging"):
            partitions.set_aging(conn, "tenants", -1)
        with pytest.raises(UnknownQueueError):
            partitions.set_fair(conn, "nope")
        with pytest.raises(UnknownQueueError):
            partitions.set_partition_weight(conn, "nope", "a", 2)


# -- fairness ---------------------------------------------------------------------------------


def test_a_fair_queue_takes_one_from_each_partition_before_a_second_from_any(
    engine: Engine,
) -> None:
    make_queue(engine, fair=True)
    backlog(engine, {"big": 500})
    backlog(engine, {f"small-{i}": 3 for i in range(4)})
    with engine.connect() as conn:
        first = claim(conn, 5, ["tenants"])
    expected = ["big", "small-0", "small-1", "small-2", "small-3"]
    assert sorted(partitions_of(engine, first), key=str) == expected


def test_one_job_at_a_time_a_fair_queue_still_takes_turns(engine: Engine) -> None:
    """A worker at -c 1: no job runs while the next is claimed, so running counts are all 0;
    the partition served longest ago goes first (`partition_turns`)."""
    make_queue(engine, fair=True)
    backlog(engine, {"big": 50})
    backlog(engine, {"b": 3, "c": 3})
    order = []
    with engine.connect() as conn:
        for _ in range(9):
            (row,) = claim(conn, 1, ["tenants"])
            order += partitions_of(engine, [row])
            finish(conn, [row])
    assert order == ["big", "b", "c"] * 3


def test_without_fair_the_oldest_backlog_goes_first(engine: Engine) -> None:
    make_queue(engine)
    backlog(engine, {"big": 50})
    backlog(engine, {"small": 3})
    with engine.connect() as conn:
        first = claim(conn, 10, ["tenants"])
    assert set(partitions_of(engine, first)) == {"big"}


def test_a_lone_busy_partition_gets_the_whole_queue(engine: Engine) -> None:
    make_queue(engine, fair=True)
    backlog(engine, {"big": 100})
    with engine.connect() as conn:
        assert len(claim(conn, 20, ["tenants"])) == 20
        # and the partitions with running jobs come after those without
        backlog(engine, {"new": 5})
        second = claim(conn, 5, ["tenants"])
    assert Counter(partitions_of(engine, second)) == Counter({"new": 5})


def test_a_fair_queue_serves_jobs_without_a_partition_as_one_partition(engine: Engine) -> None:
    make_queue(engine, fair=True)
    backlog(engine, {"big": 100})
    with Session(engine) as session, session.begin():
        enqueue_many(session, [{"task": "t", "queue": "tenants"} for _ in range(3)])
    with engine.connect() as conn:
        first = claim(conn, 2, ["tenants"])
        rest = claim(conn, 200, ["tenants"])
    assert sorted(partitions_of(engine, first), key=str) == [None, "big"]
    assert len(rest) == 101


def test_weights_give_a_partition_more_turns(engine: Engine) -> None:
    make_queue(engine, fair=True)
    with engine.begin() as conn:
        partitions.set_partition_weight(conn, "tenants", "gold", 3)
    backlog(engine, {"gold": 50, "basic": 50})
    with engine.connect() as conn:
        got = claim(conn, 8, ["tenants"])
    assert Counter(partitions_of(engine, got)) == Counter({"gold": 6, "basic": 2})


def test_priority_holds_within_a_partition(engine: Engine) -> None:
    make_queue(engine, fair=True)
    backlog(engine, {"a": 5})
    with Session(engine) as session, session.begin():
        handle = enqueue(session, "t", {}, queue="tenants", partition="a", priority=0)
        session.flush()
        urgent = handle.id
    with engine.begin() as conn:
        conn.execute(text("UPDATE sqla_queue.jobs SET priority = 5 WHERE id <> :u"), {"u": urgent})
    with engine.connect() as conn:
        (first,) = claim(conn, 1, ["tenants"])
    assert first["id"] == urgent


# -- partition limit --------------------------------------------------------------------------


def test_a_partition_never_runs_more_than_its_limit(engine: Engine) -> None:
    make_queue(engine, partition_limit=2)
    backlog(engine, {"a": 10, "b": 10, "c": 1})
    with engine.connect() as conn:
        first = claim(conn, 50, ["tenants"])
        assert Counter(partitions_of(engine, first)) == Counter({"a": 2, "b": 2, "c": 1})
        assert claim(conn, 50, ["tenants"]) == []
        finish(conn, [r for r in first if partitions_of(engine, [r]) == ["a"]])
        again = claim(conn, 50, ["tenants"])
    assert Counter(partitions_of(engine, again)) == Counter({"a": 2})


def test_a_partition_limit_holds_when_claiming_from_every_queue(engine: Engine) -> None:
    make_queue(engine, partition_limit=1)
    backlog(engine, {"a": 5})
    with engine.connect() as conn:
        assert len(claim(conn, 50)) == 1
        assert claim(conn, 50) == []


# -- aging ------------------------------------------------------------------------------------


def test_an_aged_low_priority_job_goes_before_new_high_priority_ones(engine: Engine) -> None:
    make_queue(engine, aging=60)
    with Session(engine) as session, session.begin():
        handle = enqueue(session, "t", {}, queue="tenants", priority=9)
        for _ in range(5):
            enqueue(session, "t", {}, queue="tenants", priority=0)
        session.flush()
        old = handle.id
    with engine.begin() as conn:
        # the low priority job has waited ten intervals: it is at priority 0 now, and older
        conn.execute(
            text("UPDATE sqla_queue.jobs SET run_at = now() - interval '10 minutes' WHERE id = :i"),
            {"i": old},
        )
    with engine.connect() as conn:
        (first,) = claim(conn, 1, ["tenants"])
    assert first["id"] == old


def test_without_aging_priority_wins_however_long_a_job_waited(engine: Engine) -> None:
    make_queue(engine)
    with Session(engine) as session, session.begin():
        handle = enqueue(session, "t", {}, queue="tenants", priority=9)
        enqueue(session, "t", {}, queue="tenants", priority=0)
        session.flush()
        old = handle.id
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_queue.jobs SET run_at = now() - interval '10 days' WHERE id = :i"),
            {"i": old},
        )
    with engine.connect() as conn:
        (first,) = claim(conn, 1, ["tenants"])
    assert first["id"] != old


# -- sequences --------------------------------------------------------------------------------


def test_a_sequence_runs_one_job_at_a_time_in_enqueue_order(engine: Engine) -> None:
    ids = seq_jobs(engine, "order-1", 3)
    other = seq_jobs(engine, "order-2", 1)
    with engine.connect() as conn:
        first = claim(conn, 10)
        assert sorted(r["id"] for r in first) == sorted([ids[0], other[0]])
        assert claim(conn, 10) == []
        finish(conn, [r for r in first if r["id"] == ids[0]])
        (second,) = claim(conn, 10)
        assert second["id"] == ids[1]


@pytest.mark.parametrize("queues", [None, ["default"]])
def test_a_failed_job_holds_its_sequence_until_it_is_retried(
    engine: Engine, queues: list[str] | None
) -> None:
    ids = seq_jobs(engine, "order-1", 2)
    with engine.connect() as conn:
        (first,) = claim(conn, 10, queues)
        mark_failed(conn, [first])
        assert claim(conn, 10, queues) == []
        admin.retry_jobs(conn, [ids[0]])
        conn.commit()
        (again,) = claim(conn, 10, queues)
    assert again["id"] == ids[0]


def test_a_skip_queue_goes_on_past_a_failed_job(engine: Engine) -> None:
    make_queue(engine, "steps", sequence_on_failure="skip")
    ids = seq_jobs(engine, "order-1", 2, queue="steps")
    with engine.connect() as conn:
        (first,) = claim(conn, 10)
        mark_failed(conn, [first])
        (second,) = claim(conn, 10)
    assert second["id"] == ids[1]


def test_a_deleted_failed_job_lets_its_sequence_go_on(engine: Engine) -> None:
    ids = seq_jobs(engine, "order-1", 2)
    with engine.connect() as conn:
        (first,) = claim(conn, 10)
        mark_failed(conn, [first])
        admin.delete_jobs(conn, [ids[0]])
        conn.commit()
        (second,) = claim(conn, 10)
    assert second["id"] == ids[1]


def test_sequences_hold_in_fair_and_limited_queues_too(engine: Engine) -> None:
    make_queue(engine, fair=True)
    with engine.begin() as conn:
        admin.create_queue(conn, "capped")
        admin.set_max_running(conn, "capped", 10)
    fair_ids = seq_jobs(engine, "s-fair", 3, queue="tenants")
    capped_ids = seq_jobs(engine, "s-capped", 3, queue="capped")
    with engine.connect() as conn:
        got = claim(conn, 10)
    assert sorted(r["id"] for r in got) == sorted([fair_ids[0], capped_ids[0]])


def test_the_held_sequence_and_the_aged_jobs_are_visible(engine: Engine) -> None:
    make_queue(engine, aging=60)
    ids = seq_jobs(engine, "order-1", 3)
    with Session(engine) as session, session.begin():
        waited = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
        enqueue(session, "t", {}, queue="tenants", priority=5, run_at=waited)
    with engine.connect() as conn:
        first = claim(conn, 10, ["default"])
        mark_failed(conn, first)
        (held,) = partitions.held_sequences(conn)
        assert (held.sequence, held.job_id, held.behind) == ("order-1", ids[0], 2)
        assert partitions.aged_jobs(conn) == {"tenants": 1}


# -- where the features meet the others --------------------------------------------------------


def test_a_fair_queue_with_max_running_takes_turns_within_its_limit(engine: Engine) -> None:
    make_queue(engine, fair=True)
    with engine.begin() as conn:
        admin.set_max_running(conn, "tenants", 3)
    backlog(engine, {"big": 50})
    backlog(engine, {"b": 5, "c": 5})
    with engine.connect() as conn:
        first = claim(conn, 50, ["tenants"])
        assert sorted(partitions_of(engine, first), key=str) == ["b", "big", "c"]
        assert claim(conn, 50, ["tenants"]) == []


def test_a_job_waiting_on_its_dependencies_holds_its_sequence(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        parent = enqueue(session, "t", {}, delay=3600)
        enqueue(session, "t", {"n": 1}, sequence="s", depends_on=[parent])
        enqueue(session, "t", {"n": 2}, sequence="s")
        session.flush()
        parent_id = parent.id
    with engine.connect() as conn:
        assert claim(conn, 10) == []  # the parent is not due, the first waits, the second too
        conn.execute(
            text("UPDATE sqla_queue.jobs SET run_at = now() WHERE id = :i"), {"i": parent_id}
        )
        conn.commit()
        (got,) = claim(conn, 10)  # the parent; the second still waits behind the first
        assert got["id"] == parent_id


def test_the_cli_sets_and_clears_turns_and_weights(database_url: str, engine: Engine) -> None:
    from click.testing import CliRunner

    from sqla_queue.cli import main

    def cli(*args: str) -> str:
        done = CliRunner().invoke(main, [*args[:2], "--database-url", database_url, *args[2:]])
        assert done.exit_code == 0, done.output
        return done.output

    assert "fair, partition-limit 2, aging 5m" in cli(
        "queues", "create", "tenants", "--fair", "--partition-limit", "2", "--aging", "5m"
    )
    assert "weight 3" in cli("queues", "weight", "tenants", "gold", "3")
    with engine.begin() as conn:
        assert partitions.partition_weights(conn) == {("tenants", "gold"): 3.0}
    cli("queues", "weight", "tenants", "gold", "--clear")
    out = cli("queues", "set", "tenants", "--no-fair", "--no-partition-limit", "--no-aging")
    assert "fair" not in out
    assert "aging" not in out
    with engine.begin() as conn:
        assert partitions.partition_weights(conn) == {}
        (info,) = [q for q in admin.list_queues(conn) if q.name == "tenants"]
    assert (info.fair, info.partition_limit, info.aging) == (False, None, None)
