#!/usr/bin/env bash
# The test suite from a fresh clone: a virtual environment, the project with its test
# extras, the linters and type checker, then pytest against a real PostgreSQL.
# Fast tests by default; --slow adds the slow ones (concurrency, fault injection, MultiXacts,
# table size: minutes). Every other argument goes to pytest, after ours (`-n 0` runs serially).
# Parallel (pytest-xdist): every test has a database of its own, cloned from its worker's
# template. The tests mostly wait on sleeps, subprocesses and the server, so more workers than
# cores pay: SQLA_QUEUE_TEST_WORKERS sets how many (default 4; "auto" is one per core).
# No --dist loadgroup: with pytest 9.2 it silently stops grouping (pytest-xdist issue 1386);
# a test that must not overlap another takes a file lock (see tests/system/test_packaging.py).
set -euo pipefail
cd "$(dirname "$0")/.."
marker=(-m "not slow")
args=()
for arg in "$@"; do
  if [ "$arg" = "--slow" ]; then marker=(); else args+=("$arg"); fi
done
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --strict sqla_queue
.venv/bin/lint-imports
parallel=(-n "${SQLA_QUEUE_TEST_WORKERS:-4}")
.venv/bin/pytest "${parallel[@]}" ${marker[@]+"${marker[@]}"} ${args[@]+"${args[@]}"}
