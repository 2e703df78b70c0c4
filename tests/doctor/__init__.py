"""`sqla-queue doctor` (sqla_queue.doctor)."""
