"""Filters for an application's own Alembic autogenerate, so it leaves sqla-queue alone.

    from sqla_queue.alembic_ext import include_name, include_object
    context.configure(..., include_schemas=True,
                      include_name=include_name, include_object=include_object)

Without them, an autogenerate with `include_schemas=True` would see our tables in the
database and not in your metadata, and write a revision that drops them.
"""

from __future__ import annotations

from typing import Any

from .migrate import VERSION_TABLE
from .models import SCHEMA


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Skip the `sqla_queue` schema, its tables, and our version table."""
    if type_ == "schema":
        return name != SCHEMA
    if type_ == "table":
        return parent_names.get("schema_name") != SCHEMA and name != VERSION_TABLE
    return True


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Skip every object whose table lives in the `sqla_queue` schema."""
    table = obj if type_ == "table" else getattr(obj, "table", None)
    if table is not None and getattr(table, "schema", None) == SCHEMA:
        return False
    return not (type_ == "table" and name == VERSION_TABLE)
