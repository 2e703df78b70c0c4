#!/usr/bin/env bash
# The whole test suite, from a fresh clone: a virtual environment, the project with its
# test extras, the linters and type checker, then pytest against a real PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --strict sqla_queue
.venv/bin/pytest "$@"
