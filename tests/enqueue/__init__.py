"""The enqueue paths (sqla_queue.enqueue): sessions, Core, COPY, insert hooks, tags and meta,
results.
"""
