"""The LISTEN side of NOTIFY: a thread that wakes the worker when jobs are committed, and
tells it at once when jobs it holds are cancelled."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Collection

from sqlalchemy import Engine

from sqla_queue.db import queries
from sqla_queue.db.notify import listening
from sqla_queue.runtime.health_server import Pulse

log = logging.getLogger("sqla_queue.notify")


class Listener:
    """Holds one autocommit connection in LISTEN and calls `wake()` on each notification.

    Only notifications for `queues` (all, when None) wake. A notification on
    `queries.CANCEL_CHANNEL` calls `on_cancel(job_ids)`. After every (re)connect it also
    wakes once, since notifications sent while it was disconnected are lost. Reconnects
    with a short jittered backoff (at most `max_backoff` s), so it is back within about a
    second of the database; the worker's polling covers the gap. It logs the first failure
    of an outage and the recovery, not every attempt.
    """

    def __init__(
        self,
        engine: Engine,
        queues: Collection[str] | None,
        wake: Callable[[], None],
        on_cancel: Callable[[list[int]], None] | None = None,
        max_backoff: float = 1.0,
        pulse: Pulse | None = None,
    ) -> None:
        self._engine = engine
        self._queues = frozenset(queues) if queues is not None else None
        self._wake = wake
        self._on_cancel = on_cancel
        self._max_backoff = max_backoff
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqla-queue-listener", daemon=True)
        self._failing = False
        self.connected = threading.Event()
        self.backend_pid: int | None = None
        """The server process id of its connection while it listens (None while it is
        reconnecting): the worker's registration records it, and the autoscaling signal
        counts the worker only while that backend is there (a SIGKILLed worker's goes)."""
        self.pulse = pulse or Pulse()
        """Busy while it connects or handles a notification, idle while it waits for one
        (or out a backoff): `/livez` (sqla_queue.worker.health)."""

    @property
    def thread(self) -> threading.Thread | None:
        """The listener's thread once started (None before)."""
        return self._thread if self._thread.ident is not None else None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            self.pulse.busy()
            try:
                self._listen()
                backoff = 0.05
            except Exception as exc:  # any failure: reconnect, never die
                self.connected.clear()
                if self._stopping.is_set():
                    return
                if not self._failing:
                    text = str(getattr(exc, "orig", None) or exc).strip()
                    log.warning(
                        "LISTEN connection lost (%s); reconnecting",
                        text.splitlines()[0][:300] if text else type(exc).__name__,
                    )
                    self._failing = True
                self.pulse.idle()
                self._stopping.wait(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, self._max_backoff)

    def _listen(self) -> None:
        try:
            with listening(self._engine, queries.LISTEN) as conn:
                self.backend_pid = conn.info.backend_pid
                self.connected.set()
                if self._failing:
                    log.warning("LISTEN connection restored")
                    self._failing = False
                self._wake()
                while not self._stopping.is_set():
                    self.pulse.idle()
                    for notification in conn.notifies(timeout=0.5):
                        self.pulse.busy()
                        if notification.channel == queries.CANCEL_CHANNEL:
                            self._cancelled(notification.payload)
                        elif self._queues is None or notification.payload in self._queues:
                            self._wake()
                        self.pulse.idle()
        finally:
            self.backend_pid = None
            self.connected.clear()

    def _cancelled(self, payload: str) -> None:
        if self._on_cancel is None:
            return
        ids = [int(part) for part in payload.split(",") if part.strip().isdigit()]
        if ids:
            self._on_cancel(ids)
