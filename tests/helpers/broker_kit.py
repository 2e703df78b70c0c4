"""Helpers of the broker tests: the brokers (skipped when one does not answer), unique
names per test and their deletion, relay and broker-worker processes, reading a broker."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from sqlalchemy.engine import make_url

from helpers.apps.broker_app import EFFECTS_TABLE
from sqla_queue.brokers.cleanup import delete_route
from sqla_queue.brokers.kinds import parse_route
from sqla_queue.brokers.routes import Route

TESTS_DIR = Path(__file__).resolve().parents[1]
NATS_URL = os.environ.get("SQLA_QUEUE_TEST_NATS_URL", "nats://127.0.0.1:4222")
AMQP_URL = os.environ.get("SQLA_QUEUE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


def answers(url: str) -> bool:
    """Whether something listens at the URL's host and port."""
    parts = urlsplit(url)
    default = 4222 if parts.scheme == "nats" else 5672
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default), 3).close()
    except OSError:
        return False
    return True


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Broker:
    """One broker for one test: a unique route, readers, and deletion of what it created."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.url = NATS_URL if kind == "nats" else AMQP_URL
        tag = uuid.uuid4().hex[:10]
        text = f"nats:sqlaqtest.{tag}" if kind == "nats" else f"amqp:sqlaqtest-{tag}/jobs"
        self.route: Route = parse_route(text)

    def run(self, coroutine: Any) -> Any:
        return asyncio.run(coroutine)

    # -- reading ----------------------------------------------------------------------------

    def ids_in_route(self) -> list[int]:
        """Job ids of every message waiting in the route (read without consuming on NATS;
        drained on RabbitMQ)."""
        return self.run(self._nats_ids() if self.kind == "nats" else self._amqp_drain())

    def dead_letters(self) -> int:
        return self.run(
            self._nats_count(self.route.dead_stream)
            if self.kind == "nats"
            else self._amqp_count(self.route.amqp_dead_queue)
        )

    def waiting(self) -> int:
        return self.run(
            self._nats_count(self.route.stream)
            if self.kind == "nats"
            else self._amqp_count(self.route.amqp_queue)
        )

    async def _nats_count(self, stream: str) -> int:
        import nats
        from nats.js.errors import NotFoundError

        nc = await nats.connect(self.url)
        try:
            info = await nc.jetstream().stream_info(stream)
            return int(info.state.messages)
        except NotFoundError:
            return 0
        finally:
            await nc.close()

    async def _nats_ids(self) -> list[int]:
        import json

        import nats

        nc = await nats.connect(self.url)
        js = nc.jetstream()
        try:
            info = await js.stream_info(self.route.stream)
            first, last = info.state.first_seq, info.state.last_seq
            ids: list[int] = []
            for start in range(first, last + 1, 500):
                seqs = range(start, min(start + 500, last + 1))
                msgs = await asyncio.gather(
                    *(js.get_msg(self.route.stream, seq) for seq in seqs), return_exceptions=True
                )
                ids += [json.loads(m.data)["id"] for m in msgs if not isinstance(m, Exception)]
            return ids
        finally:
            await nc.close()

    async def _amqp_count(self, queue: str) -> int:
        import aio_pika

        connection = await aio_pika.connect(self.url)
        try:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, passive=True)
            return int(declared.declaration_result.message_count or 0)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return 0
        finally:
            await connection.close()

    async def _amqp_drain(self) -> list[int]:
        import json

        import aio_pika

        connection = await aio_pika.connect(self.url)
        ids: list[int] = []
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(self.route.amqp_queue, passive=True)
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                ids.append(json.loads(message.body)["id"])
        finally:
            await connection.close()
        return ids

    # -- cleanup ----------------------------------------------------------------------------

    def delete_all(self) -> None:
        self.run(delete_route(self.url, self.route))


def broker_fixture(request: pytest.FixtureRequest) -> Iterator[Broker]:
    kind = request.param
    broker = Broker(kind)
    if not answers(broker.url):
        pytest.skip(
            f"{kind} broker does not answer at {broker.url} (start it, or set "
            f"SQLA_QUEUE_TEST_{kind.upper()}_URL)"
        )
    pytest.importorskip("nats" if kind == "nats" else "aio_pika")
    yield broker
    broker.delete_all()


class Process:
    """A `sqla-queue` subprocess with its output in a log file."""

    def __init__(self, args: list[str], database_url: str, log_path: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
        env["COLUMNS"] = "400"
        env["SQLA_QUEUE_DATABASE_URL"] = database_url
        env["BROKER_APP_DSN"] = libpq(database_url)
        self.args = [sys.executable, "-m", "sqla_queue", *args]
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log_path.open("ab") as log:
            log.write(b"--- start ---\n")
            log.flush()
            self.proc = subprocess.Popen(
                self.args, env=self.env, cwd=TESTS_DIR, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def started(self) -> bool:
        return " started: " in self.log().rpartition("--- start ---")[2]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def processes_fixture(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(database_url: str, *args: str) -> Process:
        process = Process(list(args), database_url, tmp_path / f"proc{len(started)}.log")
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.stop()


class Effects:
    """The test database's `broker_effects` table: one row per handler run."""

    def __init__(self, database_url: str) -> None:
        self.conn = psycopg.connect(libpq(database_url), autocommit=True)
        self.conn.execute(EFFECTS_TABLE)

    def runs(self) -> dict[int, int]:
        rows = self.conn.execute("SELECT job_id, count(*) FROM public.broker_effects GROUP BY 1")
        return {int(job_id): int(count) for job_id, count in rows}

    def attempts(self, job_id: int) -> list[int]:
        rows = self.conn.execute(
            "SELECT attempt FROM public.broker_effects WHERE job_id = %s ORDER BY at", (job_id,)
        )
        return [int(attempt) for (attempt,) in rows]

    def value(self, sql: str, *params: Any) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]
