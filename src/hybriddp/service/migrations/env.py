"""Alembic environment: migrate on the connection that :func:`hybriddp.service.store.migrate` passes in.

There is no alembic.ini and no URL here: the store opens the connection (one transaction,
serialized between servers starting at the same time) and hands it over in
``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
