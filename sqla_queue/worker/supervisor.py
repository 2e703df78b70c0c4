"""`sqla-queue worker --processes N`: N worker processes under one supervising parent.

    sqla-queue worker --app shop.tasks:registry --processes 2

The parent runs no job and opens no database connection. It starts each child as a fresh
interpreter running `python -m sqla_queue worker` with the parent's own options (minus
`--processes`), restarts a child that crashes, forwards SIGTERM/SIGINT, and exits 0 once
every child has shut down cleanly.

Why a subprocess per child rather than `multiprocessing`: each child is exactly the worker a
user runs without `--processes` (the same option parsing, logging, signal handling, shutdown
and exit statuses), so supervision adds no second way to run a worker; nothing is pickled
and nothing of the parent is inherited (no fork of a process holding threads, locks or
connections; the user's app is imported in the children only); and the restart policy reads
plain exit statuses. multiprocessing's spawn context would start the same fresh
interpreters, with pickling and a resource tracker in between and nothing gained.

Restarts (`RestartPolicy`):
- a child that exits non-zero or is killed by a signal is started again after an
  exponential backoff with jitter; the backoff of its slot starts over once a child has run
  `healthy_after` seconds;
- a slot whose child crashes `max_crashes` times within `crash_window` seconds makes the
  parent give up: it stops the other children and exits 1;
- a child that exits with `EXIT_USAGE` or `EXIT_CONFIG` (the app does not load, the schema
  is missing, the configuration is invalid) is never restarted, as no restart can fix it:
  the parent stops the other children and exits 1;
- a child that exits 0 by itself has finished (`--burst`: nothing is due); outside `--burst`
  it is started again like a crashed one, without counting as a crash.

Signals: the first SIGTERM or SIGINT is forwarded to every child as SIGTERM (the worker
treats both alike: stop claiming, release unstarted jobs, let running ones finish within the
shutdown timeout); a second one is forwarded again, so children requeue their jobs and exit
at once. Children run in a session of their own, so a Ctrl-C in a terminal reaches the
parent only and each child gets exactly the signals the parent forwards. A child reads its
stdin, a pipe from the parent (`watch_parent`): when the parent dies without a word
(SIGKILL), the pipe closes and the child shuts down as on SIGTERM, so no worker is orphaned.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import FrameType
from typing import Any, NoReturn

import click

from sqla_queue.errors import (
    AppLoadError,
    ConfigurationError,
    SchemaElsewhereError,
    SchemaMissingError,
    SchemaUnknownError,
)
from sqla_queue.job.retry import RetryPolicy
from sqla_queue.runtime.health_server import HealthServer

log = logging.getLogger("sqla_queue.supervisor")

EXIT_USAGE = 2
"""A child's exit status for a command-line usage error (click's)."""
EXIT_CONFIG = 78
"""A supervised child's exit status for a configuration it cannot outgrow (sysexits'
EX_CONFIG, which systemd's `RestartPreventExitStatus=78` also understands)."""
CONFIGURATION_ERRORS = (
    AppLoadError,
    ConfigurationError,
    SchemaMissingError,
    SchemaElsewhereError,
    SchemaUnknownError,
)
"""Errors a supervised child exits with `EXIT_CONFIG` for: restarting would repeat them."""
CLEAN_EXITS = (0, -signal.SIGTERM)
"""Exit statuses of a child that shut down as told (SIGTERM kills one not yet started)."""


RESTART_BACKOFF = RetryPolicy(base=0.5, factor=2.0, max_delay=30.0, jitter=0.25)
"""0.5 s, 1 s, 2 s ... up to 30 s between restarts of one slot, each spread by up to 25%."""


@dataclass(frozen=True)
class RestartPolicy:
    """When the supervisor starts a crashed child again, and when it gives up."""

    backoff: RetryPolicy = RESTART_BACKOFF
    """The wait before a slot's n-th restart in a row (n = 1 for the first)."""
    healthy_after: float = 30.0
    """Seconds a child must run for the backoff of its slot to start over."""
    max_crashes: int = 5
    """Crashes of one slot within `crash_window` seconds after which the parent gives up."""
    crash_window: float = 60.0


def child_name(slot: int) -> str:
    """The name of the child in `slot` (1-based), also the suffix of its worker id."""
    return f"w{slot}"


