"""The OHTTP gateway's key pairs (spec-v2 §4, RFC 9458 §3): ``ohttp_keys``.

* ``ohttp_keys``: the server-wide HPKE key pair of the gateway (``POST /ohttp``), by its KeyConfig ``key_id``,
  made at the service's first start (:meth:`hybriddp.service.store.Store.gateway_key`); its public KeyConfig is
  served at ``GET /ohttp-keys`` and committed in the head lists published after.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ohttp_keys",
        sa.Column("key_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("private_key", sa.Text, nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ohttp_keys")
