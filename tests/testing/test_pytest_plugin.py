"""The pytest plugin, run the way an application's test suite runs it (pytester)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

APP = """
from sqlalchemy import Text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import Registry, enqueue

registry = Registry()
sent: list[str] = []


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(Text)


@registry.task(name="app.send_receipt")
def send_receipt(email: str) -> None:
    sent.append(email)


def place_order(session: Session, email: str) -> Order:
    order = Order(email=email)
    session.add(order)
    session.flush()
    enqueue(session, "app.send_receipt", {"email": email})
    session.commit()
    return order
"""


@pytest.fixture
def app_project(pytester: pytest.Pytester, admin_url: str) -> pytest.Pytester:
    """A project with its own models and tasks; its tests use the plugin's fixtures only."""
    pytester.makepyfile(app=APP)
    pytester.makeini(
        f"""
        [pytest]
        sqla_queue_url = {admin_url}
        sqla_queue_registry = app:registry
        """
    )
    pytester.makeconftest(
        """
        import pytest
        from app import Base

        @pytest.fixture(scope="session")
        def sqla_queue_prepare():
            return Base.metadata.create_all

        # the application's own fixtures with common names must not disturb the plugin
        @pytest.fixture
        def engine():
            return "the app's own engine fixture"

        @pytest.fixture
        def session():
            return "the app's own session fixture"
        """
    )
    pytester.syspathinsert()
    return pytester


def test_plugin_is_loaded_by_its_entry_point_and_lists_its_fixtures(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines(
        ["plugins:*sqla-queue*", "sqla_queue_session -- *", "queue -- *"], consecutive=False
    )
    disabled = pytester.runpytest("--fixtures", "-p", "no:sqla_queue.testing.pytest_plugin")
    assert "sqla_queue_session" not in disabled.stdout.str()


def test_application_tests_enqueue_drain_and_roll_back(app_project: pytest.Pytester) -> None:
    app_project.makepyfile(
        test_orders="""
        from sqlalchemy import func, select
        from app import Order, place_order, sent

        def test_1_order_enqueues_its_receipt(queue, sqla_queue_session, engine, session):
            assert engine == "the app's own engine fixture"
            assert session == "the app's own session fixture"
            place_order(sqla_queue_session, "ada@example.com")
            queue.assert_enqueued(task="app.send_receipt", args={"email": "ada@example.com"})
            assert queue.drain().succeeded == 1
            assert sent == ["ada@example.com"]
            queue.assert_not_enqueued()

        def test_2_the_previous_test_left_nothing(queue, sqla_queue_session):
            assert sqla_queue_session.scalar(select(func.count()).select_from(Order)) == 0
            queue.assert_not_enqueued(status=None)

        def test_3_an_own_database_for_committing_code(sqla_queue_engine, queue):
            from sqlalchemy.orm import Session
            with Session(sqla_queue_engine) as s:
                place_order(s, "alan@example.com")
            from sqla_queue.testing import assert_enqueued
            assert_enqueued(sqla_queue_engine, task="app.send_receipt")
            queue.assert_not_enqueued()  # the shared, rolled-back database saw none of it

        def test_4_inline_mode_runs_the_job_at_commit(queue, sqla_queue_session):
            with queue.inline() as runs:
                place_order(sqla_queue_session, "grace@example.com")
            assert runs.succeeded == 1
            assert sent[-1] == "grace@example.com"
        """
    )
    result = app_project.runpytest("-q")
    result.assert_outcomes(passed=4)


def test_a_failing_assertion_reports_the_jobs_present(app_project: pytest.Pytester) -> None:
    app_project.makepyfile(
        test_wrong="""
        from app import place_order

        def test_wrong_args(queue, sqla_queue_session):
            place_order(sqla_queue_session, "ada@example.com")
            queue.assert_enqueued(task="app.send_receipt", args={"email": "bob@example.com"})
        """
    )
    result = app_project.runpytest("-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*expected a job matching task='app.send_receipt'*found 0*",
            "*task='app.send_receipt' args={'email': 'ada@example.com'}*",
        ]
    )


def test_a_bad_registry_option_is_one_clear_error(
    pytester: pytest.Pytester, admin_url: str
) -> None:
    pytester.makeini(
        f"""
        [pytest]
        sqla_queue_url = {admin_url}
        sqla_queue_registry = nowhere.tasks:registry
        """
    )
    pytester.makepyfile(test_x="def test_x(queue):\n    pass\n")
    result = pytester.runpytest("-q")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*Cannot load the task registry 'nowhere.tasks:registry'*"])


