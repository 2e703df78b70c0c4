"""Health endpoints over HTTP for a worker (`sqla-queue worker --health-port N`).

    GET /livez   200 while the process's loops are alive and none is stuck, else 503
    GET /readyz  200 while /livez holds and the database answers, else 503
    GET /health  the same as /readyz
    GET /scaling the autoscaling signal per queue (`sqla_queue.db.scaling`), when the
                 runner serves it (the table worker does)

Each answer is a small JSON object saying what is ok and what is not. The server is the
standard library's `ThreadingHTTPServer` on a daemon thread: no dependency, and a slow
probe never holds up another. What the answers say is decided by two callables (`Probe`):
the worker's (`sqla_queue.worker.health`) and the `--processes` supervisor's, which asks
its children (`sqla_queue.worker.supervisor`).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqla_queue.errors import ConfigurationError

log = logging.getLogger("sqla_queue.health")

DEFAULT_HEALTH_HOST = "0.0.0.0"
"""Where the health server listens unless told otherwise: every interface, as a
Kubernetes probe (sent to the pod's IP by the kubelet) needs."""

Probe = Callable[[], tuple[bool, dict[str, Any]]]
"""Whether all is well, and a JSON-able report of what is and what is not."""

LIVENESS_PATHS = frozenset({"/livez"})
READINESS_PATHS = frozenset({"/readyz", "/health"})


class Pulse:
    """When one loop's current round of work began (`busy_since`; None while it waits).

    Two stores of a float and a None: cheap enough for every round of a loop."""

    __slots__ = ("busy_since",)

    def __init__(self) -> None:
        self.busy_since: float | None = None

    def busy(self) -> None:
        """A round of work begins."""
        self.busy_since = time.monotonic()

    def idle(self) -> None:
        """The loop waits (an event, a timer, a backoff): not stuck, however long."""
        self.busy_since = None

    def stuck_for(self, now: float) -> float:
        """Seconds the current round has kept the loop busy (0 while it waits)."""
        since = self.busy_since
        return 0.0 if since is None else max(0.0, now - since)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    livez: Probe
    readyz: Probe
    extra: dict[str, Probe]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "sqla-queue"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path in LIVENESS_PATHS:
            probe = self.server.livez
        elif path in READINESS_PATHS:
            probe = self.server.readyz
        elif path in self.server.extra:
            probe = self.server.extra[path]
        else:
            paths = ["/livez", "/readyz", "/health", *sorted(self.server.extra)]
            self._send(404, {"status": "not found", "paths": paths}, body)
            return
        try:
            ok, report = probe()
        except Exception as exc:  # a probe that fails says so; the server keeps serving
            log.exception("health probe %s failed", path)
            ok, report = False, {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        self._send(200 if ok else 503, report, body)

    def _send(self, status: int, report: dict[str, Any], body: bool) -> None:
        data = json.dumps(report, sort_keys=True).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class HealthServer:
    """Serves `livez` and `readyz` (and the `extra` paths' probes, e.g. `/scaling`) on
    `host:port` from a daemon thread until `stop()`."""

    def __init__(
        self,
        host: str,
        port: int,
        livez: Probe,
        readyz: Probe,
        extra: dict[str, Probe] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._livez = livez
        self._readyz = readyz
        self._extra = dict(extra or {})
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve. A port that cannot be bound is a `ConfigurationError`."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_class = type("_Server", (_Server,), {"address_family": family})
        try:
            server: _Server = server_class((self.host, self.port), _Handler)
        except OSError as exc:
            raise ConfigurationError(
                detail=f"cannot serve health checks on {self.host}:{self.port}: "
                f"{exc.strerror or exc}"
            ) from None
        server.livez = self._livez
        server.readyz = self._readyz
        server.extra = self._extra
        self._server = server
        self.port = int(server.server_address[1])  # the port bound, when given 0
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="sqla-queue-health",
            daemon=True,
        )
        self._thread.start()
        log.info("serving health checks on http://%s:%d/livez and /readyz", self.host, self.port)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and free the port (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["DEFAULT_HEALTH_HOST", "HealthServer", "Probe", "Pulse"]
