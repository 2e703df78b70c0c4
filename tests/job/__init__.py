"""The job core (sqla_queue.job): states, options, unique keys, debounce, error history, snooze,
the registry's defaults.
"""
