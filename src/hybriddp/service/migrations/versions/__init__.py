"""Migration scripts (one revision per file; Alembic skips this ``__init__``)."""
