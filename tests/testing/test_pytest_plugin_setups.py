"""The pytest plugin in an application's suite that does things its own way (pytester)."""

from __future__ import annotations

import pytest


@pytest.fixture
def project(pytester: pytest.Pytester, admin_url: str) -> pytest.Pytester:
    pytester.makeini(f"[pytest]\nsqla_queue_url = {admin_url}\n")
    return pytester


QUEUE_IS_EMPTY = """
def test_queue_is_empty(queue):
    queue.assert_not_enqueued(status=None)
"""


@pytest.mark.parametrize("how", ["pytest_plugins", "-p"])
def test_loading_the_plugin_explicitly_as_well_is_harmless(
    project: pytest.Pytester, how: str
) -> None:
    project.makepyfile(test_x=QUEUE_IS_EMPTY)
    if how == "pytest_plugins":
        project.makeconftest('pytest_plugins = ["sqla_queue.testing.pytest_plugin"]\n')
        result = project.runpytest("-q")
    else:
        result = project.runpytest("-q", "-p", "sqla_queue.testing.pytest_plugin")
    result.assert_outcomes(passed=1)


def test_the_plugin_can_be_turned_off_by_its_module_name(project: pytest.Pytester) -> None:
    result = project.runpytest("--fixtures", "-p", "no:sqla_queue.testing.pytest_plugin")
    assert "sqla_queue_session" not in result.stdout.str()


def test_a_test_that_commits_the_shared_connection_is_an_error_naming_the_fix(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        test_commit="""
        from sqla_queue import enqueue

        def test_1_commits(sqla_queue_connection, sqla_queue_session):
            enqueue(sqla_queue_session, "t", {"leaked": True})
            sqla_queue_session.flush()
            sqla_queue_connection.commit()

        def test_2_commits_a_savepoint_only(queue, sqla_queue_session):
            enqueue(sqla_queue_session, "t", {})
            sqla_queue_session.commit()
        """
    )
    result = project.runpytest("-q")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_1_commits*", "*committed*sqla_queue_engine*"]
    )


def test_a_prepare_override_the_template_did_not_use_is_a_clear_error(
    project: pytest.Pytester,
) -> None:
    # The template is made once, with the override of the first test that needs it.
    project.makepyfile(test_a=QUEUE_IS_EMPTY)
    project.mkpydir("zsub")
    project.path.joinpath("zsub", "conftest.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture(scope='session')\n"
        "def sqla_queue_prepare():\n"
        "    def create_orders(engine):\n"
        "        pass\n"
        "    return create_orders\n"
    )
    project.path.joinpath("zsub", "test_b.py").write_text(QUEUE_IS_EMPTY)
    result = project.runpytest("-q")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*zsub/test_b.py*sqla_queue_prepare*root conftest.py*"])


def test_a_default_registry_set_by_a_test_does_not_outlive_it(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_default="""
        import sqla_queue
        from sqla_queue import Registry, default_registry

        def test_1_sets_one():
            sqla_queue.set_default_registry(Registry())

        def test_2_has_none():
            assert default_registry() is None
        """
    )
    project.runpytest("-q").assert_outcomes(passed=2)
