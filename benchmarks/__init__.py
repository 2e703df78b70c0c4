"""The sqla-queue benchmark harness: `python -m benchmarks --help`.

Every figure is taken against a database the harness creates for itself on the server and
drops afterwards, next to the raw-SQL ceiling (pgbench, ../shared/bench/ceiling/run) measured
in the same run, so each figure can be read as a ratio to what the database itself allows.
"""
