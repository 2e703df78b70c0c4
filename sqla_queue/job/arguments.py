"""A task's arguments as Python values: `ArgsAdapter`, built once per task.

A handler parameter annotated with a type JSON cannot hold as it is (`datetime`, `date`,
`UUID`, `Decimal`, an enum, a dataclass, a `TypedDict`, a Pydantic model, or a list or an
optional of one) is validated and turned into JSON at enqueue (`encode`), and rebuilt from
its JSON before the handler is called (`decode`). Parameters annotated with JSON types
(`int`, `str`, `dict[str, Any]`, ...) or not annotated are passed as they are, at no cost.

With Pydantic installed (the `pydantic` extra), each such parameter gets a
`pydantic.TypeAdapter`; without it, a small built-in converter handles the standard
library's types (`datetime`, `date`, `UUID`, `Decimal`, enums, dataclasses, `TypedDict`s,
lists and optionals of them). A type neither knows (a class of the application's own) is
passed as it is, as before typed arguments. Encoding accepts the JSON form too, so a job
enqueued by name or from the command line with `"2026-01-01T00:00:00+00:00"` for a
`datetime` is checked the same way, and encoding twice changes nothing.

A parameter annotated with a mapped class (`order: Order`, or `Order | None`) takes the
instance at enqueue and keeps a reference, `{"$row": "orders", "key": [42], "version": 3}`
(the class's base table, its primary key, and its `version_id_col` value when it has one);
`decode` gives back a `RowRef`, which the worker loads in the handler's session before the
call (`sqla_queue.orm.row_args`). A reference to another table than the parameter's class is
refused, at enqueue and before the call: a job never loads a row it was not about. A handler
takes at most one row (`ONE_ROW`): a job is about one row, and its one reference must name
it (`sqla_queue.orm.row_args.load_rows` checks it before the load).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import inspect
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Mapper

from sqla_queue.job.about import key_text, mapper_table

__all__ = [
    "ONE_ROW",
    "ROW_MARK",
    "ArgsAdapter",
    "ArgumentError",
    "RowRef",
    "RowsRefused",
    "row_inside",
    "row_parameters",
    "too_many_rows",
    "use_pydantic",
]

ROW_MARK = "$row"
"""The key that marks a stored value as a row reference (its value: the row's table)."""

_JSON_TYPES: frozenset[object] = frozenset(
    {int, str, float, bool, type(None), None, dict, list, Any, object, inspect.Parameter.empty}
)

use_pydantic = True
"""Whether `ArgsAdapter` uses Pydantic when it is installed (tests turn it off to check the
built-in converters; an application has no reason to)."""


ONE_ROW = (
    "a job is about one row (its `about`, which jobs_of, HasJobs, the row policies and "
    "Unique(about=True) go by) and loads only that row, so a task takes at most one ORM row: "
    "take the others by their key ({example}) and load them in ctx.session()"
)
"""Why a handler with more than one parameter annotated with a mapped class is refused."""


def too_many_rows(rows: Mapping[str, str]) -> str | None:
    """Why a handler whose row parameters are `rows` (name: mapped class name) is refused,
    or None when it takes at most one."""
    if len(rows) <= 1:
        return None
    taken = ", ".join(f"{name}: {kind}" for name, kind in rows.items())
    name = list(rows)[1]
    return f"it takes {len(rows)} ORM rows ({taken}): " + ONE_ROW.format(example=f"{name}_id: int")


def row_inside(name: str, annotation: Any) -> str | None:
    """Why parameter `name` is refused when its annotation holds a mapped class in another
    form than one row (`Order` or `Order | None`): `list[Order]`, `Order | Customer`,
    `dict[str, Order]` would be stored as they are, which no JSON holds; None otherwise."""
    if _row_converter(annotation) is not None:
        return None
    mapped = next((t for t in _types_in(annotation) if _mapper_of(t) is not None), None)
    if mapped is None:
        return None
    kind = mapped.__name__
    return (
        f"its parameter {name!r} takes {_shown(annotation)}: a row parameter is one row, "
        f"`{kind}` or `{kind} | None`; " + ONE_ROW.format(example=f"{name}_ids: list[int]")
    )


def row_parameters(func: Callable[..., Any], names: Iterable[str]) -> dict[str, str] | None:
    """The parameters among `names` that take a mapped row (name: the class's name), in the
    handler's order; None while its annotations cannot be resolved (a forward reference to
    a class defined later: `ArgsAdapter`, built at first use, checks them then)."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:
        return None
    found = {}
    for name in names:
        converter = _row_converter(hints.get(name, inspect.Parameter.empty))
        if converter is not None:
            inner = converter.inner if isinstance(converter, _Optional) else converter
            if isinstance(inner, _Row):
                found[name] = inner.mapped.__name__
    return found


def rows_refused(func: Callable[..., Any], names: Iterable[str]) -> str | None:
    """Why a handler cannot be a task's for its row parameters (more than one row, or a row
    inside another type), or None; None too while its annotations cannot be resolved."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:
        return None
    names = list(names)
    for name in names:
        why = row_inside(name, hints.get(name, inspect.Parameter.empty))
        if why is not None:
            return why
    rows = row_parameters(func, names)
    return None if rows is None else too_many_rows(rows)


