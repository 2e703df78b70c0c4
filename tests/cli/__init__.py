"""The command line (sqla_queue.cli)."""