def describe_exit(status: int) -> str:
    """A `Popen.returncode` in words: 'exit status 3', 'killed by SIGKILL'."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


@dataclass
class Child:
    """One slot of the supervisor: the process in it now and its record of crashes."""

    slot: int
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = 0.0
    """When (time.monotonic()) to start it; None while it runs or once it has finished."""
    restarts_in_row: int = 0
    crashes: deque[float] = field(default_factory=deque)
    last_status: int | None = None

    @property
    def name(self) -> str:
        return child_name(self.slot)

    @property
    def label(self) -> str:
        return f"{self.name} (pid {self.process.pid})" if self.process else self.name


class Supervisor:
    """Runs one child process per command, restarting crashed ones, until told to stop.

    `run()` must be called on the main thread (it installs signal handlers) and returns the
    exit status for the parent: 0 after a clean shutdown (or, with `burst`, once every child
    finished), 1 after giving up or when a child did not shut down cleanly.
    """

    def __init__(
        self,
        commands: Sequence[Sequence[str]],
        *,
        burst: bool = False,
        policy: RestartPolicy | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not commands:
            raise ConfigurationError(detail="a supervisor needs at least one child command")
        self.children = [Child(slot, list(cmd)) for slot, cmd in enumerate(commands, start=1)]
        self.burst = burst
        self.policy = policy or RestartPolicy()
        self.env = dict(env) if env is not None else None
        self.failure: str | None = None
        """Why the supervisor gave up, if it did."""
        self._unclean: list[str] = []
        self._signals = 0
        self._last_signal = "SIGTERM"
        self._forwarded = 0
        self._stopping = False

    # -- public -----------------------------------------------------------------------------

    def run(self) -> int:
        """Start the children and supervise them; returns the parent's exit status."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "Supervisor.run() installs signal handlers: call it on the main thread"
            )
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        watched = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
        previous = {signum: signal.signal(signum, self._on_signal) for signum in watched}
        previous_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        try:
            log.info("supervising %d worker processes", len(self.children))
            return self._supervise(wake_read)
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(wake_read)
            os.close(wake_write)
            self._abandon()

    # -- the loop ---------------------------------------------------------------------------

    def _supervise(self, wake_fd: int) -> int:
        while True:
            now = time.monotonic()
            for child in self.children:
                if child.process is not None and (status := child.process.poll()) is not None:
                    self._exited(child, status, now)
            while self._forwarded < self._signals:
                self._forward_signal()
            if not self._stopping:
                for child in self.children:
                    if child.restart_at is not None and child.restart_at <= now:
                        self._start(child)
            running = any(child.process is not None for child in self.children)
            pending = [c.restart_at for c in self.children if c.restart_at is not None]
            if not running and (self._stopping or not pending):
                return self._exit_status()
            timeout = 1.0 if self._stopping or not pending else min(pending) - now
            select.select([wake_fd], [], [], max(0.0, min(timeout, 1.0)))
            try:
                while os.read(wake_fd, 512):
                    pass
            except BlockingIOError:
                pass

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:  # SIGCHLD only wakes the loop
            self._signals += 1
            self._last_signal = signal.Signals(signum).name

    def _forward_signal(self) -> None:
        self._forwarded += 1
        self._stopping = True
        running = [child for child in self.children if child.process is not None]
        if self._forwarded == 1:
            log.info(
                "received %s: stopping %d worker process(es) (send again to make them exit now)",
                self._last_signal,
                len(running),
            )
        else:
            log.warning("received %s again: worker processes exit now", self._last_signal)
        self._terminate(running)

    def _start(self, child: Child) -> None:
        restart = child.last_status is not None
        try:
            child.process = subprocess.Popen(
                child.command,
                stdin=subprocess.PIPE,
                env=self.env,
                start_new_session=True,
            )
        except OSError as exc:
            child.restart_at = None
            self._give_up(f"cannot start worker process {child.name}: {exc}")
            return
        child.started_at = time.monotonic()
        child.restart_at = None
        log.log(
            logging.WARNING if restart else logging.INFO,
            "%s worker process %s",
            "restarted" if restart else "started",
            child.label,
        )

    def _exited(self, child: Child, status: int, now: float) -> None:
        label, ran = child.label, now - child.started_at
        assert child.process is not None
        if child.process.stdin is not None:
            child.process.stdin.close()
        child.process = None
        child.last_status = status
        if self._stopping:
            if status not in CLEAN_EXITS:
                self._unclean.append(f"{child.name} {describe_exit(status)}")
            level = logging.INFO if status in CLEAN_EXITS else logging.WARNING
            log.log(level, "worker process %s stopped (%s)", label, describe_exit(status))
            return
        if status == 0 and self.burst:
            log.info("worker process %s finished: nothing is due", label)
            return
        if status in (EXIT_USAGE, EXIT_CONFIG):
            self._give_up(
                f"worker process {label} cannot run with this configuration "
                f"({describe_exit(status)}; its error is above); not restarting it"
            )
            return
        if ran >= self.policy.healthy_after:
            child.restarts_in_row = 0
        if status != 0:
            child.crashes.append(now)
            while child.crashes and child.crashes[0] <= now - self.policy.crash_window:
                child.crashes.popleft()
            if len(child.crashes) >= self.policy.max_crashes:
                self._give_up(
                    f"worker process {child.name} crashed {len(child.crashes)} times within "
                    f"{self.policy.crash_window:g} s (last: {describe_exit(status)} after "
                    f"{ran:.1f} s); giving up"
                )
                return
        child.restarts_in_row += 1
        delay = self.policy.backoff.delay(child.restarts_in_row)
        child.restart_at = now + delay
        what = "crashed" if status != 0 else "exited without being asked to"
        log.warning(
            "worker process %s %s (%s) after %.1f s; restarting it in %.1f s",
            label,
            what,
            describe_exit(status),
            ran,
            delay,
        )

    def _give_up(self, reason: str) -> None:
        log.error("%s", reason)
        self.failure = self.failure or reason
        self._stopping = True
        self._terminate([child for child in self.children if child.process is not None])

    def _terminate(self, children: list[Child]) -> None:
        for child in children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)

    def _exit_status(self) -> int:
        if self.failure is not None:
            return 1
        if self.burst and not self._stopping:
            return 0
        if self._unclean:
            log.warning("worker processes did not stop cleanly: %s", ", ".join(self._unclean))
            return 1
        log.info("all worker processes stopped")
        return 0

    def _abandon(self) -> None:
        """Close the pipe of children still running (the loop ended by an exception): each
        stops as on one SIGTERM (`watch_parent`)."""
        for child in self.children:
            if child.process is not None and child.process.stdin is not None:
                child.process.stdin.close()


