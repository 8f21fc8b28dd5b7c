"""messages_recent: SQLite's small table of recently stored messages, settled into ``messages`` in key order.

Created on every dialect so that there is one schema; PostgreSQL never writes to it. The
downgrade first moves any messages still in it into ``messages`` (no report is lost).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Key = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "messages_recent",
        sa.Column("round_num", Key, nullable=False),
        sa.Column("message_id", sa.String(22), nullable=False),
        sa.Column("entry", sa.Integer),
        sa.Column("value", sa.Double),
        sa.PrimaryKeyConstraint("round_num", "message_id", name="messages_recent_pk"),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.execute("INSERT INTO messages (round_num, message_id, entry, value) SELECT round_num, message_id, entry, "
               "value FROM messages_recent ORDER BY round_num, message_id")
    op.drop_table("messages_recent")
