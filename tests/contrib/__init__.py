"""Logs, metrics and tracing (sqla_queue.contrib)."""
