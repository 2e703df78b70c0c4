"""The web dashboard (sqla_queue.dashboard)."""
