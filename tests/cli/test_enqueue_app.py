"""`sqla-queue enqueue --app MOD:registry`: the task name checked (with a close name
suggested), the args checked against the handler and its types, the task's defaults applied."""

from __future__ import annotations

from helpers.support import cli
from sqlalchemy import Engine, text

APP = "helpers.apps.typed_app:registry"
WHEN = '"when": "2026-01-02T09:00:00+00:00"'


def stored_options(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT queue, priority, max_attempts FROM sqla_queue.jobs"))
        return [tuple(r) for r in rows]


def test_enqueue_with_app_applies_the_task_queue_and_defaults(
    engine: Engine, database_url: str, emails_queue: str
) -> None:
    args = f'{{"order_id": 1, {WHEN}}}'
    done = cli("enqueue", "shop.send_receipt", "--app", APP, "--args", args, url=database_url)
    assert done.exit_code == 0, done.output
    assert stored_options(engine) == [("emails", 7, 9)]
    again = cli(
        "enqueue",
        "shop.send_receipt",
        "--app",
        APP,
        "--args",
        args,
        "--priority",
        "1",
        url=database_url,
    )
    assert again.exit_code == 0, again.output
    assert sorted(stored_options(engine)) == [("emails", 1, 9), ("emails", 7, 9)]


def test_enqueue_with_app_refuses_a_misspelt_task_with_the_close_name(
    engine: Engine, database_url: str
) -> None:
    done = cli(
        "enqueue",
        "shop.send_reciept",
        "--app",
        APP,
        "--args",
        '{"order_id": 1}',
        url=database_url,
    )
    assert done.exit_code == 1
    (line,) = done.stderr.strip().splitlines()
    assert "shop.send_reciept" in line
    assert "did you mean 'shop.send_receipt'?" in line
    assert stored_options(engine) == []


def test_enqueue_with_app_refuses_args_that_do_not_fit_in_one_line(
    engine: Engine, database_url: str
) -> None:
    for args, expected in [
        (f'{{"order_id": 1, "emial": "x", {WHEN}}}', "unexpected argument emial"),
        ('{"order_id": 1, "when": "tomorrow"}', "argument 'when'"),
        ("{}", "missing required argument order_id, when"),
    ]:
        done = cli("enqueue", "shop.send_receipt", "--app", APP, "--args", args, url=database_url)
        assert done.exit_code == 1, args
        (line,) = done.stderr.strip().splitlines()
        assert expected in line, line
    assert stored_options(engine) == []


def test_enqueue_takes_a_start_deadline(engine: Engine, database_url: str) -> None:
    done = cli("enqueue", "nightly", "--expires-in", "1h", url=database_url)
    assert done.exit_code == 0, done.output
    both = cli(
        "enqueue",
        "nightly",
        "--expires-in",
        "1h",
        "--expires-at",
        "2030-01-01T00:00:00Z",
        url=database_url,
    )
    assert both.exit_code == 1
    assert "expires_at or expires_in, not both" in both.stderr
    with engine.connect() as conn:
        minutes = conn.execute(
            text(
                "SELECT round(extract(epoch FROM expires_at - created_at) / 60) "
                "FROM sqla_queue.jobs"
            )
        ).scalars()
        assert list(minutes) == [60]
