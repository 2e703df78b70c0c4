"""The asyncio loop the relay and the broker worker each run on, and how it is stopped."""

from __future__ import annotations

import abc
import asyncio
import signal
import threading


class BrokerLoop(abc.ABC):
    """Runs `_main` on a new asyncio loop until `stop()` (from any thread, also before the
    loop started) or SIGTERM/SIGINT, which call `_on_signal`: the relay and the broker
    worker each say there how they finish, and exit at once on a second signal."""

    def __init__(self) -> None:
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._signals = 0

    def stop(self) -> None:
        """Ask `run` to finish; safe from any thread, also before `run` started."""
        self._stop_requested = True
        if self._stopping is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    def _run_loop(self, install_signal_handlers: bool | None) -> None:
        """Run `_main` to its end; signal handlers by default only on the main thread."""
        if install_signal_handlers is None:
            install_signal_handlers = threading.current_thread() is threading.main_thread()
        asyncio.run(self._start(install_signal_handlers))

    async def _start(self, install_signal_handlers: bool) -> None:
        self._stopping = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stop_requested:
            self._stopping.set()
        if install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(signum, self._on_signal, signum)
        await self._main()

    @abc.abstractmethod
    async def _main(self) -> None:
        """The work, until `self._stopping` is set (or, in a burst, nothing is left)."""

    @abc.abstractmethod
    def _on_signal(self, signum: int) -> None:
        """The first SIGTERM/SIGINT: log and `stop()`; a second one: exit at once."""
