"""Our schema as PostgreSQL's catalogue holds it, in a form two databases can be compared by:
tables and their columns in order, indexes (definition and validity), constraints
(definition and whether validated), triggers, functions, table options, the marker, and the
recorded revision kinds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, text

from sqla_queue.db.models import SCHEMA

_QUERIES = {
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = :schema AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum""",
    "indexes": """
        SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = :schema ORDER BY c.relname""",
    "constraints": """
        SELECT t.relname, c.conname, pg_get_constraintdef(c.oid), c.convalidated
        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = :schema ORDER BY t.relname, c.conname""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = :schema AND NOT t.tgisinternal ORDER BY t.tgname""",
    "functions": """
        SELECT p.proname, md5(pg_get_functiondef(p.oid))
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = :schema ORDER BY p.proname""",
    "options": """
        SELECT c.relname, c.reloptions FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = :schema AND c.relkind = 'r' ORDER BY c.relname""",
    "marker": "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace "
    "WHERE nspname = :schema",
}


def schema_catalogue(bind: Engine | Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every part of our schema a migration makes, as sorted rows per kind."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return schema_catalogue(conn)
    found = {
        kind: [tuple(row) for row in bind.execute(text(sql), {"schema": SCHEMA})]
        for kind, sql in _QUERIES.items()
    }
    if bind.execute(text(f"SELECT to_regclass('{SCHEMA}.schema_revisions')")).scalar():
        found["kinds"] = [
            tuple(row)
            for row in bind.execute(
                text(f"SELECT revision, kind FROM {SCHEMA}.schema_revisions ORDER BY revision")
            )
        ]
    return found
