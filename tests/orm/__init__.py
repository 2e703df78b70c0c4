"""The ORM helpers (sqla_queue.orm): jobs about rows, on_change rules."""