def _types_in(annotation: Any) -> Iterable[Any]:
    """`annotation` and every type argument inside it, depth first."""
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _types_in(arg)


def _shown(annotation: Any) -> str:
    """`annotation` as written in a handler, without module paths: `list[Order]`."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _shown(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _shown(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


class ArgumentError(ValueError):
    """A value that does not fit its parameter's type: one line, without the parameter."""


@dataclasses.dataclass(frozen=True)
class RowRef:
    """A stored reference to one row, as `decode` rebuilds it: the mapped class the handler's
    parameter names, the table it was checked against, the primary key's values and the
    row's version at enqueue (None: the class has no `version_id_col`)."""

    mapped: type
    table: str
    key: tuple[Any, ...]
    version: Any = None

    @property
    def about(self) -> str:
        """The row as `about=` writes it: `<table>:<key>`."""
        return f"{self.table}:{key_text(self.key)}"

    @property
    def shown(self) -> str:
        """The row in a reason: `orders 42`."""
        return f"{self.table} {key_text(self.key)}"


@dataclasses.dataclass(frozen=True)
class RowsRefused:
    """Why a job's rows were not handed to its handler: the job `cancelled` (a row gone or
    changed, by its task's policy: written already), `snoozed` (`seconds`: a row locked by
    another transaction) or `failed` (no session to load rows in)."""

    kind: str
    reason: str
    seconds: float = 0.0


class _Converter(Protocol):
    def encode(self, value: Any) -> Any: ...

    def decode(self, value: Any) -> Any: ...


def _is_json(annotation: object) -> bool:
    """Whether values of `annotation` are JSON as they are (nothing to convert)."""
    if annotation in _JSON_TYPES:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin is typing.Annotated:
        return _is_json(typing.get_args(annotation)[0])
    if origin in (list, dict, tuple, typing.Union, types.UnionType, Mapping):
        return all(arg is Ellipsis or _is_json(arg) for arg in typing.get_args(annotation))
    return False


