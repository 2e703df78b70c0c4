"""`sqla-queue migrate` and `sqla-queue alembic`: the schema, by itself or in your Alembic
history."""

from __future__ import annotations

import click
from alembic.util import CommandError as AlembicCommandError

from sqla_queue.cli import base
from sqla_queue.cli.base import Command, Group
from sqla_queue.cli.types import Duration, count


@click.command(cls=Command)
@click.option("--revision", default="sqla_queue@head", show_default=True)
@click.option(
    "--drop-queue-fk",
    is_flag=True,
    help="Let jobs name queues that do not exist (opt-in revision): drop the check that "
    "refuses them (its triggers; on a schema before sqlaq_0031, the jobs -> queues foreign "
    "key).",
)
@click.option(
    "--restore-queue-fk",
    is_flag=True,
    help="Undo --drop-queue-fk: refuse jobs of unknown queues again (refused while jobs "
    "name missing queues).",
)
@click.option(
    "--stamp",
    is_flag=True,
    help="Record the revision the existing sqla_queue schema is at, without running anything "
    "(after its version table was lost).",
)
@click.option(
    "--lock-timeout",
    type=Duration(0.001, 3600.0),
    default=0.5,
    show_default=True,
    help="Seconds a revision's statement waits for a lock before the revision is rolled "
    "back and retried after a pause (enqueues queued behind it wait no longer).",
)
@click.option(
    "--lock-retries",
    type=count(0, 10_000, what="a number of retries"),
    default=30,
    show_default=True,
    help="How many times a revision that did not get its lock is retried before giving up.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Apply contract revisions even while live workers built for an earlier revision "
    "run (they may then fail).",
)
def migrate(
    database_url: str | None,
    revision: str,
    drop_queue_fk: bool,
    restore_queue_fk: bool,
    stamp: bool,
    lock_timeout: float,
    lock_retries: int,
    force: bool,
) -> None:
    """Create or upgrade the sqla_queue schema (the package's own Alembic revisions)."""
    from sqla_queue.db import migrate as migrations

    if drop_queue_fk and restore_queue_fk:
        raise click.UsageError("pass --drop-queue-fk or --restore-queue-fk, not both")
    engine = base.engine(database_url)
    try:
        if stamp:
            click.echo(f"recorded revision {migrations.stamp(engine)} as applied")
            return
        migrations.upgrade(
            engine,
            revision,
            lock_timeout=lock_timeout,
            lock_retries=lock_retries,
            report=lambda line: click.echo(line, err=True),
            force=force,
        )
        if drop_queue_fk:
            migrations.drop_queue_fk(engine)
        if restore_queue_fk:
            migrations.restore_queue_fk(engine)
        with engine.connect() as conn:
            click.echo(f"sqla_queue schema at revision {migrations.schema_revision(conn)}")
        if drop_queue_fk or restore_queue_fk:
            click.echo(
                "queue foreign key dropped: jobs may name queues that do not exist"
                if drop_queue_fk
                else "queue foreign key in place: a job of an unknown queue is refused"
            )
    finally:
        engine.dispose()


@click.group("alembic", cls=Group)
def alembic_group() -> None:
    """sqla-queue's schema in your application's own Alembic environment."""


_ALEMBIC_CONFIG = click.option(
    "-c",
    "--config",
    "config_file",
    default="alembic.ini",
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Your application's Alembic configuration file.",
)


@alembic_group.command("revision", database=False)
@_ALEMBIC_CONFIG
@click.option("-m", "--message", default=None, help="The revision's message.")
@click.option(
    "--revision",
    "target",
    default=None,
    help="The sqla-queue schema revision to apply (default: the newest this package ships).",
)
def alembic_revision(config_file: str, message: str | None, target: str | None) -> None:
    """Write a revision into your history that applies (or upgrades) sqla-queue's schema.

    Your history stays linear: run it again after upgrading sqla-queue."""
    from sqla_queue.db.alembic_ext import write_revision

    try:
        written = write_revision(config_file, message, target)
    except AlembicCommandError as exc:
        raise click.ClickException(f"cannot write the revision: {base.one_line(exc)}") from None
    if written is None:
        click.echo("your history already applies the newest sqla-queue schema; nothing written")
        return
    click.echo(f"wrote {written}; apply it with `alembic upgrade head`")


@alembic_group.command("version-locations", database=False)
@_ALEMBIC_CONFIG
def alembic_version_locations(config_file: str) -> None:
    """Print the version_locations line that adds sqla-queue's revisions as a branch of yours
    (the other way: `sqla-queue alembic revision` keeps one linear history)."""
    from sqla_queue.db.alembic_ext import version_locations_line

    click.echo(version_locations_line(config_file))
