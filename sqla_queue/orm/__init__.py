"""Jobs tied to the rows they are about: `enqueue(session, task, args, about=order)`.

The job records the mapped row as `<table>:<primary key>` in `jobs.about` (partial index
`ix_jobs_about`); then

    jobs_of(session, order)                   # that row's jobs, oldest first
    jobs_of(session, order, status="queued")  # or some statuses only

    class Order(HasJobs, Base):               # opt in, per model:
        ...
    order.jobs                                # a read-only relationship to its jobs
    session.delete(order)                     # cancels its queued and waiting jobs in the
                                              # same flush, naming the row in their error

`Unique(about=True)` admits one job per task and row. A delete that bypasses the ORM
(`session.execute(delete(Order))`, SQL) cancels nothing: `cancel_jobs_about(connection,
"orders:42")` does it by hand. There is no foreign key from jobs to your table, so no
enqueue about a row takes a lock on it: many concurrent enqueues about one hot row mint no
MultiXact (`tests/test_orm_jobs.py` counts them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Text,
    cast,
    event,
    func,
    inspect,
    literal,
    select,
)
from sqlalchemy.orm import (
    Mapped,
    Mapper,
    Session,
    declared_attr,
    foreign,
    object_session,
    relationship,
)

from sqla_queue.db.models import Job
from sqla_queue.db.queries import about as about_statements
from sqla_queue.errors import ConfigurationError
from sqla_queue.job.about import about_text, mapper_table
from sqla_queue.job.states import JobStatus

__all__ = ["HasJobs", "about_key", "cancel_jobs_about", "jobs_of"]


def _refused(message: str) -> Exception:
    return ConfigurationError(detail=message)


def about_key(obj: object) -> str:
    """The `<table>:<key>` text jobs about `obj` (a mapped instance with its primary key)
    carry in `Job.about`."""
    return about_text(obj, _refused)


def jobs_of(
    session: Session, obj: object | str, status: str | Iterable[str] | None = None
) -> list[Job]:
    """The jobs about `obj` (a mapped instance, or its `<table>:<key>` text) still in the
    jobs table, oldest first; `status`: only those in this status (or these)."""
    statement = select(Job).where(Job.about == about_text(obj, _refused))
    if status is not None:
        wanted = [status] if isinstance(status, str) else list(status)
        unknown = sorted(set(wanted) - {s.value for s in JobStatus})
        if unknown:
            raise ConfigurationError(
                detail=f"jobs_of(status=...) takes statuses among "
                f"{', '.join(s.value for s in JobStatus)}, got {', '.join(unknown)}"
            )
        statement = statement.where(Job.status.in_(wanted))
    return list(session.scalars(statement.order_by(Job.id)))


_CANCEL_ABOUT = about_statements.cancel_jobs_about()


def cancel_jobs_about(connection: Connection | Session, about: object | str) -> list[int]:
    """Cancel the queued and waiting jobs about a row (a mapped instance or its text), in
    the caller's transaction; returns their ids. What deleting a `HasJobs` row through the
    ORM does by itself; call it for deletes that bypass the ORM. The jobs that depend on a
    cancelled one are cancelled too (workflows), unless they run on failure. A running job
    goes on: its handler finds the row gone."""
    key = about_text(about, _refused)
    reason = f"cancelled: {key}, the row it was about, was deleted"
    rows = connection.execute(_CANCEL_ABOUT, {"about_key": key, "reason": reason})
    return sorted(int(job_id) for job_id in rows.scalars())


def _join_condition(cls: Any) -> Any:
    """`jobs.about = '<table>:' || <key as text>` for the mapped class `cls`."""
    mapper: Mapper[Any] = inspect(cls)
    prefix = literal(f"{mapper_table(mapper)}:", Text)
    columns: Sequence[Any] = mapper.primary_key
    if len(columns) == 1:
        key = cast(columns[0], Text)
    else:  # the JSON array `about_text` writes: jsonb's own text form
        key = cast(func.jsonb_build_array(*columns), Text)
    return foreign(Job.about) == prefix + key


class HasJobs:
    """A mixin for your mapped classes: `obj.jobs` lists the jobs about the row (oldest
    first; a read-only relationship: enqueue with `about=obj`), and deleting the row
    through the ORM cancels its queued and waiting jobs in the same flush.

        class Order(HasJobs, Base):
            __tablename__ = "orders"
            id: Mapped[int] = mapped_column(primary_key=True)

    Keys of one column (any type whose text the database and Python write alike: integers,
    strings, UUIDs) or several (integers and strings).
    """

    @declared_attr
    def jobs(cls) -> Mapped[list[Job]]:
        return relationship(
            Job,
            primaryjoin=lambda: _join_condition(cls),
            viewonly=True,
            order_by=Job.id,
            lazy="select",
        )


@event.listens_for(HasJobs, "after_delete", propagate=True)
def _cancel_on_delete(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    session = object_session(target)
    if session is not None:  # the jobs table's connection (a session with `binds=`)
        connection = session.connection(bind_arguments={"mapper": Job})
    cancel_jobs_about(connection, target)
