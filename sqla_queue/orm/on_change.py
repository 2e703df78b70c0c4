"""Enqueue on change: a task that runs when a mapped object's attribute changes.

    @registry.on_change(Order.status, to="paid")
    def send_receipt(id: int) -> None: ...

Every transaction in which an `Order`'s `status` ends different from what it was at the
transaction's start, and equal to `"paid"`, enqueues one `send_receipt` job about that order
(`about=order`, see `sqla_queue.orm`), with the order's primary key as its args (`{"id":
42}`; `args=` a callable of the object for others). An insert counts as a change from
nothing. The job is written when the session commits, in that transaction, by the session's
own connection: a rollback leaves none, and a change, a change back and the change again
give one job (or none, if it ends where it began). `from_=` also requires the value it had
at the start; `when=` a predicate of the object; several attributes: any of them changing
(then `to`/`from_` are not taken: use `when`).

It works through the ORM's events: `session.execute(update(Order)...)`, bulk updates and SQL
bypass them and enqueue nothing. With an `AsyncSession` it works as with a `Session`.

How: the attribute loads its old value when set (active history); after each flush the
value each object had before its first change in the transaction is noted in
`session.info`; at the outer commit (a savepoint's release fires the same session events
and is passed over: what counts is the transaction's net change), once the last flush has
run, each noted object is compared with its current state and the rule's jobs are enqueued
on the session's connection for the jobs table (its `binds=` respected).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import event, inspect
from sqlalchemy.orm import InstrumentedAttribute, Session, UOWTransaction

from sqla_queue.db.savepoints import commits_the_transaction
from sqla_queue.errors import ConfigurationError, InvalidJobError

if TYPE_CHECKING:
    from sqla_queue.job.tasks import TaskSpec

MISSING: Any = object()
"""`to` or `from_` not given."""
NOTHING: Any = object()
"""What an inserted object's attribute was before the transaction: nothing."""
_NOTED = "sqla_queue.orm.on_change"
"""The `session.info` key of the objects changed in the open transaction."""


@dataclass(frozen=True, eq=False)
class ChangeRule:
    """One `on_change` registration: the class, its attribute keys, the conditions and the
    task to enqueue."""

    task: TaskSpec
    cls: type[Any]
    keys: tuple[str, ...]
    to: Any = MISSING
    from_: Any = MISSING
    when: Callable[[Any], bool] | None = None
    args: Callable[[Any], Mapping[str, Any]] | None = None

    def calls_for(self, obj: Any, before: Mapping[str, Any]) -> bool:
        """Whether `obj`, whose keys were `before` at the transaction's start, calls for a job."""
        now = {key: getattr(obj, key) for key in self.keys}
        if all(before[key] is not NOTHING and before[key] == now[key] for key in self.keys):
            return False  # back where it began (or never changed)
        key = self.keys[0]
        if self.to is not MISSING and now[key] != self.to:
            return False
        if self.from_ is not MISSING and (before[key] is NOTHING or before[key] != self.from_):
            return False
        return self.when is None or bool(self.when(obj))

    def args_of(self, obj: Any) -> dict[str, Any]:
        if self.args is not None:
            return dict(self.args(obj))
        mapper = inspect(type(obj))
        return {
            mapper.get_property_by_column(column).key: value
            for column, value in zip(
                mapper.primary_key, mapper.primary_key_from_instance(obj), strict=True
            )
        }


Noted = dict[tuple[int, int], tuple[ChangeRule, Any, dict[str, Any]]]
"""(id of the rule, id of the object) -> (rule, object, its values before the transaction)."""
_LOCK = threading.Lock()


def _noop(target: Any, value: Any, oldvalue: Any, initiator: Any) -> None:
    """A set listener whose `active_history` makes the attribute load its old value."""


