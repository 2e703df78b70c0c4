"""sqla_queue.testing and its pytest plugin."""
