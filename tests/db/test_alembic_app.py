"""sqla-queue in an application's own Alembic environment, built from real `alembic init` output.

Each test makes a scratch application in a temp folder the way a user would: `alembic init`,
its own models, `sqlalchemy.url` set in `alembic.ini`, and runs the real `alembic` and
`sqla-queue` commands in it. A "later sqla-queue release" is simulated with a test-only
revision on top of the newest shipped one, in a folder of the test's own.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.support import SQLA_QUEUE_BIN, subprocess_env
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.orm import Session

from sqla_queue import enqueue, normalize_url
from sqla_queue.db import migrate
from sqla_queue.db.models import SCHEMA

ALEMBIC_BIN = str(Path(sys.executable).with_name("alembic"))
OUR_VERSIONS = f"{SCHEMA}.{migrate.VERSION_TABLE}"

APP_MODELS = """
from sqlalchemy import Column, Integer, MetaData, Table

metadata = MetaData()
Table("widgets", metadata, Column("id", Integer, primary_key=True))
"""

# Runs `alembic ...` or `sqla-queue ...` with the test-only later revision added to ours.
WITH_LATER_RELEASE = """
import os, sys
import sqla_queue.db.migrate as m
shipped = m.versions_folder
m.versions_folder = lambda: shipped() + os.pathsep + os.environ["LATER_VERSIONS"]
if sys.argv[1] == "alembic":
    from alembic.config import main
    main(argv=sys.argv[2:], prog="alembic")
else:
    from sqla_queue.cli import main
    main(args=sys.argv[2:], prog_name="sqla-queue")
"""

LATER_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "sqlaq_9999"
down_revision = {down!r}
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("later_step", sa.Column("id", sa.Integer()), schema="{schema}")


def downgrade():
    op.drop_table("later_step", schema="{schema}")
"""


@dataclass
class App:
    """A scratch application with its own Alembic environment."""

    root: Path
    url: str
    later_versions: Path | None = None

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `alembic ...` or `sqla-queue ...` in the application's folder."""
        env = subprocess_env(None)
        if self.later_versions is not None:
            env["LATER_VERSIONS"] = str(self.later_versions)
            command = [sys.executable, "-c", WITH_LATER_RELEASE, *args]
        else:
            command = [ALEMBIC_BIN if args[0] == "alembic" else SQLA_QUEUE_BIN, *args[1:]]
        done = subprocess.run(
            command, cwd=self.root, env=env, capture_output=True, text=True, timeout=120
        )
        if ok:
            assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
        return done

    def autogenerate(self, message: str, *args: str) -> str:
        """`alembic revision --autogenerate`; returns the new file's upgrade() body."""
        done = self.run("alembic", "revision", "--autogenerate", "-m", message, *args)
        path = re.search(r"Generating (\S+\.py)", done.stdout + done.stderr)
        assert path, done.stdout + done.stderr
        return Path(path.group(1)).read_text().split("def upgrade()")[1].split("def downgrade")[0]

    def release_later_revision(self) -> None:
        """A later sqla-queue release: one more revision on top of the newest shipped one."""
        folder = self.root / "later_sqla_queue_release"
        folder.mkdir()
        source = LATER_REVISION.format(down=migrate.head_revision(), schema=SCHEMA)
        (folder / "sqlaq_9999_later.py").write_text(textwrap.dedent(source))
        self.later_versions = folder


@pytest.fixture(params=["stock_env", "include_schemas_env"])
def app(request: pytest.FixtureRequest, tmp_path: Path, empty_database_url: str) -> App:
    """`alembic init migrations`, the app's models as target_metadata; with include_schemas
    and our filters added to `context.configure` in the second variant."""
    root = tmp_path / "app"
    root.mkdir()
    application = App(root, empty_database_url)
    application.run("alembic", "init", "migrations")
    ini = root / "alembic.ini"
    assert "path_separator = os" in ini.read_text()  # the current template's default
    ini.write_text(
        re.sub(
            r"(?m)^sqlalchemy\.url = .*$",
            f"sqlalchemy.url = {normalize_url(empty_database_url)}",
            ini.read_text(),
        )
    )
    (root / "models.py").write_text(textwrap.dedent(APP_MODELS))
    env_py = root / "migrations" / "env.py"
    source = env_py.read_text()
    assert "target_metadata = None" in source
    source = source.replace(
        "target_metadata = None", "from models import metadata as target_metadata"
    )
    if request.param == "include_schemas_env":
        configure = "connection=connection, target_metadata=target_metadata"
        assert configure in source
        source = source.replace(
            configure,
            f"{configure}, include_schemas=True,"
            " include_name=include_name, include_object=include_object",
        ).replace(
            "from alembic import context",
            "from alembic import context\n"
            "from sqla_queue.db.alembic_ext import include_name, include_object",
        )
    env_py.write_text(source)
    return application


