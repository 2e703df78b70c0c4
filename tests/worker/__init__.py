"""The table worker (sqla_queue.worker) and what it runs: claims, fairness, limits, leases, health,
periodic, supervisor, faults.
"""
