"""A plain script, no framework: enqueue one job per region in one transaction, then run them.

python -m examples.script.report --database-url postgresql://... [--day 2026-11-30]

It migrates the database (idempotent), writes the jobs with `enqueue_many`, and runs a
burst-mode worker in-process until they are done: the shape of a cron job.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os

from sqlalchemy import Engine, Text, create_engine, insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import Registry, enqueue_many
from sqla_queue.db.database import normalize_url
from sqla_queue.db.migrate import upgrade
from sqla_queue.worker import Worker, WorkerConfig, WorkerStats

REGIONS = ("north", "south", "east", "west")
registry = Registry()
_engine: list[Engine] = []  # set by main(); the handler writes through it


class Base(DeclarativeBase):
    pass


class Tally(Base):
    __tablename__ = "script_tallies"

    id: Mapped[int] = mapped_column(primary_key=True)
    day: Mapped[str] = mapped_column(Text)
    region: Mapped[str] = mapped_column(Text)


@registry.task(name="script.tally_region")
def tally_region(day: str, region: str) -> None:
    """Pretend to compute a region's figures for the day; record that it ran."""
    with _engine[0].begin() as conn:
        conn.execute(insert(Tally).values(day=day, region=region))


def run_report(engine: Engine, day: str) -> WorkerStats:
    """Enqueue the day's jobs in one transaction and run them all; return the worker's counts."""
    upgrade(engine)
    Base.metadata.create_all(engine)
    _engine[:] = [engine]
    with Session(engine) as session, session.begin():
        enqueue_many(
            session,
            [{"task": tally_region.name, "args": {"day": day, "region": r}} for r in REGIONS],
        )
    config = WorkerConfig(concurrency=2, burst=True, poll_only=True)
    return Worker(engine, registry, config).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("SQLA_QUEUE_DATABASE_URL"))
    parser.add_argument("--day", default=dt.date.today().isoformat())
    options = parser.parse_args(argv)
    if not options.database_url:
        parser.error("pass --database-url or set SQLA_QUEUE_DATABASE_URL")
    engine = create_engine(normalize_url(options.database_url))
    try:
        stats = run_report(engine, options.day)
    finally:
        engine.dispose()
    print(f"{options.day}: {stats.succeeded} regions tallied, {stats.failed} failed")
    return 0 if stats.failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
