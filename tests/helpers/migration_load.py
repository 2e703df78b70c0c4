"""Load beside a migration: processes that enqueue, or claim and finish, until told to stop.

Run as a script (`python tests/helpers/migration_load.py enqueue|work URL STOP OUT`): it
loops until the file STOP exists, then writes OUT as JSON: every operation's start (epoch
seconds) and duration, and every failure's message. The statements are the ones every
revision since sqlaq_0001 accepts (the columns of the first revision), as the code running
before an upgrade issues them: an enqueue is one INSERT in its own transaction; the worker
claims up to 10 queued jobs with FOR UPDATE SKIP LOCKED and finishes them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psycopg

ENQUEUE = "INSERT INTO sqla_queue.jobs (task, queue, args) VALUES ('load', 'default', '{}')"
CLAIM = (
    "UPDATE sqla_queue.jobs SET status = 'running', locked_at = now(), locked_by = 'load', "
    "attempts = attempts + 1 WHERE id IN (SELECT id FROM sqla_queue.jobs "
    "WHERE status = 'queued' AND task = 'load' ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) "
    "RETURNING id"
)
FINISH = "UPDATE sqla_queue.jobs SET status = 'done', finished_at = now() WHERE id = ANY(%s)"


def run_load(kind: str, url: str, stop: Path, out: Path) -> None:
    timings: list[tuple[float, float]] = []
    failures: list[str] = []
    finished = 0
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        while not stop.exists():
            began = time.time()
            start = time.perf_counter()
            try:
                with conn.transaction():
                    if kind == "enqueue":
                        conn.execute(ENQUEUE)
                    else:
                        ids = [row[0] for row in conn.execute(CLAIM)]
                        if ids:
                            conn.execute(FINISH, (ids,))
                            finished += len(ids)
            except psycopg.Error as exc:
                failures.append(f"{type(exc).__name__}: {exc}".strip())
                continue
            timings.append((began, time.perf_counter() - start))
            if kind == "work" and not finished:
                time.sleep(0.01)
    out.write_text(json.dumps({"timings": timings, "failures": failures, "finished": finished}))


if __name__ == "__main__":
    run_load(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