def test_the_queues_the_registrys_tasks_name_exist_in_every_test_database(
    pytester: pytest.Pytester, admin_url: str
) -> None:
    pytester.makepyfile(
        shop="""
        from sqla_queue import Registry

        registry = Registry()
        sent = []

        @registry.task(queue="emails")
        def send_receipt(email: str) -> None:
            sent.append(email)

        @registry.periodic(every=60, queue="reports")
        def nightly_report() -> None: ...

        @registry.task
        def plain() -> None: ...
        """
    )
    pytester.makeini(
        f"""
        [pytest]
        sqla_queue_url = {admin_url}
        sqla_queue_registry = shop:registry
        """
    )
    pytester.makepyfile(
        test_queues="""
        from sqlalchemy.orm import Session
        from sqla_queue import admin
        from shop import send_receipt, sent

        def test_the_session_s_database(queue, sqla_queue_session):
            send_receipt.enqueue(sqla_queue_session, {"email": "ada@example.com"})
            sqla_queue_session.commit()
            assert queue.drain().succeeded == 1
            assert sent == ["ada@example.com"]

        def test_an_own_database(sqla_queue_engine, sqla_queue_queues):
            assert sqla_queue_queues == ["default", "emails", "reports"]
            with Session(sqla_queue_engine) as session, session.begin():
                send_receipt.enqueue(session, {"email": "alan@example.com"})
            with sqla_queue_engine.connect() as connection:
                names = [q.name for q in admin.list_queues(connection)]
            assert names == ["default", "emails", "reports"]
        """
    )
    pytester.syspathinsert()
    result = pytester.runpytest("-q")
    result.assert_outcomes(passed=2)


def test_sqla_queue_queues_overridden_names_the_queues_made(
    pytester: pytest.Pytester, admin_url: str
) -> None:
    pytester.makeini(f"[pytest]\nsqla_queue_url = {admin_url}\n")
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def sqla_queue_queues():
            return ["bulk"]
        """
    )
    pytester.makepyfile(
        test_override="""
        from sqla_queue import admin

        def test_own(sqla_queue_engine):
            with sqla_queue_engine.connect() as connection:
                assert [q.name for q in admin.list_queues(connection)] == ["bulk", "default"]

        def test_shared(sqla_queue_connection):
            assert [q.name for q in admin.list_queues(sqla_queue_connection)] == [
                "bulk", "default"
            ]
        """
    )
    result = pytester.runpytest("-q")
    result.assert_outcomes(passed=2)


def test_under_xdist_each_worker_clones_its_own_template_and_drops_every_database(
    pytester: pytest.Pytester, admin_url: str, engine: Engine
) -> None:
    seen = pytester.path / "seen"
    seen.mkdir()
    pytester.makeini(f"[pytest]\nsqla_queue_url = {admin_url}\n")
    pytester.makepyfile(
        test_parallel=f"""
        import os, time
        import pytest
        from sqlalchemy import text

        @pytest.mark.parametrize("n", range(8))
        def test_own_database(n, sqla_queue_engine, sqla_queue_databases):
            time.sleep(0.3)  # long enough that both workers get tests
            with sqla_queue_engine.connect() as connection:
                name = connection.scalar(text("SELECT current_database()"))
            worker = os.environ["PYTEST_XDIST_WORKER"]
            line = f"{{worker}} {{sqla_queue_databases.template}} {{name}}"
            open(os.path.join({str(seen)!r}, str(n)), "w").write(line)
        """
    )
    result = pytester.runpytest_subprocess("-n", "2", "-q")
    result.assert_outcomes(passed=8)

    rows = [path.read_text().split() for path in seen.iterdir()]
    templates = {worker: template for worker, template, _ in rows}
    assert sorted(templates) == ["gw0", "gw1"]
    for worker, template in templates.items():
        assert template.startswith(f"sqlaq_test_tpl_{worker}_")  # named by its worker
    assert len({database for _, _, database in rows}) == 8  # a database per test
    with engine.connect() as connection:
        left = connection.scalars(
            text("SELECT datname FROM pg_database WHERE datname = ANY(:names)"),
            {"names": [*templates.values(), *(database for _, _, database in rows)]},
        ).all()
    assert left == []  # every clone dropped after its test, each template at the end


def test_queues_declared_in_code_are_made_with_their_settings_in_every_test_database(
    pytester: pytest.Pytester, admin_url: str
) -> None:
    pytester.makepyfile(
        shop_queues="""
        from sqla_queue import Registry

        registry = Registry()
        registry.declare_queue("emails", retention="keep", max_running=3)
        registry.declare_queue("audit", retention="archive")

        @registry.task(queue="emails")
        def send_receipt(email: str) -> None: ...
        """
    )
    pytester.makeini(
        f"""
        [pytest]
        sqla_queue_url = {admin_url}
        sqla_queue_registry = shop_queues:registry
        """
    )
    pytester.makepyfile(
        test_declared="""
        from sqla_queue import admin

        def settings(queues):
            return [(q.name, q.retention, q.max_running) for q in queues]

        EXPECTED = [
            ("audit", "archive", None), ("default", "delete", None), ("emails", "keep", 3)
        ]

        def test_own(sqla_queue_engine, sqla_queue_queues):
            assert sqla_queue_queues == ["audit", "default", "emails"]
            with sqla_queue_engine.connect() as connection:
                assert settings(admin.list_queues(connection)) == EXPECTED

        def test_shared(sqla_queue_connection):
            assert settings(admin.list_queues(sqla_queue_connection)) == EXPECTED
        """
    )
    pytester.syspathinsert()
    result = pytester.runpytest("-q")
    result.assert_outcomes(passed=2)
