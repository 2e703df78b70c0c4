"""Logging set-up: human-readable (rich) or JSON lines, and one log line per finished job.

    sqla-queue worker --app app:registry --log-format json

prints one JSON object per line on stderr. Besides the worker's own records, each finished
job gets a line from the `sqla_queue.jobs` logger with `job_id`, `task`, `queue`, `attempt`,
`outcome` and `duration_seconds` (absent when the handler never ran). In your own process,
`configure_logging("info", "json")` and `log_jobs(registry)` do the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqla_queue.job.context import JobContext
    from sqla_queue.job.outcome import Outcome
    from sqla_queue.registry import Registry

LOG_FORMATS = ("text", "json")
job_log = logging.getLogger("sqla_queue.jobs")
_STARTED = "sqla_queue.contrib.logs.started"
"""The key in `JobContext.state` under which the handler's start time is kept."""


def json_formatter() -> logging.Formatter:
    """A formatter of one JSON object per record: time, level, logger, message, extras."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        timestamp="time",
        rename_fields={"levelname": "level", "name": "logger"},
    )


def text_line_formatter() -> logging.Formatter:
    """The text format off a terminal: one line per record (time, level, logger, message),
    as long as the message, never wrapped; a traceback follows on lines indented by four
    spaces, so a line that starts with a timestamp always starts a record."""
    return LineFormatter(
        "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )


class LineFormatter(logging.Formatter):
    """A record's message on its first line (a message's own line breaks written as
    `\\n`), its traceback and stack under it, each line indented by `INDENT`."""

    INDENT = "    "

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).replace("\r", "\\r").replace("\n", "\\n")

    def formatException(self, ei: Any) -> str:
        return self._indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return self._indented(super().formatStack(stack_info))

    def _indented(self, text: str) -> str:
        return "\n".join(self.INDENT + line for line in text.splitlines())


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """Send the root logger's records at `level` and above to stderr, as `log_format`:
    "json", one object per line; "text", laid out by rich on a terminal, else (systemd,
    Docker, a file) one plain line per record that is never wrapped."""
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(json_formatter())
    elif log_format == "text":
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            from rich.logging import RichHandler

            handler = RichHandler(show_path=False, rich_tracebacks=False, console=console)
            handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
        else:  # systemd, Docker, a file: one record per line, never wrapped, for grep
            handler = logging.StreamHandler()
            handler.setFormatter(text_line_formatter())
    else:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # Alembic says "setup plugin ..." at INFO each time it loads (the worker's schema check):
    # its own chatter, shown only at debug; its "Running upgrade" lines stay
    logging.getLogger("alembic.runtime.plugins").setLevel(
        logging.DEBUG if level.lower() == "debug" else logging.WARNING
    )


def log_jobs(registry: Registry, level: int = logging.INFO) -> None:
    """Log one line per finished job of `registry`'s workers, with its fields as extras."""
    if _time_job in registry.middleware:
        return
    registry.middleware.insert(0, _time_job)

    @registry.on_job_finished
    def log_finished(ctx: JobContext, outcome: Outcome) -> None:
        if not job_log.isEnabledFor(level):
            return
        started = ctx.state.get(_STARTED)
        fields: dict[str, Any] = {
            "job_id": ctx.job_id,
            "task": ctx.task,
            "queue": ctx.queue,
            "attempt": ctx.attempt,
            "outcome": outcome.kind.value.replace(" ", "_"),
        }
        took = ""
        if started is not None:
            fields["duration_seconds"] = round(time.perf_counter() - started, 6)
            took = f" in {fields['duration_seconds']:.3f}s"
        job_log.log(
            level,
            "job %s (%s) attempt %s %s%s",
            ctx.job_id,
            ctx.task,
            ctx.attempt,
            fields["outcome"],
            took,
            extra=fields,
        )


def _time_job(ctx: JobContext, call_next: Callable[[], Any]) -> Any:
    ctx.state[_STARTED] = time.perf_counter()
    return call_next()