def watch_parent(fd: int = 0) -> threading.Thread:
    """In a supervised child: SIGTERM this process once `fd` (stdin, the parent's pipe)
    closes, so a worker whose parent died shuts down as if told to. Reads the raw file
    descriptor: a daemon thread blocked in a buffered reader would abort the interpreter at
    exit."""

    def wait_for_eof() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        log.warning("the supervising process is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=wait_for_eof, name="sqla-queue-parent-watch", daemon=True)
    thread.start()
    return thread


def exit_for_configuration_error(exc: Exception) -> NoReturn:
    """In a supervised child: say what is wrong and exit with `EXIT_CONFIG` (no restart)."""
    print(f"Error: {exc}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG)


PER_PARENT_OPTIONS = frozenset(
    {
        "database_url",
        "processes",
        "supervised_slot",
        "log_format",
        "metrics_port",
        "health_port",
        "health_host",
    }
)
"""`worker` options the parent of `--processes` does not pass on as given."""


def supervise_worker_command(
    ctx: click.Context, processes: int, log_format: str, env: Mapping[str, str]
) -> int:
    """Run `processes` workers as children, each a fresh `python -m sqla_queue worker` with
    the options of the `worker` command in `ctx`; returns the parent's exit status. The URL
    travels in `env` (not on a command line, where `ps` shows passwords); child N serves
    its metrics on --metrics-port + N - 1. With --health-port P the parent serves P (on
    --health-host) and child N answers on 127.0.0.1:P + N (`SupervisorHealth`)."""
    given: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if not isinstance(param, click.Option) or name in PER_PARENT_OPTIONS:
            continue
        if ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT:
            continue  # the child computes the same default
        given.extend(_option_arguments(param, ctx.params[name]))
    base = [sys.executable, "-m", "sqla_queue", "worker", *given, "--log-format", log_format]
    metrics_port = ctx.params["metrics_port"]
    health_port = ctx.params.get("health_port")
    commands = []
    for slot in range(1, processes + 1):
        slot_args = ["--supervised-slot", str(slot)]
        if metrics_port is not None:
            slot_args += ["--metrics-port", str(metrics_port + slot - 1)]
        if health_port is not None:
            slot_args += ["--health-port", str(health_port + slot), "--health-host", LOCALHOST]
        commands.append([*base, *slot_args])
    supervisor = Supervisor(commands, burst=ctx.params["burst"], env=dict(os.environ, **env))
    if health_port is None:
        return supervisor.run()
    health = SupervisorHealth(
        supervisor, {slot: health_port + slot for slot in range(1, processes + 1)}
    )
    server = HealthServer(ctx.params["health_host"], health_port, health.livez, health.readyz)
    server.start()
    try:
        return supervisor.run()
    finally:
        server.stop()


LOCALHOST = "127.0.0.1"
CHILD_HEALTH_TIMEOUT = 4.0
"""Seconds the parent waits for a child's health answer (its database check takes 2 s at
most)."""
CHILD_STARTING_GRACE = 30.0
"""Seconds after its start during which a child that does not answer yet is starting
(live), not failing."""


class SupervisorHealth:
    """The `--processes` parent's `/livez` and `/readyz`: it asks each child's own, on
    127.0.0.1, all at once, and reports them by child name.

    Live while every running child answers 200 to `/livez`; a child being restarted, or
    started less than `CHILD_STARTING_GRACE` seconds ago and not answering yet, counts as
    live: the parent restarts crashed children itself, and gives up (exits) when they crash
    on. Ready only while every child runs and answers 200 to `/readyz`."""

    def __init__(self, supervisor: Supervisor, ports: Mapping[int, int]) -> None:
        self.supervisor = supervisor
        self.ports = dict(ports)

    def livez(self) -> tuple[bool, dict[str, Any]]:
        return self._ask("/livez", lenient=True)

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        return self._ask("/readyz", lenient=False)

    def _ask(self, path: str, lenient: bool) -> tuple[bool, dict[str, Any]]:
        children = list(self.supervisor.children)
        answers: dict[str, tuple[bool, dict[str, Any]]] = {}

        def ask(child: Child) -> None:
            answers[child.name] = self._ask_child(child, path, lenient)

        threads = [threading.Thread(target=ask, args=(child,), daemon=True) for child in children]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + CHILD_HEALTH_TIMEOUT + 1
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        report: dict[str, Any] = {}
        ok = not self.supervisor.failure
        for child in children:
            child_ok, child_report = answers.get(
                child.name, (False, {"status": "no answer in time"})
            )
            ok = ok and child_ok
            report[child.name] = child_report
        return ok, {"status": "ok" if ok else "failing", "processes": report}

    def _ask_child(self, child: Child, path: str, lenient: bool) -> tuple[bool, dict[str, Any]]:
        process = child.process
        if process is None:
            state = "restarting" if child.restart_at is not None else "stopped"
            return lenient and state == "restarting", {"status": state}
        url = f"http://{LOCALHOST}:{self.ports[child.slot]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=CHILD_HEALTH_TIMEOUT) as response:
                return True, _json_object(response.read())
        except urllib.error.HTTPError as exc:
            return False, _json_object(exc.read())
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            if time.monotonic() - child.started_at < CHILD_STARTING_GRACE:
                return lenient, {"status": "starting", "error": str(reason)}
            return False, {"status": "unreachable", "error": str(reason)}


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {"status": "not JSON", "body": data[:200].decode(errors="replace")}
    return value if isinstance(value, dict) else {"status": "not an object", "body": value}


def _option_arguments(option: click.Option, value: Any) -> list[str]:
    """The command-line arguments that give `option` the parsed `value` again."""
    if option.is_flag:
        if option.secondary_opts:
            return [option.opts[0] if value else option.secondary_opts[0]]
        return [option.opts[0]] if value else []
    if value is None:
        return []
    if option.multiple:  # -q a -q b: each value given again
        return [arg for item in value for arg in _option_arguments_of_one(option, item)]
    return _option_arguments_of_one(option, value)


def _option_arguments_of_one(option: click.Option, value: Any) -> list[str]:
    if isinstance(value, float):  # positional notation: DURATION refuses 1e-05
        return [option.opts[0], format(Decimal(repr(value)), "f")]
    return [option.opts[0], str(value)]


def exit_past_stuck_handlers(grace: float = 0.5) -> None:
    """Exit now if handlers abandoned at the shutdown timeout (or after their own timeout)
    still hold pool threads: their jobs are already requeued or recorded, and the interpreter
    would otherwise wait at exit for every one of them to return."""
    deadline = time.monotonic() + grace
    stuck = [t for t in threading.enumerate() if t.name.startswith("sqla-queue-job")]
    for thread in stuck:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = sum(thread.is_alive() for thread in stuck)
    if left:
        log.warning("exiting with %d abandoned handler(s) still running", left)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


__all__ = [
    "CONFIGURATION_ERRORS",
    "EXIT_CONFIG",
    "EXIT_USAGE",
    "RestartPolicy",
    "Supervisor",
    "SupervisorHealth",
    "child_name",
    "describe_exit",
    "exit_for_configuration_error",
    "exit_past_stuck_handlers",
    "supervise_worker_command",
    "watch_parent",
]
