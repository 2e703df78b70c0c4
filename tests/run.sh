#!/usr/bin/env bash
# The test suite from a fresh clone: a virtual environment, the project with its test
# extras, the linters and type checker, then pytest against a real PostgreSQL.
# Fast tests by default; --slow adds the slow ones (concurrency, fault injection, MultiXacts,
# table size: minutes). Every other argument goes to pytest.
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
.venv/bin/pytest ${marker[@]+"${marker[@]}"} ${args[@]+"${args[@]}"}
