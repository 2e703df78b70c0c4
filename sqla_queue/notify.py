"""The LISTEN side of NOTIFY: a thread that wakes the worker when jobs are committed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from sqlalchemy import Engine

from . import queries

log = logging.getLogger("sqla_queue.notify")


class Listener:
    """Holds one autocommit connection in LISTEN and calls `wake()` on each notification.

    Only notifications for `queues` (all, when None) wake. After every (re)connect it
    also wakes once, since notifications sent while it was disconnected are lost.
    Reconnects with exponential backoff; the worker's polling covers the gap.
    """

    def __init__(
        self,
        engine: Engine,
        queues: Collection[str] | None,
        wake: Callable[[], None],
        max_backoff: float = 10.0,
    ) -> None:
        self._engine = engine
        self._queues = frozenset(queues) if queues is not None else None
        self._wake = wake
        self._max_backoff = max_backoff
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqla-queue-listener", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                self._listen()
                backoff = 0.1
            except Exception as exc:  # any failure: reconnect, never die
                self.connected.clear()
                if self._stopping.is_set():
                    return
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _listen(self) -> None:
        raw = self._engine.raw_connection()
        try:
            conn = raw.driver_connection
            assert conn is not None
            conn.autocommit = True
            conn.execute(queries.LISTEN)
            self.connected.set()
            self._wake()
            while not self._stopping.is_set():
                for notification in conn.notifies(timeout=0.5):
                    if self._queues is None or notification.payload in self._queues:
                        self._wake()
        finally:
            self.connected.clear()
            try:
                raw.invalidate()
            finally:
                raw.close()
