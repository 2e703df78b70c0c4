"""The admin API (sqla_queue.admin): jobs, queues, actions by filter."""