@pytest.fixture
def db(empty_database_url: str) -> Engine:
    eng = create_engine(empty_database_url)
    yield eng  # type: ignore[misc]
    eng.dispose()


def our_revisions(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        if not inspect(conn).has_table(migrate.VERSION_TABLE, SCHEMA):
            return []
        return list(conn.scalars(text(f"SELECT version_num FROM {OUR_VERSIONS}")))


def marker(engine: Engine) -> str | None:
    """The revision our schema's comment names (each revision sets it)."""
    with engine.connect() as conn:
        return migrate.schema_revision(conn)


def tables(engine: Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names(schema))


def schemas(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_schema_names())


def assert_queue_works(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        job = enqueue(session, "task")
        session.flush()
        assert job.id is not None
    migrate.check_schema(engine)


def assert_touches_nothing_of_ours(body: str) -> None:
    assert "op." not in body, body
    assert SCHEMA not in body
    assert "alembic_version" not in body


# -- one linear history: sqla-queue alembic revision ------------------------------------------


def test_linear_history_applies_upgrades_and_removes_our_schema_as_ordinary_steps(
    app: App, db: Engine
) -> None:
    assert "create_table('widgets'" in app.autogenerate("widgets")
    written = app.run("sqla-queue", "alembic", "revision")
    assert "apply it with `alembic upgrade head`" in written.stdout
    app.run("alembic", "upgrade", "head")

    assert_queue_works(db)
    assert our_revisions(db) == [migrate.head_revision()]
    assert "widgets" in tables(db, "public")
    # One head, so a plain autogenerate works, and it leaves our tables alone.
    assert_touches_nothing_of_ours(app.autogenerate("nothing changed"))
    # sqla-queue migrate sees the same version table: nothing to do, no error.
    migrated = app.run("sqla-queue", "--database-url", app.url, "migrate")
    assert f"sqla_queue schema at revision {marker(db)}" in migrated.stdout
    again = app.run("sqla-queue", "alembic", "revision")
    assert "nothing written" in again.stdout
    # The opt-in revision applied beside it is carried along by later steps.
    app.run("sqla-queue", "--database-url", app.url, "migrate", "--drop-queue-fk")

    # A later sqla-queue release: one more revision of the app's, then up and down again.
    app.release_later_revision()
    later = app.run("sqla-queue", "alembic", "revision", "-m", "sqla-queue upgrade")
    later_file = Path(later.stdout.split()[1].rstrip(";"))
    assert "upgrade_schema('sqlaq_9999')" in later_file.read_text()
    assert f"downgrade_schema({migrate.head_revision()!r})" in later_file.read_text()
    app.run("alembic", "upgrade", "head")
    assert "later_step" in tables(db, SCHEMA)
    assert sorted(our_revisions(db)) == ["sqlaq_9999", "sqlaq_nofk_0001"]
    assert_touches_nothing_of_ours(app.autogenerate("still nothing"))

    app.run("alembic", "downgrade", "-2")  # the empty autogenerate, then the later release
    assert "later_step" not in tables(db, SCHEMA)
    # sqlaq_nofk_0001 depends on the shipped head, so Alembic keeps only it as a head.
    assert set(our_revisions(db)) <= {migrate.head_revision(), "sqlaq_nofk_0001"}
    assert "sqlaq_nofk_0001" in our_revisions(db)
    assert_queue_works(db)

    app.run("alembic", "downgrade", "base")
    assert SCHEMA not in schemas(db)
    assert tables(db, "public") == {"alembic_version"}


# -- our branch beside the app's: version_locations -------------------------------------------


def test_branch_workflow_with_the_printed_version_locations_line(app: App, db: Engine) -> None:
    assert "create_table('widgets'" in app.autogenerate("widgets")
    app.run("alembic", "upgrade", "head")
    (app_head,) = app.run("alembic", "heads").stdout.split()[:1]
    line = app.run("sqla-queue", "alembic", "version-locations").stdout.strip()
    assert line == f"version_locations = %(here)s/migrations/versions:{migrate.versions_folder()}"
    ini = app.root / "alembic.ini"
    ini.write_text(ini.read_text().replace("[alembic]\n", f"[alembic]\n{line}\n", 1))
    app.run("alembic", "upgrade", "heads")

    assert_queue_works(db)
    assert "widgets" in tables(db, "public")
    with db.connect() as conn:
        recorded = set(conn.scalars(text("SELECT version_num FROM alembic_version")))
    assert migrate.head_revision() in recorded
    assert_touches_nothing_of_ours(app.autogenerate("nothing changed", "--head", app_head))
    # sqla-queue migrate recognises a schema another environment manages, and says so.
    refused = app.run("sqla-queue", "--database-url", app.url, "migrate", ok=False)
    assert refused.returncode == 1
    assert "already there" in refused.stderr
    assert "recorded in public.alembic_version" in refused.stderr
    assert "alembic upgrade heads" in refused.stderr

    app.release_later_revision()
    assert app.later_versions is not None
    ini.write_text(ini.read_text().replace(line, f"{line}:{app.later_versions}"))
    app.run("alembic", "upgrade", "heads")
    assert "later_step" in tables(db, SCHEMA)

    app.run("alembic", "downgrade", "sqla_queue@base")
    assert SCHEMA not in schemas(db)
    assert "widgets" in tables(db, "public")


# -- a schema made by sqla-queue migrate, seen from the app's autogenerate ----------------------


def test_autogenerate_never_touches_a_schema_sqla_queue_migrate_made(app: App, db: Engine) -> None:
    app.run("sqla-queue", "--database-url", app.url, "migrate")
    # As an older release left it: the version table in the default schema. Moved on migrate.
    with db.begin() as conn:
        conn.execute(text(f"ALTER TABLE {OUR_VERSIONS} SET SCHEMA public"))
    app.run("sqla-queue", "--database-url", app.url, "migrate")
    assert our_revisions(db) == [migrate.head_revision()]
    assert tables(db, "public") == set()

    body = app.autogenerate("widgets")
    assert "create_table('widgets'" in body
    assert SCHEMA not in body
    assert "alembic_version_sqla_queue" not in body
    app.run("alembic", "upgrade", "head")
    assert_queue_works(db)


def test_migrate_recognises_a_schema_whose_version_table_was_lost(app: App, db: Engine) -> None:
    app.run("sqla-queue", "--database-url", app.url, "migrate")
    with db.begin() as conn:
        conn.execute(text(f"DROP TABLE {OUR_VERSIONS}"))

    refused = app.run("sqla-queue", "--database-url", app.url, "migrate", ok=False)
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"already there (revision {marker(db)})" in refused.stderr
    assert "sqla-queue migrate --stamp" in refused.stderr
    assert "Traceback" not in refused.stderr

    stamped = app.run("sqla-queue", "--database-url", app.url, "migrate", "--stamp")
    assert stamped.stdout.strip() == f"recorded revision {marker(db)} as applied"
    app.run("sqla-queue", "--database-url", app.url, "migrate")
    assert our_revisions(db) == [migrate.head_revision()]
    assert_queue_works(db)


# -- online, through the application's own history -------------------------------------------


def test_upgrade_schema_runs_online_in_an_environment_with_a_transaction_per_revision(
    app: App, db: Engine
) -> None:
    import threading

    from helpers.races import Race

    env_py = app.root / "migrations" / "env.py"
    configure = "connection=connection, target_metadata=target_metadata"
    env_py.write_text(
        env_py.read_text().replace(configure, f"{configure}, transaction_per_migration=True")
    )
    app.run("sqla-queue", "--database-url", app.url, "migrate", "--revision", "sqlaq_0017")
    app.run("sqla-queue", "alembic", "revision")
    said: list[str] = []
    with Race(db) as race:
        held = race.hold(lambda conn: conn.execute(text("SELECT * FROM sqla_queue.workers")).all())
        upgrading = subprocess.Popen(
            [ALEMBIC_BIN, "upgrade", "head"],
            cwd=app.root,
            env=subprocess_env(None),
            stderr=subprocess.PIPE,
            text=True,
        )
        retried = threading.Event()

        def read() -> None:
            assert upgrading.stderr is not None
            for line in upgrading.stderr:
                said.append(line)
                if "(lock_timeout)" in line:
                    retried.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert retried.wait(60), "".join(said)  # it waited out its lock_timeout, then retried
        held.rollback()
        assert upgrading.wait(120) == 0, "".join(said)
        reader.join(10)
    assert our_revisions(db) == [migrate.head_revision()]
    assert any(f"pid {held.pid}" in line for line in said)
    assert_queue_works(db)