class ChangeRules:
    """One registry's `on_change` rules (`Registry.change_rules`) and the `Session`
    listeners that apply them: installed with its first rule, removed with its last
    (`remove_rules`). Another registry's rules are not seen here, nor these there; each
    registry's jobs are enqueued through it."""

    def __init__(self) -> None:
        self.rules: list[ChangeRule] = []
        self._noted_key = (_NOTED, id(self))
        """The `session.info` key of the objects these rules noted in the open transaction."""

    def add(self, rule: ChangeRule, attributes: tuple[Any, ...]) -> None:
        with _LOCK:
            for attribute in attributes:
                if not event.contains(attribute, "set", _noop):
                    event.listen(attribute, "set", _noop, active_history=True)
            if not self.rules:
                event.listen(Session, "after_flush", self._note_changes)
                event.listen(Session, "before_commit", self._enqueue_called_for)
                event.listen(Session, "after_commit", self._forget)
                event.listen(Session, "after_soft_rollback", self._forget_on_rollback)
            self.rules.append(rule)

    def clear(self) -> int:
        """Forget every rule and remove the listeners; returns how many rules there were."""
        with _LOCK:
            removed = len(self.rules)
            if removed:
                event.remove(Session, "after_flush", self._note_changes)
                event.remove(Session, "before_commit", self._enqueue_called_for)
                event.remove(Session, "after_commit", self._forget)
                event.remove(Session, "after_soft_rollback", self._forget_on_rollback)
            self.rules = []
        return removed

    def listening(self) -> bool:
        """Whether this registry's listeners are installed on `Session` (while it has rules)."""
        return event.contains(Session, "after_flush", self._note_changes)

    def _note_changes(self, session: Session, flush_context: UOWTransaction) -> None:
        """After a flush: note each object a rule watches whose attributes changed, with
        their values before the transaction (the first change's old value)."""
        rules = self.rules
        if not rules:
            return
        noted: Noted = session.info.setdefault(self._noted_key, {})
        for collection, inserted in ((session.new, True), (session.dirty, False)):
            for obj in collection:
                for rule in rules:
                    if not isinstance(obj, rule.cls):
                        continue
                    state = inspect(obj)
                    histories = {key: state.attrs[key].history for key in rule.keys}
                    if not any(h.has_changes() for h in histories.values()):
                        continue
                    entry = noted.get((id(rule), id(obj)))
                    if entry is None:
                        before = {
                            key: NOTHING
                            if inserted
                            else (h.deleted[0] if h.deleted else _unchanged(h))
                            for key, h in histories.items()
                        }
                        noted[(id(rule), id(obj))] = (rule, obj, before)

    def _enqueue_called_for(self, session: Session) -> None:
        """At the outer commit: flush what is pending, then enqueue a job for each noted
        object that ends the transaction as a rule asks, about it, on the session's
        connection, in one `enqueue_many` through this registry."""
        if not self.rules or not commits_the_transaction(session):
            return
        session.flush()  # what commit would flush next (nothing if clean): its changes count too
        noted: Noted = session.info.pop(self._noted_key, {})
        from sqla_queue.db.models import Job
        from sqla_queue.enqueue import enqueue_many

        rows: list[dict[str, Any]] = []
        registry = None
        for rule, obj, before in noted.values():
            state = inspect(obj)
            if state.deleted or state.was_deleted or state.transient:
                continue
            if rule.calls_for(obj, before):
                registry = rule.task.registry
                rows.append({"task": rule.task.name, "args": rule.args_of(obj), "about": obj})
        if rows:  # a commit of many changes is one batch
            connection = session.connection(bind_arguments={"mapper": Job})  # the jobs' engine
            enqueue_many(connection, rows, registry=registry)

    def _forget(self, session: Session) -> None:
        if commits_the_transaction(session):
            session.info.pop(self._noted_key, None)

    def _forget_on_rollback(self, session: Session, previous_transaction: Any) -> None:
        if previous_transaction.parent is None:  # the outermost transaction ended
            session.info.pop(self._noted_key, None)


def _unchanged(history: Any) -> Any:
    return history.unchanged[0] if history.unchanged else NOTHING


def check_rule(
    attributes: tuple[Any, ...],
    to: Any,
    from_: Any,
    when: Callable[[Any], bool] | None,
    args: Callable[[Any], Mapping[str, Any]] | None,
) -> type[Any]:
    """Refuse a bad `on_change` rule before its task is registered; returns its class."""
    if not attributes or not all(isinstance(a, InstrumentedAttribute) for a in attributes):
        raise ConfigurationError(
            detail="on_change takes mapped attributes (Order.status, ...), got "
            f"{', '.join(repr(a) for a in attributes) or 'none'}"
        )
    classes = {a.class_ for a in attributes}
    if len(classes) != 1:
        raise ConfigurationError(
            detail="on_change's attributes belong to one mapped class; register one rule "
            f"per class (got {', '.join(sorted(c.__name__ for c in classes))})"
        )
    if len(attributes) > 1 and (to is not MISSING or from_ is not MISSING):
        raise ConfigurationError(
            detail="on_change with several attributes fires when any changes: to= and "
            "from_= name one attribute's values; use when=lambda obj: ... instead"
        )
    for name, value in (("when", when), ("args", args)):
        if value is not None and not callable(value):
            raise ConfigurationError(detail=f"on_change({name}=...) takes a callable of the object")
    cls: type[Any] = classes.pop()
    return cls


def check_default_args(task: TaskSpec, cls: type[Any]) -> None:
    """Refuse a handler that cannot take the default args, the primary key of `cls` by
    attribute name: every change would fail its commit otherwise."""
    mapper = inspect(cls)
    keys = [mapper.get_property_by_column(column).key for column in mapper.primary_key]
    try:
        task.check_args(dict.fromkeys(keys))
    except InvalidJobError as exc:
        shown = ", ".join(f'"{key}": ...' for key in keys)
        raise ConfigurationError(
            detail=f"on_change enqueues {cls.__name__}'s primary key as args by default "
            f"({{{shown}}}) and {exc.context['detail']}; name the handler's parameter "
            f"{' and '.join(keys)}, or pass args=lambda obj: {{...}} with its parameters' names"
        ) from None


def add_rule(
    rules: ChangeRules,
    task: TaskSpec,
    attributes: tuple[Any, ...],
    to: Any = MISSING,
    from_: Any = MISSING,
    when: Callable[[Any], bool] | None = None,
    args: Callable[[Any], Mapping[str, Any]] | None = None,
) -> ChangeRule:
    """Check and record an `on_change` rule for `task` in `rules`, its registry's
    (`Registry.on_change`)."""
    cls = check_rule(attributes, to, from_, when, args)
    rule = ChangeRule(task, cls, tuple(a.key for a in attributes), to, from_, when, args)
    rules.add(rule, attributes)
    return rule


class _HasChangeRules(Protocol):
    change_rules: ChangeRules


def remove_rules(registry: _HasChangeRules) -> int:
    """Forget the `on_change` rules of `registry` (a test's, when it ends) and remove its
    `Session` listeners; returns how many. The attributes keep loading their old value
    when set."""
    return registry.change_rules.clear()
