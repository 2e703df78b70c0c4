"""Small task registries and helpers for the real-PostgreSQL tests (and CLI worker subprocesses)."""