class ArgsAdapter:
    """What a handler's annotated parameters need at enqueue and before the call."""

    def __init__(self, func: Callable[..., Any], names: Mapping[str, inspect.Parameter]) -> None:
        try:
            hints = typing.get_type_hints(func, include_extras=True)
        except Exception:  # a forward reference Python cannot resolve: nothing is converted
            hints = {}
        self.converters: dict[str, _Converter] = {}
        self.rows: tuple[str, ...] = ()
        """The parameters that take a mapped row (their values are `RowRef`s once decoded),
        in the handler's order."""
        rows: dict[str, str] = {}
        inside: str | None = None
        for name in names:
            annotation = hints.get(name, inspect.Parameter.empty)
            if _is_json(annotation):
                continue
            inside = inside or row_inside(name, annotation)
            converter = _converter(annotation)
            if converter is not None:
                self.converters[name] = converter
                inner = converter.inner if isinstance(converter, _Optional) else converter
                if isinstance(inner, _Row):
                    rows[name] = inner.mapped.__name__
        self.rows = tuple(rows)
        self.refused = inside or too_many_rows(rows)
        """Why the handler cannot be a task's (it takes more than one row), or None."""

    def about(self, encoded: Mapping[str, Any]) -> str | None:
        """The `about` text of the row argument in `encoded` args (None: none)."""
        for name in self.rows:
            value = encoded.get(name)
            if isinstance(value, Mapping) and ROW_MARK in value:
                return f"{value[ROW_MARK]}:{key_text(value['key'])}"
        return None

    def encode(self, args: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """`args` with each converted parameter's value as its JSON, or why one does not
        fit (naming the parameter): (args, None) or (args, reason)."""
        if not self.converters:
            return dict(args), None
        encoded = dict(args)
        for name, converter in self.converters.items():
            if name in encoded:
                try:
                    encoded[name] = converter.encode(encoded[name])
                except (ValueError, TypeError) as exc:
                    return encoded, f"argument {name!r}: {_one_line(exc)}"
        return encoded, None

    def decode(self, args: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
        """The handler's keyword arguments rebuilt from stored `args`, or why one cannot be
        rebuilt (its stored value no longer fits the handler's type)."""
        if not self.converters:
            return args, None
        decoded = dict(args)
        for name, converter in self.converters.items():
            if name in decoded:
                try:
                    decoded[name] = converter.decode(decoded[name])
                except (ValueError, TypeError) as exc:
                    return args, f"argument {name!r}: {_one_line(exc)}"
        return decoded, None


def _one_line(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):  # a pydantic ValidationError: its first error, on one line
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{first['msg']}{f' at {where}' if where else ''} (got {first.get('input')!r:.80})"
    return str(exc).replace("\n", " ")


def _converter(annotation: Any) -> _Converter | None:
    row = _row_converter(annotation)
    if row is not None:
        return row
    if use_pydantic:
        try:
            import pydantic
        except ImportError:
            pass
        else:
            try:
                return _Pydantic(pydantic.TypeAdapter(annotation))
            except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError):
                pass  # e.g. a typing.TypedDict before Python 3.12: the built-in converter's
    return _builtin(annotation)


class _Pydantic:
    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

    def encode(self, value: Any) -> Any:
        return self.adapter.dump_python(self.adapter.validate_python(value), mode="json")

    def decode(self, value: Any) -> Any:
        return self.adapter.validate_python(value)


# -- the built-in converters (no Pydantic) ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Simple:
    """A type held as one JSON string or number: `parse` takes the JSON form, `dump` gives it."""

    kind: type
    parse: Callable[[Any], Any]
    dump: Callable[[Any], Any]

    def encode(self, value: Any) -> Any:
        return self.dump(value if self._is_own(value) else self.decode(value))

    def decode(self, value: Any) -> Any:
        if self._is_own(value):
            return value
        try:
            return self.parse(value)
        except (ValueError, TypeError, ArithmeticError, KeyError, AttributeError):
            pass
        raise ArgumentError(f"expected {self.kind.__name__}, got {value!r:.80}")

    def _is_own(self, value: Any) -> bool:
        # a datetime is a date: a date parameter given one is refused, as Pydantic does
        return isinstance(value, self.kind) and not (
            self.kind is dt.date and isinstance(value, dt.datetime)
        )


def _parse_str(parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    def parsed(value: Any) -> Any:
        if not isinstance(value, str):
            raise TypeError(value)
        return parse(value)

    return parsed


def _parse_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(value)
    number = decimal.Decimal(str(value))
    if not number.is_finite():
        raise ValueError(value)
    return number


def _parse_datetime(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


_SIMPLE: dict[type, _Simple] = {
    dt.datetime: _Simple(dt.datetime, _parse_str(_parse_datetime), dt.datetime.isoformat),
    dt.date: _Simple(dt.date, _parse_str(dt.date.fromisoformat), dt.date.isoformat),
    uuid.UUID: _Simple(uuid.UUID, _parse_str(uuid.UUID), str),
    decimal.Decimal: _Simple(decimal.Decimal, _parse_decimal, str),
}


@dataclasses.dataclass(frozen=True)
class _Optional:
    inner: _Converter

    def encode(self, value: Any) -> Any:
        return None if value is None else self.inner.encode(value)

    def decode(self, value: Any) -> Any:
        return None if value is None else self.inner.decode(value)


@dataclasses.dataclass(frozen=True)
class _List:
    item: _Converter

    def encode(self, value: Any) -> Any:
        return [self.item.encode(v) for v in _listed(value)]

    def decode(self, value: Any) -> Any:
        return [self.item.decode(v) for v in _listed(value)]


def _listed(value: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise ArgumentError(f"expected a list, got {value!r:.80}")
    return value


@dataclasses.dataclass(frozen=True)
class _Fields:
    """A dataclass (`make` builds it) or a TypedDict (`make` is dict): its fields by name."""

    kind: Any
    fields: dict[str, _Converter | None]
    make: Callable[..., Any]

    def encode(self, value: Any) -> Any:
        if dataclasses.is_dataclass(value) and isinstance(value, self.kind):
            value = {name: getattr(value, name) for name in self.fields}
        else:
            value = self.decode(value)  # its JSON form: checked by building it
            if self.make is not dict:
                value = {name: getattr(value, name) for name in self.fields}
        return {
            k: v if (c := self.fields.get(k)) is None else c.encode(v) for k, v in value.items()
        }

    def decode(self, value: Any) -> Any:
        if self.make is not dict and isinstance(value, self.kind):
            return value
        if not isinstance(value, Mapping):
            raise ArgumentError(f"expected {self.kind.__name__} or a dict, got {value!r:.80}")
        unknown = value.keys() - self.fields.keys()
        if unknown:
            raise ArgumentError(f"{self.kind.__name__} has no field {sorted(unknown)[0]!r}")
        try:
            built = {
                k: v if (c := self.fields.get(k)) is None else c.decode(v) for k, v in value.items()
            }
            return self.make(**built)
        except TypeError as exc:  # a missing field of a dataclass
            raise ArgumentError(f"{self.kind.__name__}: {exc}") from None


def _builtin(annotation: Any) -> _Converter | None:
    """The built-in converter of `annotation`, or None when it has nothing to convert or is a
    type it does not know."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _builtin(args[0])
    if origin in (typing.Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        if len(others) == 1 and len(args) == 2:
            inner = _builtin(others[0])
            return None if inner is None else _Optional(inner)
        return None
    if origin in (list, tuple) and args and (origin is list or args[1:] == (Ellipsis,)):
        item = _builtin(args[0])
        return None if item is None else _List(item)
    supertype = getattr(annotation, "__supertype__", None)  # a NewType
    if supertype is not None:
        return _builtin(supertype)
    if not isinstance(annotation, type):
        return None
    if annotation in _SIMPLE:
        return _SIMPLE[annotation]
    if issubclass(annotation, enum.Enum):
        return _Simple(annotation, annotation, _enum_value)
    if dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation, include_extras=True)
        fields = {f.name: _field(hints.get(f.name)) for f in dataclasses.fields(annotation)}
        return _Fields(annotation, fields, annotation)
    if typing.is_typeddict(annotation):
        hints = typing.get_type_hints(annotation, include_extras=True)
        return _Fields(annotation, {k: _field(v) for k, v in hints.items()}, dict)
    return None


def _field(annotation: Any) -> _Converter | None:
    return None if annotation is None or _is_json(annotation) else _builtin(annotation)


def _enum_value(member: enum.Enum) -> Any:
    return member.value


# -- mapped rows -----------------------------------------------------------------------------


def _mapper_of(annotation: Any) -> Mapper[Any] | None:
    if not isinstance(annotation, type):
        return None
    mapper: Any = sa_inspect(annotation, raiseerr=False)
    return mapper if isinstance(mapper, Mapper) else None


def _row_converter(annotation: Any) -> _Converter | None:
    """A `_Row` for a mapped class, or an `_Optional` of one for `Order | None`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _row_converter(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        others = [a for a in args if a is not type(None)]
        if len(others) == 1 and len(args) == 2:
            inner = _row_converter(others[0])
            return None if inner is None else _Optional(inner)
        return None
    mapper = _mapper_of(annotation)
    return None if mapper is None else _Row(annotation, mapper)


def _json_key(value: Any) -> Any:
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else str(value)


class _Row:
    """A mapped class's instance, kept as a reference to its row (see the module's doc)."""

    def __init__(self, mapped: type, mapper: Mapper[Any]) -> None:
        self.mapped = mapped
        self.mapper = mapper
        self.table = mapper_table(mapper)

    def encode(self, value: Any) -> Any:
        if isinstance(value, self.mapped):
            key = self.mapper.primary_key_from_instance(value)
            if any(part is None for part in key):
                raise ArgumentError(
                    f"{value!r:.60} has no primary key yet: add it to the session and flush "
                    "first, so the job can name its row"
                )
            ref: dict[str, Any] = {ROW_MARK: self.table, "key": [_json_key(k) for k in key]}
            version = self.mapper.version_id_col
            if version is not None:
                attribute = self.mapper.get_property_by_column(version).key
                ref["version"] = _json_key(getattr(value, attribute))
            return ref
        self.decode(value)  # a stored reference (enqueue by name, the CLI): checked
        return dict(value)

    def decode(self, value: Any) -> RowRef:
        if not isinstance(value, Mapping) or ROW_MARK not in value:
            raise ArgumentError(
                f"expected a {self.mapped.__name__} (a row of {self.table}), got {value!r:.80}"
            )
        if value[ROW_MARK] != self.table:
            raise ArgumentError(
                f"a reference to a row of {value[ROW_MARK]!r} where the handler takes "
                f"{self.mapped.__name__} (a row of {self.table}): refused, a job loads only "
                "the rows it was enqueued about"
            )
        key = value.get("key")
        if not isinstance(key, list) or len(key) != len(self.mapper.primary_key):
            raise ArgumentError(
                f"a reference to {self.table} without its {len(self.mapper.primary_key)}-part "
                f"primary key: {value!r:.80}"
            )
        return RowRef(self.mapped, self.table, tuple(key), value.get("version"))
