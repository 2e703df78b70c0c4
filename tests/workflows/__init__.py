"""Workflows (sqla_queue.enqueue.workflows): the statements, the canvas, admin, real workers, the
dashboard's views.
"""
