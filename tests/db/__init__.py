"""The database layer (sqla_queue.db): migrations, Alembic, URLs, the schema, the claim's plan,
MultiXacts.
"""
